"""Signal-mining speed: the Polars miner (tasks/mine.py) against a row-by-row Python reading of the same definitions.

Builds a synthetic trajectory frame shaped like the warehouse's (one row per trajectory with its
tool_sequence), mines the last round over the whole history, checks that both implementations find
exactly the same signals, and prints the timings for several sizes (to show the time is linear in rows).

Run (about 2 minutes here, most of it in the Python reference):

    .venv/bin/python benchmarks/mining.py                       # 250k, 500k, 1M trajectories
    .venv/bin/python benchmarks/mining.py --sizes 100000 --rounds 12 --no-reference

A "step row" is one tool call: the frame's tool sequences hold about 10 calls per trajectory, so
1M trajectories are about 10M step rows.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import defaultdict

import numpy as np
import polars as pl

from coevolve.config import SignalConfig
from tasks.mine import mine_frames, mine_signals

TOOLS = [f"tool_{i:02d}" for i in range(40)]


def make_frame(trajectories: int, rounds: int, group: int = 8, seed: int = 0, patterns: int = 5000) -> pl.DataFrame:
    """``trajectories`` rows over ``rounds`` rounds, ``group`` samples per task per round.

    Tool sequences are 1-19 calls (10 on average) drawn from a Zipf-like pattern vocabulary, so
    most trajectories share a few common patterns and a long tail is rare, as in real rollouts.
    Each task has a skill level; rewards are Bernoulli draws of it, so boundary groups, forgetting
    events and rare patterns all occur.
    """
    rng = np.random.default_rng(seed)
    per_round = trajectories // rounds
    tasks_per_batch = max(1, per_round // group)
    n_tasks = tasks_per_batch * 3  # each round draws a third of the task pool
    lengths = rng.integers(1, 20, size=patterns)
    vocab = pl.Series(
        "tool_sequence",
        [[TOOLS[t] for t in rng.integers(0, len(TOOLS), size=n)] for n in lengths],
        dtype=pl.List(pl.String),
    )
    weights = 1.0 / np.arange(1, patterns + 1) ** 1.1
    weights /= weights.sum()
    skill = rng.uniform(0, 1, size=n_tasks)

    rows_round, rows_task, rows_sample = [], [], []
    for r in range(rounds):
        chosen = rng.choice(n_tasks, size=tasks_per_batch, replace=False)
        rows_round.append(np.full(tasks_per_batch * group, r, dtype=np.int64))
        rows_task.append(np.repeat(chosen, group))
        rows_sample.append(np.tile(np.arange(group), tasks_per_batch))
    round_col = np.concatenate(rows_round)
    task_col = np.concatenate(rows_task)
    sample_col = np.concatenate(rows_sample)
    n = len(round_col)
    reward = (rng.uniform(0, 1, size=n) < skill[task_col]).astype(np.float64)
    pattern_idx = rng.choice(patterns, size=n, p=weights)
    frame = pl.DataFrame(
        {
            "round": round_col,
            "task_num": task_col,
            "sample": sample_col,
            "reward": reward,
        }
    ).with_columns(
        pl.format("t-{}", pl.col("task_num")).alias("task_id"),
        vocab.gather(pattern_idx),
    )
    return frame.with_columns(
        pl.format("run/r{}/{}/s{}", pl.col("round"), pl.col("task_id"), pl.col("sample")).alias("trajectory_id"),
        pl.lit("run").alias("run_id"),
        (pl.col("reward") > 0.5).alias("success"),
        pl.lit("done").alias("finish_reason"),
    ).select(
        "trajectory_id", "run_id", "round", "task_id", "sample", "reward", "success", "finish_reason", "tool_sequence"
    )


def reference_mine(rows: list[tuple], round_: int, config: SignalConfig) -> set[tuple[str, str]]:
    """Row-by-row reading of the three definitions (tool_sequence patterns), linear in rows.

    ``rows`` are (trajectory_id, round, task_id, sample, reward, tool_sequence) tuples in any order.
    Returns {(kind, trajectory_id)}.
    """
    out: set[tuple[str, str]] = set()
    history: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    current: dict[str, list[tuple[str, float]]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    total = 0
    for trajectory_id, r, task_id, sample, reward, seq in rows:
        if r > round_:
            continue
        total += 1
        if seq:
            counts[">".join(seq)] += 1
        if r < round_:
            history[task_id].append((r, sample, reward))
        else:
            current[task_id].append((trajectory_id, reward))
    window = config.forgetting_window
    for task_id, group in current.items():
        past = history.get(task_id)
        passed_before = bool(past) and max(x[2] for x in sorted(past)[-window:]) >= 0.5
        high = any(reward > 0.5 for _, reward in group)
        low = any(reward < 0.5 for _, reward in group)
        for trajectory_id, reward in group:
            if passed_before and reward < 0.5:
                out.add(("forgetting", trajectory_id))
            if high and low:
                out.add(("boundary", trajectory_id))
    if total >= config.rare_min_total:
        limit = config.rare_theta / 100
        for trajectory_id, r, _task_id, _sample, _reward, seq in rows:
            if r == round_ and seq and 0 < counts[">".join(seq)] / total < limit:
                out.add(("rare", trajectory_id))
    return out


def reference_from_frame(frame: pl.DataFrame, round_: int, config: SignalConfig) -> set[tuple[str, str]]:
    """The reference as a row-by-row implementation runs it: iterating the frame's rows first."""
    columns = ("trajectory_id", "round", "task_id", "sample", "reward", "tool_sequence")
    return reference_mine(list(frame.select(columns).iter_rows()), round_, config)


