"""A second process can query the warehouse between the writer's batches.

DuckDB allows one read-write process or many read-only ones on a file, never both at once.
The warehouse releases the file after every batch and both sides retry on the lock, so an
analyst's process and the pipeline take turns instead of failing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from coevolve.errors import InfrastructureError
from storage.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[2]
RUN = "run-a"
BATCHES = 12
PER_BATCH = 4

READER = """
import json, sys, time
from storage.warehouse import Warehouse
path, final = sys.argv[1], int(sys.argv[2])
wh = Warehouse(path, read_only=True)
print("ready", flush=True)
seen, deadline = [], time.monotonic() + 60
while time.monotonic() < deadline:
    n = wh.sql("SELECT count(*) AS n FROM trajectories")["n"][0]
    seen.append(int(n))
    if n >= final:
        break
    time.sleep(0.01)
print(json.dumps(seen), flush=True)
"""


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_reader_process_sees_each_batch_while_the_writer_runs(tmp_path: Path, make_task, make_trajectory) -> None:
    path = tmp_path / "wh.duckdb"
    writer = Warehouse(path)
    reader = _spawn("-c", READER, str(path), str(BATCHES * PER_BATCH))
    try:
        assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
        for b in range(BATCHES):
            tid = make_task(b).task_id
            writer.write_trajectories([make_trajectory(tid, s, s % 2 == 0) for s in range(PER_BATCH)])
            time.sleep(0.1)
        out, err = reader.communicate(timeout=60)
    finally:
        reader.kill()
    seen = json.loads(out.strip().splitlines()[-1])
    assert reader.returncode == 0, err
    assert seen == sorted(seen), "a reader never sees a half-written or rolled-back batch"
    assert seen[-1] == BATCHES * PER_BATCH
    assert any(0 < n < BATCHES * PER_BATCH for n in seen), "the reader got in between batches"
    assert all(n % PER_BATCH == 0 for n in seen), "each batch is one transaction"


HOLDER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
"""


def test_a_reader_waits_for_a_writer_that_holds_the_file(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    holder = _spawn("-c", HOLDER, str(path), "1.0")
    try:
        assert holder.stdout.readline().strip() == "holding"
        start = time.monotonic()
        reader = Warehouse(path, read_only=True, lock_timeout_s=30)
        assert reader.sql("SELECT count(*) AS n FROM runs")["n"][0] == 0
        assert time.monotonic() - start > 0.3
    finally:
        holder.communicate(timeout=30)


def test_a_lock_held_too_long_is_a_retryable_infrastructure_error(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    holder = _spawn("-c", HOLDER, str(path), "3.0")
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(InfrastructureError, match="locked"):
            Warehouse(path, lock_timeout_s=0.3)
    finally:
        holder.kill()
        holder.communicate(timeout=30)


def test_the_writer_leaves_the_file_unlocked_between_calls(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    writer = Warehouse(path)
    writer.ensure_run(RUN, {})
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT run_id FROM runs").fetchall() == [(RUN,)]
    con.close()
