"""Start-up of one vLLM CPU server and its first request, under two settings of `agent.serve.server_env` at a time.

Starts a server the way `coevolve serve` does (`agent.serve.start_server`, 127.0.0.1, float32) on a tiny policy, reads
the CPU time of every process below it (``psutil``, five times a second) until it answers ``/health`` and then one
completion with logprobs (what a rollout asks for), and stops it. ``--compare`` names the setting:

- ``process``: ``engine process`` is the pipeline's CPU server (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by
  `agent.serve.server_env`); ``worker process`` sets it to 1, vLLM's default, which `server_env` keeps: the CPU build
  then runs the model in a third process.
- ``compile``: ``eager sampler`` is the pipeline's CPU server (``TORCH_COMPILE_DISABLE=1``, set by `server_env`);
  ``compiled sampler`` sets it to 0, so vLLM builds its torch.compile'd sampler helpers with inductor.
  ``--fresh-inductor-cache`` gives every start an empty inductor cache, as on a machine that never compiled them.

The two settings alternate, ``--repeats`` times each.

    PYTHONPATH=. BFCL_PROJECT_ROOT=/tmp/bfcl_root .venv/bin/python benchmarks/server_start.py   # needs .venv-vllm
    PYTHONPATH=. BFCL_PROJECT_ROOT=/tmp/bfcl_root .venv/bin/python benchmarks/server_start.py --compare compile
    PYTHONPATH=. BFCL_PROJECT_ROOT=/tmp/bfcl_root .venv/bin/python benchmarks/server_start.py --model DIR --repeats 3

Prints one JSON line per start and one summary line (medians); the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import httpx
import psutil

from agent.serve import ServeOptions, base_url, free_port, start_server, stop_server, wait_until_ready
from agent.weights import served_name
from benchmarks.rollout import build_policy
from coevolve.config import EnvironmentConfig
from envs.registry import make_environment

# The settings each comparison starts servers under, the pipeline's first.
COMPARISONS = {
    "process": {
        "engine process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "worker process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    },
    "compile": {
        "eager sampler": {"TORCH_COMPILE_DISABLE": "1"},
        "compiled sampler": {"TORCH_COMPILE_DISABLE": "0"},
    },
}
# The first request: a rollout's shape (several samples of one prompt, with the sampled tokens' logprobs).
FIRST_REQUEST = {"prompt": "make a folder temp", "n": 4, "max_tokens": 16, "logprobs": 1, "temperature": 1.0, "seed": 1}
SAMPLE_INTERVAL_S = 0.2


class TreeCPU:
    """The CPU seconds of a process and everything below it, read until `stop`: the last reading of each process
    alive then, its own time and that of the children it reaped (vLLM's short probes and compiler runs), so a process
    that ended is counted once, in the one that reaped it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:  # one more reading once `stop` is asked for, so the last moments count too
            stopping = self._stop.is_set()
            try:
                root = psutil.Process(self.pid)
                processes = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            alive = {}
            for process in processes:
                try:
                    times = process.cpu_times()
                    title = " ".join(process.cmdline())
                except psutil.Error:
                    continue
                alive[process.pid] = (title, times.user + times.system + times.children_user + times.children_system)
            self.seen = alive
            if stopping:
                return
            self._stop.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        by_kind: dict[str, float] = {}
        for title, seconds in self.seen.values():
            if "api_server" in title:
                kind = "api server"
            elif title.startswith("VLLM::"):
                kind = title.split(" ")[0].removeprefix("VLLM::")  # EngineCore, Worker
            else:
                kind = "other"  # multiprocessing's resource tracker
            by_kind[kind] = round(by_kind.get(kind, 0.0) + seconds, 1)
        return by_kind


def start_once(model: Path, mode: str, settings: dict[str, str], log: Path) -> dict:
    options = ServeOptions(
        model=str(model), dtype="float32", max_model_len=2048, seed=0, cpu=True, port=free_port("127.0.0.1")
    )
    # `server_env` keeps the environment's own values, so the setting is made there for this start only.
    with mock.patch.dict(os.environ, settings):
        started = time.monotonic()
        process = start_server(options, log)
    cpu = TreeCPU(process.pid)
    try:
        wait_until_ready(process, base_url(options), log, timeout_s=600)
        ready = time.monotonic()
        response = httpx.post(
            f"{base_url(options)}/completions",
            json={"model": served_name(options.model), **FIRST_REQUEST},
            timeout=600,
        )
        response.raise_for_status()
        answered = time.monotonic()
    finally:
        by_process = cpu.stop()
        stop_server(process)
    return {
        "mode": mode,
        "seconds_to_health": round(ready - started, 1),
        "first_request_seconds": round(answered - ready, 2),
        "cpu_seconds": round(sum(by_process.values()), 1),
        "cpu_by_process": by_process,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint folder; default builds the tiny policy")
    parser.add_argument("--sft-steps", type=int, default=5, help="the start does not depend on how well it learned")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="process")
    parser.add_argument(
        "--fresh-inductor-cache", action="store_true", help="an empty TORCHINDUCTOR_CACHE_DIR for every start"
    )
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    modes = COMPARISONS[args.compare]
    env_config = EnvironmentConfig()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model = Path(args.model)
        else:
            tasks = make_environment(env_config).build_tasks(8, seed=7)
            model = build_policy(Path(tmp) / "policy", tasks, args.sft_steps, env_config)
        starts = []
        for repeat in range(args.repeats):
            for mode, settings in modes.items():
                name = f"{mode.replace(' ', '-')}-{repeat}"
                if args.fresh_inductor_cache:
                    settings = {**settings, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / f"inductor-{name}")}
                starts.append(start_once(model, mode, settings, Path(tmp) / f"server-{name}.log"))
                print(json.dumps(starts[-1]), flush=True)
    keys = ("seconds_to_health", "first_request_seconds", "cpu_seconds")
    summary = {
        mode: {key: statistics.median(s[key] for s in starts if s["mode"] == mode) for key in keys} for mode in modes
    }
    print(json.dumps({"median": summary, "repeats": args.repeats, "fresh_inductor_cache": args.fresh_inductor_cache}))


if __name__ == "__main__":
    main()