def timed(fn, *args):
    gc.collect()
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def best_of(repeats: int, fn, *args):
    results = [timed(fn, *args) for _ in range(repeats)]
    return results[-1][0], min(seconds for _, seconds in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[250_000, 500_000, 1_000_000], help="trajectories per run"
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="Polars timings are the best of this many runs")
    parser.add_argument("--no-reference", action="store_true", help="skip the row-by-row Python reference")
    args = parser.parse_args()
    config = SignalConfig()
    print(
        "frames: mine_frames (signals as Polars frames); records: mine_signals (plus Signal records);\n"
        "python: row-by-row reference on ready Python tuples; python+rows: the same, iterating the frame's rows first"
    )
    header = f"{'trajectories':>12} {'step rows':>11} {'signals':>8} {'frames s':>9} {'records s':>9}"
    if not args.no_reference:
        header += f" {'python s':>9} {'python+rows s':>13} {'x python':>8} {'x python+rows':>13}"
    print(header)
    for size in args.sizes:
        frame = make_frame(size, args.rounds)
        steps = int(frame["tool_sequence"].list.len().sum())
        last = args.rounds - 1
        frames, frame_s = best_of(args.repeats, mine_frames, frame, last, config)
        signals, record_s = best_of(args.repeats, mine_signals, frame, last, "run", config)
        line = f"{frame.height:>12,} {steps:>11,} {len(signals):>8,} {frame_s:>9.2f} {record_s:>9.2f}"
        if not args.no_reference:
            rows = frame.select("trajectory_id", "round", "task_id", "sample", "reward", "tool_sequence").rows()
            expected, ref_s = timed(reference_mine, rows, last, config)
            del rows
            _, ref_rows_s = timed(reference_from_frame, frame, last, config)
            got = {(kind, tid) for kind, fired in frames.items() for tid in fired["trajectory_id"].to_list()}
            if got != expected or {(s.kind, s.trajectory_id) for s in signals} != expected:
                raise SystemExit(f"mismatch at {size}: {len(got ^ expected)} signals differ")
            line += f" {ref_s:>9.2f} {ref_rows_s:>13.2f} {ref_s / frame_s:>7.1f}x {ref_rows_s / frame_s:>12.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
