"""The in-process vLLM engine: same contract and same greedy tokens as the transformers engine.

vLLM lives in its own environment (.venv-vllm), so the engine runs in a child process of that
environment on the served tiny policy and reports its generations as JSON.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.transformers_engine import TransformersEngine
from tests.conftest import run_vllm_probe

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
from agent.vllm_engine import VLLMEngine

if __name__ == "__main__":  # vLLM spawns workers: the guard keeps them from re-running this
    job = json.load(open(sys.argv[1]))
    engine = VLLMEngine(job["model"], dtype="float32", max_model_len=2048, seed=0)
    result = {"max_context": engine.max_context_tokens, "eos": engine.chat.eos_token_id}
    for name, temperature, tokens in (("greedy", 0.0, 30), ("cut", 0.0, 2), ("sampled", 0.7, 10)):
        generations = engine.generate(job["prompts"], temperature=temperature, max_new_tokens=tokens)
        result[name] = [g.__dict__ for g in generations]
    result["empty"] = engine.generate([], temperature=0.0, max_new_tokens=4)
    seeds = list(range(101, 101 + len(job["prompts"])))

    def seeded(prompts, seeds):
        generations = engine.generate(prompts, temperature=2.0, max_new_tokens=16, seeds=seeds)
        return [g.token_ids for g in generations]

    result["seeded"] = seeded(job["prompts"], seeds)
    result["seeded_alone"] = seeded(job["prompts"][1:2], seeds[1:2])
    result["seeded_reversed"] = seeded(job["prompts"][::-1], seeds[::-1])
    result["seeded_one_prompt"] = seeded(job["prompts"][:1] * 6, list(range(6)))
    # Four distinct 1,500-token prompts: more than one scheduler step prefills at once.
    long_prompts = [[10 + (7 * i + 13 * k) % 250 for i in range(1500)] for k in range(4)]
    result["seeded_long"] = seeded(long_prompts, list(range(4)))
    engine.shutdown()
    json.dump(result, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def local(served_policy_dir):
    return TransformersEngine(served_policy_dir, torch_threads=1, seed=0)


@pytest.fixture(scope="module")
def prompts(local, served_conversations):
    return [local.chat.prompt_ids(conv[:2]) for conv in served_conversations]


@pytest.fixture(scope="module")
def probe(vllm_python, vllm_environ, served_policy_dir, prompts, tmp_path_factory):
    job = {"model": str(served_policy_dir), "prompts": prompts}
    return run_vllm_probe(vllm_python, vllm_environ, PROBE, job, tmp_path_factory.mktemp("vllm-probe"))


def test_greedy_tokens_and_logprobs_match_the_transformers_engine(probe, local, prompts):
    reference = local.generate(prompts, temperature=0.0, max_new_tokens=30)
    assert [g["token_ids"] for g in probe["greedy"]] == [g.token_ids for g in reference]
    for got, want in zip(probe["greedy"], reference, strict=True):
        assert got["finish_reason"] == want.finish_reason == "stop"
        assert got["logprobs"] == pytest.approx(want.logprobs, abs=1e-3)


def test_stops_with_eos_included_or_reports_length(probe):
    assert all(g["token_ids"][-1] == probe["eos"] for g in probe["greedy"])
    assert all(g["finish_reason"] == "length" and len(g["token_ids"]) == 2 for g in probe["cut"])


def test_sampled_logprobs_are_those_of_the_tempered_distribution(probe, local, prompts):
    for prompt, generation in zip(prompts, probe["sampled"], strict=True):
        assert len(generation["logprobs"]) == len(generation["token_ids"]) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in generation["logprobs"])
        ids = torch.tensor([prompt + generation["token_ids"]])
        with torch.inference_mode():
            logits = local.model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation["token_ids"])[:, None]).squeeze(-1)
        assert torch.allclose(expected, torch.tensor(generation["logprobs"]), atol=1e-3)


def test_a_seeded_request_samples_the_same_tokens_whatever_its_batch(probe):
    assert probe["seeded_alone"][0] == probe["seeded"][1]
    assert probe["seeded_reversed"] == probe["seeded"][::-1]


def test_seeded_long_prompts_that_fill_several_prefill_steps_are_answered(probe):
    assert [len(tokens) > 0 for tokens in probe["seeded_long"]] == [True] * 4


def test_different_seeds_draw_different_samples_of_one_prompt(probe):
    assert len({tuple(tokens) for tokens in probe["seeded_one_prompt"]}) > 1


def test_reports_its_context_length_and_answers_an_empty_batch(probe):
    assert probe["max_context"] == 2048
    assert probe["empty"] == []


def test_the_engine_module_imports_without_vllm():
    # The main environment has no vllm: choosing another engine must not need it.
    done = subprocess.run(
        [sys.executable, "-c", "import agent.vllm_engine, sys; assert 'vllm' not in sys.modules"], cwd=REPO
    )
    assert done.returncode == 0
