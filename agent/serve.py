"""Starting a vLLM OpenAI-compatible server the way the 'openai' engine expects it (``coevolve serve``).

One function, `server_command`, builds the command line, and `server_env` the environment; the
CLI and the test fixtures both start servers through `start_server`, so the documented way is the
tested way. What the pipeline needs from a server:

- ``--logprobs-mode processed_logprobs``: behaviour logprobs of the sampling distribution;
- prefix caching: a round's prompts share long prefixes;
- the model by its absolute, resolved path, so the served name does not depend on how the path was
  written (the engine resolves names the same way);
- with LoRA training (``training.use_lora``): ``--enable-lora --max-lora-rank R --max-loras K`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, so each round's adapter is loaded at runtime;
- ``VLLM_SERVER_DEV_MODE=1``: the ``/pause``, ``/collective_rpc`` and ``/resume`` endpoints through
  which full fine-tuning runs reload each round's weights without a restart, and
  ``--worker-extension-cls`` (`agent.vllm_worker`), whose ``refresh_tied_output`` makes that reload
  exact for models with tied input/output embeddings;
- on a CPU build: ``--no-enable-chunked-prefill --max-num-batched-tokens N`` (seeded requests crash
  chunked prefill there: "CPU Generator does not use offset"), and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  unless the environment sets it: the model then runs in vLLM's engine process instead of a worker process
  of its own, which would import vLLM and torch a third time;
- bound to 127.0.0.1 unless another host is given;
- ``VLLM_RPC_BASE_PATH``, unless the environment sets it: a folder of the server's own for vLLM's interprocess
  sockets, removed when `stop_server` stops it (vLLM names them by UUID in the temporary folder, and a
  server stopped by a signal would leave them there).

With ``rollout.managed_servers: N`` the pipeline starts its own servers (`start_managed`) on each
rollout or evaluation stage's checkpoint, through the same `start_server`, and the engine stops
them when the stage releases it (`agent.engines.make_engine`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.weights import served_name, vllm_dtype
from coevolve.errors import ConfigError
from coevolve.optional import MissingDependencyError, optional_module

torch = optional_module("torch")

REPO = Path(__file__).resolve().parents[1]
# The separate environment `make setup-vllm` builds with the CPU build of vLLM.
VLLM_VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# The class vLLM's workers are extended with (agent/vllm_worker.py), by its import path.
WORKER_EXTENSION = "agent.vllm_worker.CoevolveWorkerExtension"
# vLLM accepts only these LoRA ranks as --max-lora-rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Each running server's folder for vLLM's interprocess sockets (VLLM_RPC_BASE_PATH), by its process id. vLLM names
# its sockets by fresh UUIDs in the temporary folder, and a server stopped by a signal leaves them there; a folder of
# its own goes with the server in `stop_server`, so nightly runs leave nothing behind.
_RPC_FOLDERS: dict[int, Path] = {}


@dataclass(frozen=True)
class ServeOptions:
    """What a rollout server is started with; `from_config` fills it from the pipeline configuration."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    lora_rank: int | None = None  # None: no LoRA; else the largest adapter rank the server accepts
    max_loras: int = 2
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    cpu: bool = False
    max_num_batched_tokens: int = 4096
    enforce_eager: bool = True

    @classmethod
    def from_config(cls, config, model: str | Path, **overrides) -> ServeOptions:
        rollout, training = config.rollout, config.training
        lora_rank = None
        if training.use_lora:
            # One adapter of lora_rank across the run (agent.weights); the setting may leave room for older stacks.
            lora_rank = rollout.server_max_lora_rank
        values = {
            "model": str(model),
            "dtype": vllm_dtype(model, rollout.vllm_dtype),
            "max_model_len": rollout.vllm_max_model_len,
            "seed": config.seed,
            "lora_rank": lora_rank,
            "max_loras": rollout.server_max_loras,
            "tensor_parallel_size": rollout.vllm_tensor_parallel_size,
            "data_parallel_size": rollout.vllm_data_parallel_size,
            "cpu": not _has_cuda(),
        }
        values.update(overrides)
        return cls(**values)


def _has_cuda() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except MissingDependencyError:
        return False


