"""The table-format benchmark's measurements of one candidate (benchmarks/table_formats.py), run in its child.

Ingest, queries and partition replace; concurrent writers with a reader; a writer killed mid-append.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from benchmarks.table_format_candidates import FORMATS
from benchmarks.table_format_workload import COUNT_SQL, FAILURE_SQL, RUNS, batches, load_workload, relabel


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
