"""Table formats for the warehouse's `steps`: plain Parquet, Delta Lake and DuckLake on one workload.

Builds a `steps` workload once (the project's step columns, plus run_id and round; `calls` as a typed
list<struct<name, arguments: map<string, string>>>), stores it as an Arrow IPC file, and runs each
candidate on it in its own child process, one candidate after the other:

- ingest: append the workload in batches of ``--batch`` rows (each batch inside one (run_id, round)
  partition) to durable storage; steps/s, seconds, bytes and files on disk;
- queries, in DuckDB: tool failure rate per tool name (unnest tool_names and observations; failed when
  ``lower(ltrim(observation)) LIKE 'error%'``) and a count per (run_id, round); best of ``--repeats``;
- replace one partition (a re-run of one round): delete run-0's rows of one round and write them again;
- concurrency: 4 writer processes append disjoint shards at once while a 5th process reads in a loop;
  every row must land exactly once; writer errors/retries and reader errors are counted, and a read
  that sees part of a batch counts as torn;
- crash: a writer appending in a loop is SIGKILLed; then what a reader sees (rows, errors, leftover files)
  and whether the next append works.

Candidates:
- ``parquet``: pyarrow; hive partitions ``steps/run_id=<r>/round=<n>/part-<seq>.parquet``; each batch is
  written to a hidden ``.part-<seq>.parquet.<pid>.tmp`` beside its target, fsynced, then os.replace'd;
  read with ``read_parquet('<root>/steps/**/*.parquet', hive_partitioning=true)``.
- ``delta``: the ``deltalake`` package, ``write_deltalake(mode='append', partition_by=['run_id', 'round'])``;
  read by registering ``DeltaTable(...).to_pyarrow_dataset()`` in DuckDB. Partition replace is one
  ``mode='overwrite'`` commit with a ``predicate``.
- ``ducklake``: DuckDB's ducklake extension with a DuckDB-file catalog and a local data path. The extension
  exists here only for DuckDB 1.5.5, so this candidate runs under another interpreter
  (``--ducklake-python``, a venv with duckdb==1.5.5 and duckdb-extension-ducklake==1.5.5); that child
  also times the same queries on the Parquet candidate's files with DuckDB 1.5.5, as a control.

Run (from the repository root; the machine: 2 shared cores):

    .venv/bin/python benchmarks/table_formats.py                       # 1M steps, all three candidates
    .venv/bin/python benchmarks/table_formats.py --steps 10000000 --formats parquet,delta \\
        --skip-concurrency --skip-crash
    .venv/bin/python benchmarks/table_formats.py --ducklake-python /tmp/ducklake-venv/bin/python

Prints markdown tables (and ``--json`` writes the raw figures). Scratch files go under ``--workdir``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

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


# -- candidates --------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ParquetFormat:
    name = "parquet"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.steps = root / "steps"

    def version(self) -> str:
        return f"pyarrow {pa.__version__}"

    def open_writer(self):
        return None

    def close_writer(self, handle) -> None:
        pass

    def _write_file(self, table: pa.Table, final: Path) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"  # not *.parquet: DuckDB's glob matches dotfiles
        pq.write_table(table.drop_columns(PART_COLUMNS), tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    def append(self, handle, table: pa.Table, run_id: str, round_: int, seq: int) -> None:
        self._write_file(table, self.steps / f"run_id={run_id}" / f"round={round_}" / f"part-{seq:05d}.parquet")

    def replace_partition(self, run_id: str, round_: int, parts: list[pa.Table]) -> None:
        directory = self.steps / f"run_id={run_id}" / f"round={round_}"
        keep = set()
        for seq, table in enumerate(parts):
            final = directory / f"part-{seq:05d}.parquet"
            self._write_file(table, final)
            keep.add(final.name)
        for stale in directory.glob("part-*.parquet"):
            if stale.name not in keep:
                stale.unlink()

    def reader(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.execute(
            f"CREATE VIEW steps AS SELECT * FROM read_parquet('{self.steps}/**/*.parquet', hive_partitioning = true)"
        )
        return con

    def leftovers(self) -> int:
        return sum(1 for _ in self.steps.rglob("*.tmp"))


class DeltaFormat:
    name = "delta"

    def __init__(self, root: Path) -> None:
        # A candidate's own package, installed only to run this benchmark; the project is not importable in
        # the ducklake child's interpreter, so coevolve.optional is not used in this file.
        import deltalake  # noqa: PLC0415 - imported only when the delta candidate runs

        self.dl = deltalake
        self.root = root
        self.uri = str(root / "steps")

    def version(self) -> str:
        return f"deltalake {self.dl.__version__}"

    def open_writer(self):
        return None

    def close_writer(self, handle) -> None:
        pass

    def append(self, handle, table: pa.Table, run_id: str, round_: int, seq: int) -> None:
        self.dl.write_deltalake(self.uri, table, mode="append", partition_by=PART_COLUMNS)

    def replace_partition(self, run_id: str, round_: int, parts: list[pa.Table]) -> None:
        self.dl.write_deltalake(
            self.uri, pa.concat_tables(parts), mode="overwrite", partition_by=PART_COLUMNS,
            predicate=f"run_id = '{run_id}' AND round = {round_}",
        )  # fmt: skip

    def reader(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.register("steps", self.dl.DeltaTable(self.uri).to_pyarrow_dataset())
        return con

    def leftovers(self) -> int:
        live = {u.split("/")[-1] for u in self.dl.DeltaTable(self.uri).file_uris()}
        return sum(
            1 for f in Path(self.uri).rglob("*") if f.is_file() and "_delta_log" not in f.parts and f.name not in live
        )


class DuckLakeFormat:
    name = "ducklake"

    def __init__(self, root: Path) -> None:
        # Only in the ducklake child's interpreter (--ducklake-python), which has duckdb 1.5.5 and the extension.
        import duckdb_extension_ducklake  # noqa: PLC0415 - present only in the ducklake child's interpreter

        self.root = root
        self.catalog = root / "catalog.ducklake"
        self.data = root / "data"
        self.extension = (
            Path(duckdb_extension_ducklake.__file__).parent
            / "extensions"
            / f"v{duckdb.__version__}"
            / "ducklake.duckdb_extension"
        )

    def version(self) -> str:
        extension = importlib.metadata.version("duckdb-extension-ducklake")
        return f"duckdb {duckdb.__version__} + duckdb-extension-ducklake {extension}"

    def _attach(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.execute(f"LOAD '{self.extension}'")
        self.data.mkdir(parents=True, exist_ok=True)
        mode = ", READ_ONLY" if read_only else ""
        con.execute(f"ATTACH 'ducklake:{self.catalog}' AS lake (DATA_PATH '{self.data}/'{mode})")
        return con

    def open_writer(self):
        return self._attach()

    def close_writer(self, handle) -> None:
        handle.close()

    def append(self, handle, table: pa.Table, run_id: str, round_: int, seq: int) -> None:
        con = handle if handle is not None else self._attach()
        try:
            con.register("batch", table)
            if not con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND table_name = 'steps'"
            ).fetchone()[0]:
                con.execute("CREATE TABLE lake.steps AS FROM batch LIMIT 0")
                con.execute("ALTER TABLE lake.steps SET PARTITIONED BY (run_id, round)")
            con.execute("INSERT INTO lake.steps SELECT * FROM batch")
            con.unregister("batch")
        finally:
            if handle is None:
                con.close()

    def replace_partition(self, run_id: str, round_: int, parts: list[pa.Table]) -> None:
        con = self._attach()
        try:
            con.register("batch", pa.concat_tables(parts))
            con.execute("BEGIN TRANSACTION")
            con.execute("DELETE FROM lake.steps WHERE run_id = ? AND round = ?", [run_id, round_])
            con.execute("INSERT INTO lake.steps SELECT * FROM batch")
            con.execute("COMMIT")
        finally:
            con.close()

    def reader(self) -> duckdb.DuckDBPyConnection:
        con = self._attach(read_only=True)
        con.execute("CREATE TEMP VIEW steps AS SELECT * FROM lake.steps")
        return con

    def leftovers(self) -> int:
        con = self._attach(read_only=True)
        try:
            live = {
                Path(r[0]).name
                for r in con.execute("SELECT data_file FROM ducklake_list_files('lake', 'steps')").fetchall()
            }
        finally:
            con.close()
        return sum(1 for f in self.data.rglob("*") if f.is_file() and f.name not in live)


FORMATS = {"parquet": ParquetFormat, "delta": DeltaFormat, "ducklake": DuckLakeFormat}


def disk_usage(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


# -- measurements (run inside one child per candidate) -------------------------------------------------


def timed_queries(con: duckdb.DuckDBPyConnection, repeats: int) -> dict:
    out = {}
    for key, sql in (("failure", FAILURE_SQL), ("count", COUNT_SQL)):
        times, rows = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            rows = con.execute(sql).fetchall()
            times.append(time.perf_counter() - t0)
        out[f"{key}_s"] = min(times)
        out[f"{key}_first_s"] = times[0]
        if key == "failure":
            out["failure_check"] = [sum(r[1] for r in rows), sum(r[2] for r in rows)]
        else:
            out["partitions"] = len(rows)
            out["rows"] = sum(r[2] for r in rows)
    return out


def measure_ingest(fmt, table: pa.Table, rows_per_round: int, batch: int, repeats: int) -> dict:
    handle = fmt.open_writer()
    n_batches = 0
    t0 = time.perf_counter()
    for run_id, round_, seq, part in batches(table, rows_per_round, batch):
        fmt.append(handle, part, run_id, round_, seq)
        n_batches += 1
    fmt.close_writer(handle)
    ingest_s = time.perf_counter() - t0
    size, files = disk_usage(fmt.root)
    con = fmt.reader()
    result = {
        "ingest_s": ingest_s,
        "steps_per_s": table.num_rows / ingest_s,
        "batches": n_batches,
        "bytes": size,
        "files": files,
    }
    result.update(timed_queries(con, repeats))
    con.close()

    # Replace one partition: run-0's rows of round 1 (round 0 if there is one round) are deleted and written again.
    round_ = 1 if table.num_rows > RUNS * rows_per_round else 0
    parts = [p for r, n, _, p in batches(table, rows_per_round, batch) if r == "run-0" and n == round_]
    t0 = time.perf_counter()
    fmt.replace_partition("run-0", round_, parts)
    result["replace_s"] = time.perf_counter() - t0
    result["replace_rows"] = sum(p.num_rows for p in parts)
    con = fmt.reader()
    after = {(r, n): c for r, n, c in con.execute(COUNT_SQL).fetchall()}
    con.close()
    result["replace_ok"] = (
        after.get(("run-0", round_)) == result["replace_rows"] and sum(after.values()) == table.num_rows
    )
    return result


def _writer_proc(fmt_name: str, root: str, wl_path: str, wid: int, rows: int, batch: int, queue) -> None:
    fmt = FORMATS[fmt_name](Path(root))
    shard = relabel(load_workload(wl_path).slice(0, rows), f"conc-{wid}")
    retries, failed, messages = 0, 0, set()
    t0 = time.perf_counter()
    for seq, start in enumerate(range(0, rows, batch)):
        part = shard.slice(start, batch)
        delay = 0.02
        for _attempt in range(400):
            try:
                fmt.append(None, part, f"conc-{wid}", 0, seq)
                break
            except Exception as exc:  # noqa: BLE001 - every error is counted and reported
                retries += 1
                messages.add(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        else:
            failed += 1
    queue.put(
        {
            "wid": wid,
            "retries": retries,
            "failed_batches": failed,
            "errors": sorted(messages)[:3],
            "s": time.perf_counter() - t0,
        }
    )


def _reader_proc(fmt_name: str, root: str, batch: int, stop, queue) -> None:
    fmt = FORMATS[fmt_name](Path(root))
    reads = errors = torn = backwards = 0
    last = 0
    messages = set()
    while not stop.is_set():
        try:
            con = fmt.reader()
            count = con.execute("SELECT count(*) FROM steps WHERE run_id LIKE 'conc-%'").fetchone()[0]
            con.close()
        except Exception as exc:  # noqa: BLE001
            errors += 1
            messages.add(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            time.sleep(0.01)
            continue
        reads += 1
        torn += count % batch != 0
        backwards += count < last
        last = max(last, count)
    queue.put(
        {"reads": reads, "errors": errors, "torn": torn, "backwards": backwards, "error_messages": sorted(messages)[:3]}
    )


def measure_concurrency(fmt_name: str, root: Path, wl_path: str, rows: int, batch: int, writers: int = 4) -> dict:
    ctx = mp.get_context("spawn")
    fmt = FORMATS[fmt_name](root)
    # The table exists before the writers start (Delta and DuckLake create it on the first write).
    seed = relabel(load_workload(wl_path).slice(0, batch), "seed")
    fmt.append(None, seed, "seed", 0, 0)
    queue, stop = ctx.Queue(), ctx.Event()
    reader = ctx.Process(target=_reader_proc, args=(fmt_name, str(root), batch, stop, queue))
    reader.start()
    procs = [
        ctx.Process(target=_writer_proc, args=(fmt_name, str(root), wl_path, w, rows, batch, queue))
        for w in range(writers)
    ]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    stop.set()
    read = queue.get()
    reader.join()
    con = fmt.reader()
    per_run = dict(con.execute("SELECT run_id, count(*) FROM steps WHERE run_id LIKE 'conc-%' GROUP BY 1").fetchall())
    distinct = con.execute(
        "SELECT count(*), count(DISTINCT (trajectory_id, step_index)) FROM steps WHERE run_id LIKE 'conc-%'"
    ).fetchone()
    con.close()
    exact = (
        all(per_run.get(f"conc-{w}") == rows for w in range(writers)) and distinct[0] == distinct[1] == writers * rows
    )
    return {
        "writers": writers, "rows_per_writer": rows, "batch": batch, "wall_s": wall,
        "steps_per_s": writers * rows / wall, "exactly_once": exact,
        "writer_retries": sum(r["retries"] for r in results),
        "failed_batches": sum(r["failed_batches"] for r in results),
        "writer_errors": sorted({m for r in results for m in r["errors"]})[:3],
        **{f"reader_{k}": v for k, v in read.items()},
    }  # fmt: skip


def _crash_writer(fmt_name: str, root: str, wl_path: str, batch: int, ready) -> None:
    fmt = FORMATS[fmt_name](Path(root))
    data = relabel(load_workload(wl_path).slice(0, batch), "crash")
    handle = fmt.open_writer()
    ready.set()
    seq = 0
    while True:
        fmt.append(handle, data, "crash", 0, seq)
        seq += 1


def measure_crash(fmt_name: str, root: Path, wl_path: str, batch: int, delays: list[float]) -> list[dict]:
    ctx = mp.get_context("spawn")
    fmt = FORMATS[fmt_name](root)
    out = []
    for delay in delays:
        ready = ctx.Event()
        proc = ctx.Process(target=_crash_writer, args=(fmt_name, str(root), wl_path, batch, ready))
        proc.start()
        ready.wait(120)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        row = {"kill_after_s": delay}
        try:
            con = fmt.reader()
            rows = con.execute("SELECT count(*) FROM steps WHERE run_id = 'crash'").fetchone()[0]
            con.close()
            row.update(read_ok=True, crash_rows=rows, whole_batches=rows % batch == 0)
        except Exception as exc:  # noqa: BLE001
            row.update(read_ok=False, read_error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        try:
            row["leftover_files"] = fmt.leftovers()
        except Exception as exc:  # noqa: BLE001
            row["leftover_files"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        try:
            fmt.append(None, relabel(load_workload(wl_path).slice(0, batch), "after-crash"), "after-crash", 0, len(out))
            row["next_append_ok"] = True
        except Exception as exc:  # noqa: BLE001
            row.update(next_append_ok=False, append_error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        out.append(row)
    return out


def run_candidate(args) -> dict:
    """Child entry point: every measurement of one candidate; returns the figures."""
    root = Path(args.workdir) / f"{args.worker}-{args.steps_one}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fmt = FORMATS[args.worker](root)
    table = load_workload(args.workload)
    result = {"format": args.worker, "version": fmt.version(), "steps": table.num_rows}
    result["ingest"] = measure_ingest(fmt, table, args.rows_per_round, args.batch, args.repeats)
    if args.parquet_control:
        con = ParquetFormat(Path(args.parquet_control)).reader()
        result["parquet_control"] = {"duckdb": duckdb.__version__, **timed_queries(con, args.repeats)}
        con.close()
    del table
    if not args.skip_concurrency:
        croot = Path(args.workdir) / f"{args.worker}-concurrency"
        shutil.rmtree(croot, ignore_errors=True)
        croot.mkdir(parents=True)
        result["concurrency"] = measure_concurrency(args.worker, croot, args.workload, args.conc_rows, args.conc_batch)
        if not args.skip_crash:
            result["crash"] = measure_crash(args.worker, croot, args.workload, args.conc_batch, [0.5, 1.5, 3.0])
    shutil.rmtree(root, ignore_errors=True) if not args.keep else None
    return result


# -- report ------------------------------------------------------------------------------------------


def report(results: list[dict]) -> str:
    lines = ["| format | version | steps | ingest steps/s | ingest s | on disk MiB | files | failure-rate query s "
             "| count query s | replace partition s (rows) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        if "error" in r:
            lines.append(
                f"| {r['format']} | {r.get('version', '-')} | {r.get('steps', '-')} | failed: {r['error']} "
                "| | | | | | |"
            )
            continue
        i = r["ingest"]
        lines.append(
            f"| {r['format']} | {r['version']} | {r['steps']:,} | {i['steps_per_s']:,.0f} | {i['ingest_s']:.1f} | "
            f"{i['bytes'] / 2**20:,.0f} | {i['files']:,} | {i['failure_s']:.2f} | {i['count_s']:.3f} | "
            f"{i['replace_s']:.2f} ({i['replace_rows']:,}{'' if i['replace_ok'] else ', WRONG'}) |"
        )
        if "parquet_control" in r:
            c = r["parquet_control"]
            lines.append(
                f"| parquet files read by DuckDB {c['duckdb']} (control) | | {c['rows']:,} | | | | | "
                f"{c['failure_s']:.2f} | {c['count_s']:.3f} | |"
            )
    conc = [r for r in results if "concurrency" in r]
    if conc:
        lines += ["", "| format | writers x rows (batch) | wall s | steps/s | exactly once | writer retries "
                      "| failed batches | reads | reader errors | torn reads | first writer / reader error |",
                  "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for r in conc:
            c = r["concurrency"]
            errs = "; ".join(c["writer_errors"][:1] + c["reader_error_messages"][:1]) or "-"
            lines.append(
                f"| {r['format']} | {c['writers']} x {c['rows_per_writer']:,} ({c['batch']:,}) | {c['wall_s']:.1f} | "
                f"{c['steps_per_s']:,.0f} | {c['exactly_once']} | {c['writer_retries']} | {c['failed_batches']} | "
                f"{c['reader_reads']} | {c['reader_errors']} | {c['reader_torn']} | {errs} |"
            )
    crash = [r for r in results if "crash" in r]
    if crash:
        lines += [
            "",
            "| format | SIGKILL after s | read ok | rows seen (whole batches) | leftover files | next append ok |",
            "|---|---:|---|---|---|---|",
        ]
        for r in crash:
            for c in r["crash"]:
                seen = f"{c['crash_rows']:,} ({c['whole_batches']})" if c.get("read_ok") else c.get("read_error", "-")
                lines.append(
                    f"| {r['format']} | {c['kill_after_s']} | {c['read_ok']} | {seen} | {c['leftover_files']} | "
                    f"{c['next_append_ok']} {c.get('append_error', '')} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, action="append", help="workload size in steps; repeat for several (default 1M)"
    )
    parser.add_argument("--formats", default="parquet,delta,ducklake")
    parser.add_argument("--batch", type=int, default=50_000, help="rows per append")
    parser.add_argument("--rows-per-round", type=int, default=100_000, help="rows of one (run_id, round) partition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--conc-rows", type=int, default=200_000, help="rows per concurrent writer")
    parser.add_argument(
        "--conc-batch", type=int, default=10_000, help="rows per append in the concurrency and crash tests"
    )
    parser.add_argument("--skip-concurrency", action="store_true")
    parser.add_argument("--skip-crash", action="store_true")
    parser.add_argument(
        "--ducklake-python",
        default="/tmp/ducklake-venv/bin/python",
        help="interpreter with duckdb==1.5.5 and the ducklake extension wheel",
    )
    parser.add_argument("--workdir", default="/tmp/coevolve-table-formats")
    parser.add_argument("--keep", action="store_true", help="keep each candidate's files")
    parser.add_argument("--json", help="also write the raw figures here")
    # Child mode (one candidate); set by the parent.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--steps-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--parquet-control", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print("RESULT " + json.dumps(run_candidate(args)))
        return

    workdir = Path(args.workdir)
    results = []
    for steps in args.steps or [1_000_000]:
        wl = workdir / f"workload-{steps}.arrow"
        if not wl.exists():
            build_s = build_workload(steps, args.rows_per_round, wl)
            print(
                f"built {steps:,} steps in {build_s:.1f} s ({wl.stat().st_size / 2**20:,.0f} MiB Arrow IPC)",
                file=sys.stderr,
            )
        formats = args.formats.split(",")
        for name in formats:
            python = args.ducklake_python if name == "ducklake" else sys.executable
            cmd = [python, __file__, "--worker", name, "--workload", str(wl), "--steps-one", str(steps),
                   "--workdir", str(workdir), "--batch", str(args.batch), "--rows-per-round", str(args.rows_per_round),
                   "--repeats", str(args.repeats),
                   "--conc-rows", str(args.conc_rows), "--conc-batch", str(args.conc_batch)]  # fmt: skip
            cmd += ["--skip-concurrency"] * args.skip_concurrency + ["--skip-crash"] * args.skip_crash
            keep_parquet = name == "parquet" and "ducklake" in formats
            cmd += ["--keep"] * (args.keep or keep_parquet)
            if name == "ducklake" and "parquet" in formats:
                cmd += ["--parquet-control", str(workdir / f"parquet-{steps}")]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                results.append({"format": name, "steps": steps, "error": tail[0][:300]})
            else:
                results.append(json.loads(line[len("RESULT ") :]))
            print(f"{name} {steps:,}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(workdir / f"parquet-{steps}", ignore_errors=True)
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
