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
The workload, the candidates and the measurements are benchmarks/table_format_workload.py,
table_format_candidates.py and table_format_measures.py; this script runs them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    # Run as a script (the DuckLake child too, under another interpreter): its parts import from the repository.
    sys.path.insert(0, str(REPO))

from benchmarks.table_format_candidates import FORMATS, ParquetFormat  # noqa: E402
from benchmarks.table_format_measures import measure_concurrency, measure_crash, measure_ingest, timed_queries  # noqa: E402
from benchmarks.table_format_workload import build_workload, load_workload  # noqa: E402


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
