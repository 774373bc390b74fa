"""Warehouse at scale: ingest rate of `Warehouse.write_trajectories` and the latency of every view.

Writes synthetic rounds through the real write path (one call per batch, like the rollout stage),
then times each documented view (a full ``SELECT *`` plus a filtered query) on a read-only
connection, as an analyst would. Trajectories have 8 steps, 32 prompt and 64 completion tokens,
and a pool, signals (5% of trajectories) and candidates per round, so every view has rows.

    .venv/bin/python benchmarks/warehouse.py --steps 1000000 --steps 3000000
    (HF_HUB_OFFLINE etc. not needed; BFCL is not imported)

Prints one JSON line per size; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from coevolve.records import Candidate, Provenance, Signal, Step, Task, ToolCall, Trajectory, Verdict

TOOLS = ["mkdir", "cd", "ls", "touch", "cat", "grep", "mv", "cp", "rm", "echo", "wc", "sort"]
STEPS_PER_TRAJECTORY = 8
GROUP = 8  # samples per task
VIEWS = {
    "v_success_by_round": "round = 3",
    "v_success_by_task": "success_rate > 0.5",
    "v_tool_failure_rates": "tool_name = 'mkdir'",
    "v_signal_mix": "kind = 'boundary'",
    "v_pool_growth": "round = 3",
    "v_forgetting_events": "round = 3",
    "v_acceptance_rates": "round = 3",
}


def make_task(index: int, round_: int) -> Task:
    calls = [ToolCall(TOOLS[(index + k) % len(TOOLS)], {"name": f"f{index}_{k}"}) for k in range(3)]
    return Task(
        environment="bfcl",
        initial_config={"GorillaFileSystem": {"root": {"w": {"type": "directory", "contents": {}}}}},
        involved_classes=["GorillaFileSystem"],
        turns=[f"task {index}"],
        reference=[calls],
        provenance=Provenance(origin="seed" if round_ == 0 else "boundary", round=round_),
    )


def make_trajectory(rng: random.Random, run_id: str, round_: int, task: Task, sample: int) -> Trajectory:
    steps = []
    for k in range(STEPS_PER_TRAJECTORY):
        call = ToolCall(rng.choice(TOOLS), {"name": f"x{k}"})
        failed = rng.random() < 0.2
        steps.append(Step(turn=k // 4, index=k, model_text=call.render(), calls=[call], observations=["error: no" if failed else "ok"], error="failed" if failed else None, completion_tokens=8))
    success = rng.random() < 0.4
    return Trajectory(
        run_id=run_id, round=round_, task_id=task.task_id, sample=sample, steps=steps,
        prompt_ids=list(range(32)), completion_ids=list(range(64)), completion_mask=[1] * 64, logprobs=[-0.5] * 64,
        reward=float(success), success=success, finish_reason="done" if success else "max_steps", duration_s=0.5,
    )  # fmt: skip


def ingest(warehouse, total_steps: int, rounds: int, batch_trajectories: int) -> dict:
    """Write ``total_steps`` steps spread over ``rounds`` rounds; returns ingest timings."""
    rng = random.Random(0)
    run_id = "bench"
    warehouse.ensure_run(run_id, {})
    trajectories_total = total_steps // STEPS_PER_TRAJECTORY
    per_round = trajectories_total // rounds
    tasks_per_round = max(1, per_round // GROUP)
    write_s = build_s = 0.0
    written = 0
    for round_ in range(rounds):
        # Half of each round's tasks were played the round before, so forgetting events occur.
        first = round_ * min(tasks_per_round, 2000) // 2
        tasks = [make_task(first + i, round_) for i in range(min(tasks_per_round, 2000))]
        warehouse.write_tasks(tasks)
        warehouse.set_pool(run_id, round_, [t.task_id for t in tasks])
        pending: list[Trajectory] = []
        for i in range(per_round):
            # Task ids cycle so that (task, sample) stays unique within the round.
            task = tasks[(i // GROUP) % len(tasks)]
            started = time.perf_counter()
            pending.append(make_trajectory(rng, run_id, round_, task, sample=i))
            build_s += time.perf_counter() - started
            if len(pending) == batch_trajectories or i == per_round - 1:
                started = time.perf_counter()
                warehouse.write_trajectories(pending)
                write_s += time.perf_counter() - started
                written += len(pending) * STEPS_PER_TRAJECTORY
                pending = []
        signals = [
            Signal(run_id, round_, rng.choice(["boundary", "rare", "forgetting"]), f"{run_id}/r{round_}/{tasks[i % len(tasks)].task_id}/s{i}", tasks[i % len(tasks)].task_id, {"score": 0.0})
            for i in range(0, per_round, 20)
        ]
        warehouse.write_signals(signals)
        warehouse.write_candidates(run_id, round_, [Candidate(make_task(10_000_000 + round_ * 1000 + i, round_ + 1), signals[i].signal_id, Verdict(i % 2 == 0, "ok")) for i in range(min(200, len(signals)))])
    return {"steps": written, "write_s": round(write_s, 1), "steps_per_s": round(written / write_s), "synthesis_s": round(build_s, 1)}


def time_views(path: Path, repeats: int) -> dict[str, dict[str, float]]:
    import duckdb

    latencies: dict[str, dict[str, float]] = {}
    con = duckdb.connect(str(path), read_only=True)
    try:
        for view, where in VIEWS.items():
            row: dict[str, float] = {}
            for label, query in (("all", f"SELECT * FROM {view}"), ("filtered", f"SELECT * FROM {view} WHERE {where}")):
                best = float("inf")
                for _ in range(repeats):
                    started = time.perf_counter()
                    con.sql(query).fetchall()
                    best = min(best, time.perf_counter() - started)
                row[label + "_s"] = round(best, 3)
            row["rows"] = len(con.sql(f"SELECT * FROM {view}").fetchall())
            latencies[view] = row
    finally:
        con.close()
    return latencies


def main() -> None:
    from storage.warehouse import Warehouse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, action="append", help="total steps; repeat for several sizes (default 1M)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2000, help="trajectories per write (the rollout stage writes a round at once)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for total in args.steps or [1_000_000]:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "warehouse.duckdb"
            warehouse = Warehouse(path)
            result = ingest(warehouse, total, args.rounds, args.batch)
            warehouse.close()
            result["file_mb"] = round(path.stat().st_size / 2**20)
            result["views"] = time_views(path, args.repeats)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