def server_command(options: ServeOptions, python: str | Path | None = None) -> list[str]:
    """The command line of a vLLM server started the way the pipeline expects it."""
    command = [
        str(python or default_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", served_name(options.model),
        "--host", options.host,
        "--port", str(options.port),
        "--dtype", options.dtype,
        "--seed", str(options.seed),
        "--logprobs-mode", "processed_logprobs",  # behaviour logprobs after temperature
        "--enable-prefix-caching",
        # refresh_tied_output, which the weight reload of a model with tied embeddings calls (agent/weights.py)
        "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    if options.max_model_len is not None:
        command += ["--max-model-len", str(options.max_model_len)]
    if options.enforce_eager:
        command.append("--enforce-eager")
    if options.tensor_parallel_size > 1:
        command += ["--tensor-parallel-size", str(options.tensor_parallel_size)]
    if options.data_parallel_size > 1:
        command += ["--data-parallel-size", str(options.data_parallel_size)]
    if options.lora_rank is not None:
        rank = next((r for r in VLLM_LORA_RANKS if r >= options.lora_rank), None)
        if rank is None:
            raise ValueError(f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; {options.lora_rank} is too large.")
        command += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(options.max_loras)]
    if options.cpu:
        # Whole prefills: the CPU build's sampler cannot resume a seeded request after a partial prefill.
        tokens = max(options.max_num_batched_tokens, options.max_model_len or 0)
        command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(tokens)]
    return command


def server_env(options: ServeOptions, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a server process: offline, loopback, weight reloads and runtime LoRA on."""
    env = dict(os.environ if base is None else base)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DO_NOT_TRACK="true",
        VLLM_NO_USAGE_STATS="1",
        VLLM_HOST_IP="127.0.0.1" if options.host in ("127.0.0.1", "localhost") else env.get("VLLM_HOST_IP", ""),
        TOKENIZERS_PARALLELISM="false",
        VLLM_SERVER_DEV_MODE="1",  # /pause, /collective_rpc (reload_weights), /resume
    )
    if not env["VLLM_HOST_IP"]:
        del env["VLLM_HOST_IP"]
    if options.lora_rank is not None:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if options.cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; raise it for larger models
        # The model runs in the engine process instead of a third one: vLLM's CPU platform starts a separate worker
        # only under multiprocessing, a third process importing vLLM and torch at every start
        # (benchmarks/server_start.py --compare process; figures in benchmarks/HISTORY.md).
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # The model runs eager (--enforce-eager), but vLLM compiles a few sampler helpers with torch.compile, and on
        # the CPU platform that is inductor, a C++ compiler run on the first request (benchmarks/server_start.py
        # --compare compile; figures in benchmarks/HISTORY.md). Eager, they compute the same counts and masks.
        env.setdefault("TORCH_COMPILE_DISABLE", "1")
    return env


def default_python() -> Path:
    """The interpreter that has vLLM: the CPU build's environment when present, else this one."""
    return VLLM_VENV_PYTHON if VLLM_VENV_PYTHON.is_file() else Path(sys.executable)


def base_url(options: ServeOptions) -> str:
    return f"http://{options.host}:{options.port}/v1"


def start_server(options: ServeOptions, log_path: Path, python: str | Path | None = None) -> subprocess.Popen:
    """Start a server in its own process group (so `stop_server` also stops its workers); output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        return _popen_server(options, python, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def _popen_server(options: ServeOptions, python: str | Path | None, **popen: Any) -> subprocess.Popen:
    """The server's process, in a process group of its own, with `server_env` and a folder for its sockets."""
    env = server_env(options)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # In the system's temporary folder, as vLLM's default is: a socket's whole path must fit in about 100 bytes,
    # which a folder under a deep state folder may not. A folder the environment names is left as it is.
    rpc_folder = None if "VLLM_RPC_BASE_PATH" in env else Path(tempfile.mkdtemp(prefix="vllm-rpc-"))
    if rpc_folder is not None:
        env["VLLM_RPC_BASE_PATH"] = str(rpc_folder)
    try:
        process = subprocess.Popen(server_command(options, python), env=env, start_new_session=True, **popen)
    except BaseException:
        if rpc_folder is not None:
            shutil.rmtree(rpc_folder, ignore_errors=True)
        raise
    if rpc_folder is not None:
        _RPC_FOLDERS[process.pid] = rpc_folder
    return process


def wait_until_ready(process: subprocess.Popen, url: str, log_path: Path, timeout_s: float = 300.0) -> None:
    """Wait until the server answers ``/health``; fail with the log's tail if it exits or takes too long."""
    root = url.rstrip("/").removesuffix("/v1")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"The vLLM server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{root}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"The vLLM server was not ready after {timeout_s:.0f} s:\n{log_path.read_text()[-4000:]}")


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: where no init reaps orphans (a
    container without one), an exited engine process stays a zombie that signals cannot remove."""
    proc = Path("/proc")
    if proc.is_dir():
        for stat in proc.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_server(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Stop a server started by `start_server` and the workers it spawned (its process group).

    SIGTERM to the whole group, then SIGKILL to whatever of it is left after ``timeout_s``: vLLM's
    engine and worker processes share the group and would otherwise outlive their API server. The folder
    of its interprocess sockets goes too.
    """
    pgid = process.pid  # the group leader's pid (start_new_session)
    if process.poll() is None:
        os.killpg(pgid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    if process.poll() is None:
        process.wait(timeout=timeout_s)
    rpc_folder = _RPC_FOLDERS.pop(pgid, None)
    if rpc_folder is not None:
        shutil.rmtree(rpc_folder, ignore_errors=True)


class _Stop(Exception):
    """Raised in the supervisor by a signal that asks `coevolve serve` to stop."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


def _die_with_parent() -> None:
    """In the server's child process: get SIGTERM when `coevolve serve` dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve_foreground(options: ServeOptions, python: str | Path | None = None) -> int:
    """Run one server in the foreground (``coevolve serve``) until it exits or this process is stopped.

    vLLM runs in its own process group with its engine and worker processes. SIGTERM, SIGINT (Ctrl-C)
    or SIGHUP to this process stop that whole group (`stop_server`), so nothing it started outlives it;
    if this process is killed outright, the server gets SIGTERM from the kernel (PR_SET_PDEATHSIG).
    Returns the server's exit status, or 128 + the signal that stopped it.
    """
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in handled}
    process = None
    try:
        process = _popen_server(options, python, preexec_fn=_die_with_parent)
        status = process.wait()
        stop_server(process)  # its group may outlive it, and its socket folder does
        return status
    except _Stop as stop:
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the shutdown
        if process is not None:
            stop_server(process)
        return 128 + int(stop.args[0])
    finally:
        if process is not None and process.poll() is None:
            stop_server(process)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- servers the pipeline starts itself (rollout.managed_servers) ------------------------------------

# Seconds a managed server may take to answer /health: the CPU build starts in 26-58 s on two busy cores.
MANAGED_START_TIMEOUT_S = 600.0


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def managed_ports(first: int, count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` ports from ``first`` on; one already taken is replaced by a free one the system picks."""
    ports: list[int] = []
    for port in range(first, first + count):
        if port > 65535 or not port_is_free(host, port):
            port = free_port(host)
        while port in ports:
            port = free_port(host)
        ports.append(port)
    return ports


@dataclass
class ManagedServers:
    """Servers the pipeline started on one checkpoint (``rollout.managed_servers``); `stop` ends them all."""

    processes: list[subprocess.Popen]
    urls: list[str]
    log_paths: list[Path]

    def stop(self) -> None:
        """Stop every server by its process group (its vLLM workers too); safe to call twice."""
        for process in self.processes:
            stop_server(process)


def start_managed(config, checkpoint: str | Path, python: str | Path | None = None) -> ManagedServers:
    """Start ``rollout.managed_servers`` servers on ``checkpoint`` (127.0.0.1) and wait until all answer.

    All servers start at once, so a fleet costs one start-up, not one per server. Logs go to
    ``<run>/servers/<time>-<checkpoint>-<port>.log``. If any server fails to start, every one is
    stopped and the error quotes the failing server's log. The interpreter is ``python``, else
    ``rollout.server_python``, else `default_python`.
    """
    count, log_dir = config.rollout.managed_servers, config.run_dir() / "servers"
    python = python or config.rollout.server_python
    if python is not None and not Path(python).is_file():
        raise ConfigError(
            f"rollout.server_python is {python}, which does not exist; name the python of an environment with vLLM "
            "(`make setup-gpu` builds .venv-gpu-vllm, `make setup-vllm` the CPU build in .venv-vllm), or leave it "
            "unset for .venv-vllm."
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    processes: list[subprocess.Popen] = []
    urls: list[str] = []
    logs: list[Path] = []
    try:
        for port in managed_ports(config.rollout.managed_port, count):
            options = ServeOptions.from_config(config, checkpoint, host="127.0.0.1", port=port)
            log_path = log_dir / f"{stamp}-{Path(checkpoint).name}-{port}.log"
            processes.append(start_server(options, log_path, python))
            urls.append(base_url(options))
            logs.append(log_path)
        for process, url, log_path in zip(processes, urls, logs, strict=True):
            wait_until_ready(process, url, log_path, MANAGED_START_TIMEOUT_S)
    except BaseException:
        for process in processes:
            stop_server(process)
        raise
    return ManagedServers(processes, urls, logs)
