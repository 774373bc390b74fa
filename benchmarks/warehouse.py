"""Warehouse at scale: ingest against pyarrow alone, the latency of every view, and mining from the files.

For each size (``--steps``) and write batch (``--batch``, trajectories per write), in one run:

- ingest: synthetic rollout records (`coevolve.records.Trajectory` with `Step`s and `ToolCall`s: 2-6
  steps per trajectory, about 4 on average; 1-3 calls per step with 1-3 arguments, mostly strings, some
  numbers, booleans and lists; observations of about 80 characters, a fifth of them errors; model
  text of about 120 characters; a trajectory's tool names follow one plan of a Zipf-like vocabulary
  of 5,000, so a long tail of tool sequences is rare; 128 prompt token ids and 60 completion ids per
  step with their mask and logprobs) are generated one batch at a time, so memory stays bounded at
  any size. Each batch goes to durable storage through `Warehouse.write_trajectories` (Arrow
  conversion, zstd Parquet, fsync, rename), and the same batch, as plain dict rows of the same nested
  shape (built outside the timing), through pyarrow alone: ``pa.Table.from_pylist`` then ``pq.write_table`` of steps and
  trajectories, with the warehouse's compression, into a second folder (no fsync). Both are timed
  per batch, interleaved, so load on the machine falls on both alike; steps/s and their ratio are
  reported. Generating the records is timed apart.
- views: every analysis view over a read-only `Warehouse.connect` session, ``SELECT *`` and a
  filtered query, best of ``--repeats``; plus the number of files per table.
- mining: the mine stage's `tasks.mine.mine_warehouse` (a lazy scan of the run's files, mined as it
  is read, Signal records included) on the last round over the whole history, against reading the
  history first as one sorted frame (`Warehouse.trajectory_frame`) and mining that (`mine_signals`);
  interleaved, checked equal, best of ``--repeats`` each. ``--mining-only FOLDER`` times only this,
  on the warehouse a run with ``--keep`` left in FOLDER.

Each round also gets a pool, signals on 5% of its trajectories and 200 judged candidates, so every
view has rows. 8 samples per task per round; half of each round's tasks were played the round before.

Run (from the repository root):

    .venv/bin/python benchmarks/warehouse.py --steps 1000000 --steps 10000000 --batch 2048
    .venv/bin/python benchmarks/warehouse.py --steps 200000 --batch 32     # the rollout stage's default flush
    .venv/bin/python benchmarks/warehouse.py --steps 10000000 --workdir /tmp --keep   # keeps the warehouse ...
    .venv/bin/python benchmarks/warehouse.py --mining-only /tmp/tmpXXXX             # ... to time mining on it again

Prints one JSON object per (size, batch); the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from coevolve.config import SignalConfig
from coevolve.records import Candidate, Provenance, Signal, Step, Task, ToolCall, Trajectory, Verdict
from storage.columns import SCHEMAS
from storage.tables import _WRITE_OPTIONS
from storage.warehouse import Warehouse
from tasks.mine import mine_frames, mine_signals, mine_warehouse

RUN = "bench"
GROUP = 8  # samples per task per round
PROMPT_TOKENS = 128
TOKENS_PER_STEP = 60
TOOLS = [
    "mkdir", "cd", "ls", "touch", "cat", "grep", "mv", "cp", "rm", "echo", "wc", "sort", "find", "tail", "diff",
    "du", "pwd", "get_ticket", "post_tweet", "send_message",
]  # fmt: skip
ARG_NAMES = ["dir_name", "file_name", "content", "pattern", "count", "recursive", "source", "destination"]
VIEWS = {
    "v_success_by_round": "round = 3",
    "v_success_by_task": "success_rate > 0.5",
    "v_tool_failure_rates": "tool_name = 'mkdir'",
    "v_signal_mix": "kind = 'boundary'",
    "v_pool_growth": "round = 3",
    "v_forgetting_events": "round = 3",
    "v_acceptance_rates": "round = 3",
}


class Records:
    """Synthetic rollout records: pre-drawn texts and a Zipf-like vocabulary of call patterns."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = rng = random.Random(seed)
        words = ["file", "folder", "report", "draft", "notes", "data", "log", "final", "temp", "backup", "src", "docs"]

        def text(n: int) -> str:
            out = ""
            while len(out) < n:
                out += rng.choice(words) + rng.choice([" ", "_", "/", ".txt ", ", "])
            return out[:n]

        self.observations = [
            (f"Error: {text(rng.randint(60, 90))}" if i % 5 == 0 else f'{{"result": "{text(rng.randint(60, 90))}"}}')
            for i in range(500)
        ]
        self.texts = [text(rng.randint(90, 150)) for _ in range(500)]
        self.values: list[object] = [text(rng.randint(4, 24)) for _ in range(300)] + [3, 17, True, False, ["a", "b"]]
        # A trajectory's calls (2-6 steps of 1-3 calls) follow one plan of a Zipf-like vocabulary, so
        # most trajectories share a few common tool sequences and a long tail is rare, as in real rollouts.
        self.plans = [
            [[rng.choice(TOOLS) for _ in range(rng.randint(1, 3))] for _ in range((4, 3, 5, 2, 6)[k % 5])]
            for k in range(5000)
        ]
        self.weights = [1.0 / (k + 1) ** 1.1 for k in range(len(self.plans))]
        self.tokens = list(range(1000, 1000 + PROMPT_TOKENS + 6 * TOKENS_PER_STEP))

    def trajectory(self, round_: int, task_id: str, sample: int, skill: float) -> Trajectory:
        rng = self.rng
        plan = rng.choices(self.plans, self.weights)[0]
        n_steps = len(plan)
        steps = []
        for k, names in enumerate(plan):
            calls = [
                ToolCall(name, {a: rng.choice(self.values) for a in rng.sample(ARG_NAMES, rng.randint(1, 3))})
                for name in names
            ]
            observations = [rng.choice(self.observations) for _ in names]
            failed = observations[-1].startswith("Error")
            steps.append(Step(turn=k // 2, index=k, model_text=rng.choice(self.texts), calls=calls,
                              observations=observations, error="tool error" if failed else None,
                              completion_tokens=30))  # fmt: skip
        completion = n_steps * TOKENS_PER_STEP
        success = rng.random() < skill
        return Trajectory(
            run_id=RUN, round=round_, task_id=task_id, sample=sample, steps=steps,
            prompt_ids=self.tokens[:PROMPT_TOKENS], completion_ids=self.tokens[:completion],
            completion_mask=[1, 0] * (completion // 2), logprobs=[-0.5] * completion, reward=float(success),
            success=success, finish_reason="done" if success else "max_steps", duration_s=rng.random() * 30,
        )  # fmt: skip


def dict_rows(trajs: list[Trajectory]) -> tuple[list[dict], list[dict]]:
    """The same records as plain dict rows of the files' nested shape (calls' argument values as JSON literals)."""
    heads, steps = [], []
    for t in trajs:
        tid = t.trajectory_id
        heads.append({
            "trajectory_id": tid, "task_id": t.task_id, "sample": t.sample, "reward": t.reward, "success": t.success,
            "finish_reason": t.finish_reason, "num_steps": len(t.steps), "tool_sequence": t.tool_sequence,
            "prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids, "completion_mask": t.completion_mask,
            "logprobs": t.logprobs, "duration_s": t.duration_s,
        })  # fmt: skip
        for i, s in enumerate(t.steps):
            steps.append({
                "trajectory_id": tid, "step_index": i, "step_number": s.index, "turn": s.turn,
                "model_text": s.model_text,
                "calls": [{"name": c.name, "arguments": {k: json.dumps(v) for k, v in c.arguments.items()}}
                          for c in s.calls],
                "tool_names": [c.name for c in s.calls], "observations": s.observations, "error": s.error,
                "completion_tokens": s.completion_tokens,
            })  # fmt: skip
    return heads, steps


def make_task(index: int, round_: int) -> Task:
    return Task(
        environment="bfcl",
        initial_config={"GorillaFileSystem": {"root": {"w": {"type": "directory", "contents": {}}}}},
        involved_classes=["GorillaFileSystem"],
        turns=[f"task {index}"],
        reference=[[ToolCall(TOOLS[(index + k) % len(TOOLS)], {"dir_name": f"f{index}_{k}"}) for k in range(3)]],
        provenance=Provenance(origin="seed" if round_ == 0 else "boundary", round=round_),
    )


def ingest(warehouse: Warehouse, plain: Path, total_steps: int, rounds: int, batch: int) -> dict:
    """Writes about ``total_steps`` steps over ``rounds`` rounds, each batch both ways; returns the timings."""
    records = Records()
    rng = random.Random(1)
    warehouse.ensure_run(RUN, {})
    per_round = total_steps // 4 // rounds // GROUP  # tasks per round
    skill: dict[int, float] = {}
    timings = {"warehouse_s": 0.0, "pyarrow_s": 0.0, "records_s": 0.0}
    steps_written = trajectories_written = batches = 0

    def write(pending: list[Trajectory], round_: int) -> None:
        nonlocal steps_written, trajectories_written, batches
        heads, steps = dict_rows(pending)
        gc.collect()
        started = time.perf_counter()
        warehouse.write_trajectories(pending)
        timings["warehouse_s"] += time.perf_counter() - started
        started = time.perf_counter()
        folder = plain / f"round={round_}"
        pq.write_table(
            pa.Table.from_pylist(steps, schema=SCHEMAS["steps"]), folder / f"steps-{batches}.parquet", **_WRITE_OPTIONS
        )
        pq.write_table(
            pa.Table.from_pylist(heads, schema=SCHEMAS["trajectories"]),
            folder / f"trajectories-{batches}.parquet",
            **_WRITE_OPTIONS,
        )
        timings["pyarrow_s"] += time.perf_counter() - started
        steps_written += len(steps)
        trajectories_written += len(pending)
        batches += 1

    for round_ in range(rounds):
        (plain / f"round={round_}").mkdir(parents=True)
        first = round_ * per_round // 2  # half of this round's tasks were played the round before
        numbers = range(first, first + per_round)
        tasks = [make_task(i, round_) for i in numbers]
        warehouse.write_tasks(tasks)
        warehouse.set_pool(RUN, round_, [t.task_id for t in tasks])
        pending: list[Trajectory] = []
        for number, task in zip(numbers, tasks, strict=True):
            level = skill.setdefault(number, rng.random())
            started = time.perf_counter()
            pending += [records.trajectory(round_, task.task_id, s, level) for s in range(GROUP)]
            timings["records_s"] += time.perf_counter() - started
            if len(pending) >= batch:
                write(pending, round_)
                pending = []
        if pending:
            write(pending, round_)
        picked = [tasks[i] for i in range(0, len(tasks), 2)]  # signals on 5% of the round's trajectories
        signals = [Signal(RUN, round_, ("boundary", "rare", "forgetting")[i % 3],
                          f"{RUN}/r{round_}/{t.task_id}/s{i % GROUP}", t.task_id, {"score": 0.0})
                   for i, t in enumerate(picked[: len(tasks) * GROUP // 20])]  # fmt: skip
        warehouse.write_signals(signals)
        warehouse.write_candidates(RUN, round_, [
            Candidate(make_task(10_000_000 + round_ * 1000 + i, round_ + 1), s.signal_id, Verdict(i % 2 == 0, "ok"))
            for i, s in enumerate(signals[:200])
        ])  # fmt: skip
    ours, theirs = steps_written / timings["warehouse_s"], steps_written / timings["pyarrow_s"]
    return {
        "steps": steps_written, "trajectories": trajectories_written, "batches": batches,
        "steps_per_batch": round(steps_written / batches),
        "warehouse_s": round(timings["warehouse_s"], 1), "warehouse_steps_per_s": round(ours),
        "pyarrow_s": round(timings["pyarrow_s"], 1), "pyarrow_steps_per_s": round(theirs),
        "ratio": round(ours / theirs, 2), "records_s": round(timings["records_s"], 1),
    }  # fmt: skip


def best(repeats: int, fn, *args):
    times, result = [], None
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - started)
    return result, round(min(times), 3)


def time_views(root: Path, repeats: int) -> dict[str, dict[str, float]]:
    latencies: dict[str, dict[str, float]] = {}
    with Warehouse(root, read_only=True) as wh:
        con = wh.connect()
        try:
            for view, where in VIEWS.items():
                rows, all_s = best(repeats, lambda q: con.sql(q).fetchall(), f"SELECT * FROM {view}")
                _, filtered_s = best(repeats, lambda q: con.sql(q).fetchall(), f"SELECT * FROM {view} WHERE {where}")
                latencies[view] = {"all_s": all_s, "filtered_s": filtered_s, "rows": len(rows)}
        finally:
            con.close()
    return latencies


def time_mining(root: Path, rounds: int, repeats: int) -> dict:
    """The mine stage's read and mining of the last round, two ways, interleaved and checked equal.

    from_files_s: `mine_warehouse`, what the mine stage runs (a lazy scan of the files, mined as it is
    read; Signal records included), with frames_s its part up to the Polars frames (`mine_frames`).
    read_s + mine_s: the whole history read first as one sorted frame (`trajectory_frame`), then
    `mine_signals` on it.
    """
    last, config = rounds - 1, SignalConfig()
    times: dict[str, list[float]] = {"from_files_s": [], "frames_s": [], "read_s": [], "mine_s": []}
    with Warehouse(root, read_only=True) as wh:

        def timed(key: str, fn, *args):
            gc.collect()
            started = time.perf_counter()
            result = fn(*args)
            times[key].append(time.perf_counter() - started)
            return result

        for _ in range(repeats):
            signals = timed("from_files_s", mine_warehouse, wh, RUN, last, config)
            timed("frames_s", lambda: mine_frames(wh.trajectory_scan(RUN, last), last, config))
            frame = timed("read_s", wh.trajectory_frame, RUN, last)
            if timed("mine_s", mine_signals, frame, last, RUN, config) != signals:
                raise SystemExit("mining from the files and from the frame found different signals")
    kinds = {k: sum(1 for s in signals if s.kind == k) for k in ("forgetting", "boundary", "rare")}
    figures = {key: round(min(values), 3) for key, values in times.items()}
    return {
        "rows": frame.height,
        **figures,
        "read_and_mine_s": round(figures["read_s"] + figures["mine_s"], 3),
        "signals": kinds,
    }


def file_counts(root: Path) -> dict[str, int]:
    tables = root / "tables"
    return {t.name: sum(1 for _ in t.rglob("*.parquet")) for t in sorted(tables.iterdir())}


def folder_mb(path: Path) -> int:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, action="append", help="total steps; repeat for several sizes (default 1M)")
    parser.add_argument("--batch", type=int, action="append",
                        help="trajectories per write; repeat for several (default 2048; the rollout stage writes "
                             "warehouse.flush_every, 64 by default)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", help="folder for the scratch warehouses (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the warehouses written (their folder is printed)")
    parser.add_argument("--mining-only", metavar="FOLDER",
                        help="only time mining, on FOLDER/warehouse kept by an earlier run with --keep")  # fmt: skip
    args = parser.parse_args()
    if args.mining_only:
        root = Path(args.mining_only) / "warehouse"
        load = round(os.getloadavg()[0], 1)
        result = {
            "folder": args.mining_only,
            "load_before": load,
            "mining": time_mining(root, args.rounds, args.repeats),
        }
        print(json.dumps({**result, "load_after": round(os.getloadavg()[0], 1)}), flush=True)
        return
    for total in args.steps or [1_000_000]:
        for batch in args.batch or [2048]:
            with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
                if args.keep:
                    tmp = tempfile.mkdtemp(dir=args.workdir)
                root, plain = Path(tmp) / "warehouse", Path(tmp) / "pyarrow"
                result: dict = {
                    "steps": total,
                    "batch": batch,
                    "folder": tmp if args.keep else None,
                    "load_before": round(os.getloadavg()[0], 1),
                }
                with Warehouse(root) as wh:
                    result["ingest"] = ingest(wh, plain, total, args.rounds, batch)
                result["load_after_ingest"] = round(os.getloadavg()[0], 1)
                result["files"] = file_counts(root)
                result["warehouse_mb"], result["pyarrow_mb"] = folder_mb(root), folder_mb(plain)
                result["views"] = time_views(root, args.repeats)
                result["mining"] = time_mining(root, args.rounds, args.repeats)
                result["load_after"] = round(os.getloadavg()[0], 1)
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
