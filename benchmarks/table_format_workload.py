"""The table-format benchmark's `steps` workload (benchmarks/table_formats.py): built once, stored as Arrow IPC.

Also the two queries every candidate is timed on.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

TOOLS = ["mkdir", "cd", "ls", "touch", "cat", "grep", "mv", "cp", "rm", "echo", "wc", "sort"]
ARG_KEYS = ["path", "name", "content", "pattern", "count", "recursive", "source", "destination"]
STEPS_PER_TRAJECTORY = 8
RUNS = 2
PART_COLUMNS = ["run_id", "round"]

FAILURE_SQL = """
SELECT tool_name, count(*) AS calls,
       count(*) FILTER (WHERE lower(ltrim(observation)) LIKE 'error%') AS failed_calls,
       avg(CASE WHEN lower(ltrim(observation)) LIKE 'error%' THEN 1.0 ELSE 0.0 END) AS failure_rate
FROM (SELECT unnest(tool_names) AS tool_name, unnest(observations) AS observation FROM steps)
GROUP BY tool_name ORDER BY tool_name
"""
COUNT_SQL = "SELECT run_id, round, count(*) AS steps FROM steps GROUP BY ALL ORDER BY ALL"

# -- workload ----------------------------------------------------------------------------------------


def _words(rng, count: int, length: int) -> list[str]:
    """``count`` strings of about ``length`` characters made of random lowercase words."""
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    out = []
    for _ in range(count):
        raw = letters[rng.integers(0, 26, length)].copy()
        raw[rng.integers(0, length, length // 6)] = ord(" ")
        out.append(raw.tobytes().decode())
    return out


def _build_chunk(start: int, end: int, rows_per_round: int, rng) -> pa.Table:
    n = end - start
    idx = np.arange(start, end)
    part = idx // rows_per_round
    run = part % RUNS
    round_ = (part // RUNS).astype(np.int32)
    traj = idx // STEPS_PER_TRAJECTORY
    step_index = (idx % STEPS_PER_TRAJECTORY).astype(np.int32)
    first_traj, last_traj = traj[0], traj[-1]
    t_ids = np.arange(first_traj, last_traj + 1)
    t_part = (t_ids * STEPS_PER_TRAJECTORY) // rows_per_round
    traj_strings = pa.array(
        [f"run-{p % RUNS}/r{p // RUNS}/task-{(t // 8) * 2654435761 % 16**6:06x}/s{t % 8}"
         for t, p in zip(t_ids.tolist(), t_part.tolist(), strict=True)]
    )  # fmt: skip
    trajectory_id = pc.take(traj_strings, pa.array(traj - first_traj))
    run_id = pc.take(pa.array([f"run-{r}" for r in range(RUNS)]), pa.array(run))

    # model_text: two phrases (~60 chars each) out of 2,000 x 2,000 combinations, so values barely repeat.
    phrases = pa.array(_words(rng, 2000, 59))
    model_text = pc.binary_join_element_wise(
        pc.take(phrases, pa.array(rng.integers(0, 2000, n))), pc.take(phrases, pa.array(rng.integers(0, 2000, n))), " "
    )

    ncalls = rng.integers(1, 4, n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(ncalls)]).astype(np.int32))
    m = int(ncalls.sum())
    names = pc.take(pa.array(TOOLS), pa.array(rng.integers(0, len(TOOLS), m)))
    nargs = rng.integers(1, 3, m)
    arg_offsets = pa.array(np.concatenate([[0], np.cumsum(nargs)]).astype(np.int32))
    k = int(nargs.sum())
    # Distinct keys within one call: the second key is offset from the first by 1..len-1.
    first = rng.integers(0, len(ARG_KEYS), m)
    second = (first + rng.integers(1, len(ARG_KEYS), m)) % len(ARG_KEYS)
    key_index = np.stack([first, second], axis=1)[np.stack([nargs >= 1, nargs >= 2], axis=1)]
    keys = pc.take(pa.array(ARG_KEYS), pa.array(key_index))
    literals = (
        [f'"file_{i}.txt"' for i in range(3000)]
        + [str(i) for i in range(1000)]
        + ["true", "false", "null", '"dir_a/dir_b"']
    )
    values = pc.take(pa.array(literals), pa.array(rng.integers(0, len(literals), k)))
    arguments = pa.MapArray.from_arrays(arg_offsets, keys, values)
    call_struct = pa.StructArray.from_arrays(
        [names, arguments], fields=[pa.field("name", pa.string()), pa.field("arguments", arguments.type)]
    )
    calls = pa.ListArray.from_arrays(offsets, call_struct)
    tool_names = pa.ListArray.from_arrays(offsets, names)

    # observations: ~80 characters; 15% are errors ("Error: ..."), some with leading blanks.
    obs_phrases = pa.array(_words(rng, 4000, 36))
    body = pc.binary_join_element_wise(
        pc.take(obs_phrases, pa.array(rng.integers(0, 4000, m))),
        pc.take(obs_phrases, pa.array(rng.integers(0, 4000, m))),
        " ",
    )
    prefix = pc.take(
        pa.array(["", "Error: ", "  error: ", "ok "]), pa.array(rng.choice(4, m, p=[0.80, 0.12, 0.03, 0.05]))
    )
    observations = pa.ListArray.from_arrays(offsets, pc.binary_join_element_wise(prefix, body, ""))
    error = pc.if_else(
        pa.array(rng.random(n) < 0.1), pa.scalar("tool error: call failed"), pa.scalar(None, pa.string())
    )
    return pa.table({
        "trajectory_id": trajectory_id, "run_id": run_id, "round": pa.array(round_), "step_index": pa.array(step_index),
        "step_number": pa.array(step_index + 1), "turn": pa.array((step_index // 3).astype(np.int32)),
        "model_text": model_text, "calls": calls, "tool_names": tool_names, "observations": observations,
        "error": error, "completion_tokens": pa.array(rng.integers(5, 400, n).astype(np.int32)),
    })  # fmt: skip


def build_workload(steps: int, rows_per_round: int, path: Path) -> float:
    """Writes the workload to an Arrow IPC file (1M-row chunks); returns the seconds it took."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    for start in range(0, steps, 1_000_000):
        chunk = _build_chunk(start, min(steps, start + 1_000_000), rows_per_round, rng)
        if writer is None:
            writer = ipc.new_file(str(path), chunk.schema)
        writer.write_table(chunk)
    writer.close()
    return time.perf_counter() - t0


def load_workload(path: Path | str) -> pa.Table:
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def batches(table: pa.Table, rows_per_round: int, batch: int):
    """(run_id, round, seq, slice): each slice lies inside one partition; seq counts within it."""
    for p_start in range(0, table.num_rows, rows_per_round):
        p_end = min(table.num_rows, p_start + rows_per_round)
        head = table.slice(p_start, 1)
        run_id, round_ = head["run_id"][0].as_py(), head["round"][0].as_py()
        for seq, start in enumerate(range(p_start, p_end, batch)):
            yield run_id, round_, seq, table.slice(start, min(batch, p_end - start))


def relabel(table: pa.Table, run_id: str) -> pa.Table:
    """The same rows under another run_id (trajectory ids prefixed), for disjoint shards."""
    n = table.num_rows
    t = table.set_column(table.schema.get_field_index("run_id"), "run_id", pa.array([run_id] * n))
    tid = pc.binary_join_element_wise(pa.array([run_id] * n), t["trajectory_id"], "/")
    return t.set_column(t.schema.get_field_index("trajectory_id"), "trajectory_id", tid)
