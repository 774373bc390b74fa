"""The in-process vLLM engine takes a new round's checkpoint without rebuilding itself, and releases itself.

vLLM lives in its own environment (.venv-vllm), so the engine runs in a child process of that
environment and reports as JSON: checkpoint 1 is checkpoint 0 with perturbed layer weights, as an
update would leave it; a third checkpoint also changes the tied embeddings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.transformers_engine import TransformersEngine, load_policy
from tests.conftest import run_vllm_probe

pytestmark = pytest.mark.slow

PROBE = """
import json, sys
from agent.vllm_engine import VLLMEngine

if __name__ == "__main__":  # vLLM spawns workers: the guard keeps them from re-running this
    job = json.load(open(sys.argv[1]))
    with VLLMEngine(job["round0"], dtype="float32", max_model_len=2048, seed=0) as engine:
        llm = engine.llm
        result = {"before": [g.__dict__ for g in engine.generate(job["prompts"], temperature=0.0, max_new_tokens=12)]}
        engine.reload(job["round1"])
        result["same_engine"] = engine.llm is llm
        result["after"] = [g.__dict__ for g in engine.generate(job["prompts"], temperature=0.0, max_new_tokens=12)]
        engine.reload(job["embeddings_changed"])
        result["rebuilt"] = engine.llm is not llm
        rebuilt = engine.generate(job["prompts"], temperature=0.0, max_new_tokens=12)
        result["after_rebuild"] = [g.__dict__ for g in rebuilt]
    result["released"] = engine.llm is None
    json.dump(result, open(sys.argv[2], "w"))
"""


def _perturbed(source: Path, out: Path, embeddings: bool) -> Path:
    """``source`` with its layers' weights perturbed (seeded), and its tied embeddings too if asked."""
    model, tokenizer = load_policy(source)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if embeddings or "embed" not in name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def round1_dir(served_policy_dir, tmp_path_factory) -> Path:
    """Checkpoint 0 with new layer weights and the same embeddings (as a LoRA round leaves them)."""
    return _perturbed(served_policy_dir, tmp_path_factory.mktemp("reload") / "round-001", embeddings=False)


@pytest.fixture(scope="module")
def embeddings_changed_dir(served_policy_dir, tmp_path_factory) -> Path:
    """Checkpoint 0 with every weight perturbed, its tied input/output embeddings included."""
    return _perturbed(served_policy_dir, tmp_path_factory.mktemp("reload") / "round-002", embeddings=True)


@pytest.fixture(scope="module")
def prompts(served_policy_dir, served_conversations):
    engine = TransformersEngine(served_policy_dir, torch_threads=1, seed=0)
    return [engine.chat.prompt_ids(conv[:2]) for conv in served_conversations]


@pytest.fixture(scope="module")
def probe(vllm_python, vllm_environ, served_policy_dir, round1_dir, embeddings_changed_dir, prompts, tmp_path_factory):
    job = {
        "round0": str(served_policy_dir),
        "round1": str(round1_dir),
        "embeddings_changed": str(embeddings_changed_dir),
        "prompts": prompts,
    }
    return run_vllm_probe(vllm_python, vllm_environ, PROBE, job, tmp_path_factory.mktemp("vllm-reload"))


def test_a_new_checkpoint_is_loaded_into_the_running_engine(probe):
    assert probe["same_engine"]


def test_after_the_reload_it_generates_with_the_new_weights(probe, round1_dir, prompts):
    reference = TransformersEngine(round1_dir, torch_threads=1, seed=0).generate(
        prompts, temperature=0.0, max_new_tokens=12
    )
    assert [g["token_ids"] for g in probe["after"]] == [g.token_ids for g in reference]
    for got, want in zip(probe["after"], reference, strict=True):
        assert got["logprobs"] == pytest.approx(want.logprobs, abs=1e-3)
    assert [g["logprobs"] for g in probe["after"]] != [g["logprobs"] for g in probe["before"]]


def test_a_checkpoint_with_changed_tied_embeddings_gets_a_new_engine_with_its_weights(
    probe, embeddings_changed_dir, prompts
):
    # vLLM 0.32 reloads tied embeddings without the output layer, so this checkpoint is not loaded in place.
    assert probe["rebuilt"]
    reference = TransformersEngine(embeddings_changed_dir, torch_threads=1, seed=0).generate(
        prompts, temperature=0.0, max_new_tokens=12
    )
    assert [g["token_ids"] for g in probe["after_rebuild"]] == [g.token_ids for g in reference]


def test_leaving_the_engine_releases_vllm(probe):
    assert probe["released"]
