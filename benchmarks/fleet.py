"""Rollout tokens/s through one vLLM server and through a fleet of two, in one run.

Starts two servers the way `coevolve serve` does (`agent.serve`) on 127.0.0.1, both on the same
checkpoint, then plays the same seeded round (`tasks.rollout.play_episodes`, temperature 0.9)
through the first server alone and through both (`rollout.base_urls`). Seeds travel with the
requests, so both runs produce the same tokens and only the wall time differs.

    .venv/bin/python benchmarks/fleet.py                  # builds a tiny policy (--sft-steps) first
    .venv/bin/python benchmarks/fleet.py --model DIR --tasks 24 --samples 6

Server i is pinned to core i (``VLLM_CPU_OMP_THREADS_BIND``) unless ``--no-bind-cores``: one server
on one core against two servers on two cores.

Prints one JSON line; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from agent.engines import context_length, make_engine
from agent.serve import ServeOptions, base_url, start_server, stop_server, wait_until_ready
from benchmarks.rollout import build_policy
from coevolve.config import EnvironmentConfig, PipelineConfig
from envs.registry import make_environment
from tasks.rollout import play_episodes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2, help="each rate is the best of this many runs")
    parser.add_argument("--model", help="a checkpoint folder; default builds the tiny policy")
    parser.add_argument(
        "--no-bind-cores", dest="bind_cores", action="store_false", help="let vLLM pick each server's cores"
    )
    args = parser.parse_args()

    env_config = EnvironmentConfig()
    build_tasks = make_environment(env_config).build_tasks
    tasks = build_tasks(args.tasks, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        model = (
            Path(args.model)
            if args.model
            else build_policy(Path(tmp) / "tiny", build_tasks(200, seed=8), args.sft_steps, env_config)
        )
        options = [ServeOptions(model=str(model), dtype="float32", port=free_port(), cpu=True) for _ in range(2)]
        processes = []
        for i, o in enumerate(options):
            if args.bind_cores:
                # One core per server: vLLM's CPU build otherwise pins both servers' threads to the same cores.
                os.environ.update(VLLM_CPU_OMP_THREADS_BIND=str(i), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
            processes.append(start_server(o, Path(tmp) / f"server-{i}.log"))
        try:
            started = time.perf_counter()
            for process, o, i in zip(processes, options, range(2), strict=True):
                wait_until_ready(process, base_url(o), Path(tmp) / f"server-{i}.log")
            start_s = time.perf_counter() - started
            results = {}
            for label, urls in (
                ("one_server", [base_url(options[0])]),
                ("two_servers", [base_url(o) for o in options]),
            ):
                config = PipelineConfig(state_dir=Path(tmp) / "state", rollout={"engine": "openai", "base_urls": urls})
                best = float("inf")
                with make_engine(model, config) as engine:
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        trajectories = play_episodes(
                            engine, tasks, samples=args.samples, temperature=0.9, max_new_tokens=args.max_new_tokens,
                            env_config=env_config, run_id="bench", round_=0, max_context_tokens=context_length(engine),
                            progress=False, seed=0, batch_size=args.tasks * args.samples,
                        )  # fmt: skip
                        best = min(best, time.perf_counter() - t0)
                tokens = sum(sum(t.completion_mask) for t in trajectories)
                results[label] = {
                    "model_tokens": tokens,
                    "rollout_s": round(best, 2),
                    "tokens_per_s": round(tokens / best, 1),
                }
        finally:
            for process in processes:
                stop_server(process)
    print(json.dumps({
        "episodes": args.tasks * args.samples, "servers_ready_s": round(start_s, 1), **results,
        "speedup": round(results["two_servers"]["tokens_per_s"] / results["one_server"]["tokens_per_s"], 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
