"""Start-up of one vLLM CPU server, with the model in the engine process against a worker process of its own.

Starts a server the way `coevolve serve` does (`agent.serve.start_server`, 127.0.0.1, float32) on a tiny policy and
reads the CPU time of every process below it (``psutil``, five times a second) until it answers ``/health``; then
stops it. ``engine process`` is the pipeline's CPU server (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by
`agent.serve.server_env`); ``worker process`` sets it to 1, vLLM's default, which `server_env` keeps: the CPU build
then runs the model in a third process. The two alternate, ``--repeats`` times each.

    PYTHONPATH=. BFCL_PROJECT_ROOT=/tmp/bfcl_root .venv/bin/python benchmarks/server_start.py   # needs .venv-vllm
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

import psutil

from agent.serve import ServeOptions, base_url, free_port, start_server, stop_server, wait_until_ready
from benchmarks.rollout import build_policy
from coevolve.config import EnvironmentConfig
from envs.registry import make_environment

MODES = {"engine process": "0", "worker process": "1"}
SAMPLE_INTERVAL_S = 0.2


class TreeCPU:
    """The CPU seconds of a process and everything below it, read until `stop`: the last reading of each process."""

    def __init__(self, pid: int) -> None:
        self.pid, self.seen = pid, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                processes = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for process in processes:
                try:
                    times = process.cpu_times()
                    title = " ".join(process.cmdline())
                except psutil.Error:
                    continue
                self.seen[process.pid] = (title, times.user + times.system)
            time.sleep(SAMPLE_INTERVAL_S)

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


def start_once(model: Path, mode: str, log: Path) -> dict:
    options = ServeOptions(
        model=str(model), dtype="float32", max_model_len=2048, seed=0, cpu=True, port=free_port("127.0.0.1")
    )
    # `server_env` keeps the environment's own value, so the mode is set there for this start only.
    with mock.patch.dict(os.environ, {"VLLM_ENABLE_V1_MULTIPROCESSING": MODES[mode]}):
        started = time.monotonic()
        process = start_server(options, log)
    cpu = TreeCPU(process.pid)
    try:
        wait_until_ready(process, base_url(options), log, timeout_s=600)
        seconds = time.monotonic() - started
    finally:
        by_process = cpu.stop()
        stop_server(process)
    return {
        "mode": mode,
        "seconds_to_health": round(seconds, 1),
        "cpu_seconds": round(sum(by_process.values()), 1),
        "cpu_by_process": by_process,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint folder; default builds the tiny policy")
    parser.add_argument("--sft-steps", type=int, default=5, help="the start does not depend on how well it learned")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    env_config = EnvironmentConfig()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model = Path(args.model)
        else:
            tasks = make_environment(env_config).build_tasks(8, seed=7)
            model = build_policy(Path(tmp) / "policy", tasks, args.sft_steps, env_config)
        starts = []
        for repeat in range(args.repeats):
            for mode in MODES:
                starts.append(start_once(model, mode, Path(tmp) / f"server-{mode.split()[0]}-{repeat}.log"))
                print(json.dumps(starts[-1]), flush=True)
    summary = {
        mode: {
            key: statistics.median(s[key] for s in starts if s["mode"] == mode)
            for key in ("seconds_to_health", "cpu_seconds")
        }
        for mode in MODES
    }
    print(json.dumps({"median": summary, "repeats": args.repeats}))


if __name__ == "__main__":
    main()
