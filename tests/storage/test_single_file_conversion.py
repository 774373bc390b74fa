"""`coevolve warehouse migrate`: a single-file warehouse (schema version 2) converted to the open-table layout.

Exhaustive crash test (opt-in; figures in storage/README.md "Commit points"): an uninterrupted migrate
is traced (``tests/crash_at.py trace:``), then migrate dies just before and just after every write that
trace lists (each table file, each catalog record, the layout record, the rename that publishes the
warehouse), each death followed by the same command again. It carries the ``exhaustive`` marker, deselected
unless ``COEVOLVE_CRASH_EXHAUSTIVE=1``; ``make test-crash-exhaustive`` runs it (docs/reproducibility.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coevolve.errors import DataError
from coevolve.records import Task, Trajectory
from flows.cli import main
from storage.single_file_check import TABLES
from storage.single_file_conversion import compare, default_target, migrate
from storage.warehouse import Warehouse
from tests.crash_at import CRASH_EXIT
from tests.storage.old_warehouse import EXPECTED_ROWS, STAMP, create_old_file


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_table_converts_with_equal_counts_and_digests(old_warehouse) -> None:
    path = old_warehouse["path"]
    before = sha256(path)
    report = migrate(path)
    assert report.target == str(default_target(path)) == str(path.parent / "warehouse")
    assert [c.table for c in report.checks] == list(TABLES)
    assert {c.table: c.old_rows for c in report.checks} == EXPECTED_ROWS
    assert report.ok, report.format()
    assert all(c.old_digest == c.new_digest and len(c.new_digest) == 32 for c in report.checks)
    assert sha256(path) == before  # the old file is left as it was


def test_the_new_warehouse_returns_what_was_inserted(old_warehouse) -> None:
    migrate(old_warehouse["path"])
    trajectories: list[Trajectory] = old_warehouse["trajectories"]
    tasks: list[Task] = old_warehouse["tasks"]
    by_id = {t.task_id: t for t in tasks}
    with Warehouse(old_warehouse["path"].parent / "warehouse", read_only=True) as wh:
        for run_id, round_ in [("run-a", 0), ("run-a", 1), ("run-b", 0)]:
            expected = sorted((t for t in trajectories if (t.run_id, t.round) == (run_id, round_)),
                              key=lambda t: (t.task_id, t.sample))  # fmt: skip
            assert wh.trajectories(run_id, round_) == expected
        for (run_id, round_), ids in old_warehouse["pools"].items():
            assert wh.pool(run_id, round_) == [by_id[i] for i in ids]
        assert wh.rounds("run-a") == old_warehouse["summaries"]
        assert wh.round_status("run-a", 1) == "running"
        assert wh.stage_output("run-a", 0, "mine") == {"signals": {"rare": 0, "boundary": 1}}
        assert wh.evaluation_outcomes("run-a", 0, "heldout") == {tasks[2].task_id: True}
        odd = next(t for t in wh.trajectories("run-a", 0) if (t.task_id, t.sample) == (tasks[0].task_id, 1)).steps[-1]
        assert odd.calls[0].arguments == {"file_name": "résumé.txt", "mode": 0.1, "nested": {"b": [1, None], "a": "x"}}
        curve = wh.sql("SELECT run_id, round, trajectories, successes FROM v_success_by_round ORDER BY ALL").rows()
        assert curve == [("run-a", 0, 3, 2), ("run-a", 1, 1, 0), ("run-b", 0, 1, 1)]
        tools = wh.sql(
            "SELECT tool_name, calls, failed_calls FROM v_tool_failure_rates WHERE run_id = 'run-a' ORDER BY ALL"
        )
        assert ("touch", 1, 0) in tools.rows()
        created = wh.sql("SELECT created_at, config FROM runs WHERE run_id = 'run-a'").row(0)
        assert created[0] == STAMP and json.loads(created[1]) == {"seed": 3, "pool": {"seed_size": 12}, "name": "ü"}


def test_a_damaged_target_is_reported_per_table(old_warehouse, tmp_path: Path) -> None:
    path = old_warehouse["path"]
    target = tmp_path / "converted"
    assert migrate(path, target).ok
    # One value changed, count the same: only the digest tells.
    evaluation = next((target / "tables" / "evaluations" / "run_id=run-a" / "round=0").glob("split-heldout.parquet"))
    table = pq.read_table(evaluation)
    pq.write_table(table.set_column(table.schema.get_field_index("reward"), "reward", pa.array([0.5])), evaluation)
    # One trajectory file gone: its rows are missing.
    next((target / "tables" / "trajectories" / "run_id=run-b").rglob("*.parquet")).unlink()
    # One tool-call argument changed from 1 to 2 in the typed calls column.
    steps_file = next((target / "tables" / "steps" / "run_id=run-a" / "round=1").glob("*.parquet"))
    steps = pq.read_table(steps_file)
    calls = steps.column("calls").to_pylist()
    calls[0][0]["arguments"] = [("x", "2")]
    steps = steps.set_column(
        steps.schema.get_field_index("calls"), "calls", pa.array(calls, steps.schema.field("calls").type)
    )
    pq.write_table(steps, steps_file)
    report = compare(path, target)
    assert not report.ok
    assert report.mismatched == ["trajectories", "steps", "evaluations"]
    checks = {c.table: c for c in report.checks}
    assert checks["evaluations"].old_rows == checks["evaluations"].new_rows == 3
    assert (checks["trajectories"].old_rows, checks["trajectories"].new_rows) == (5, 4)
    assert "DIFFERS" in report.format()


def test_the_command_converts_checks_and_fails_on_a_difference(old_warehouse, tmp_path: Path, capsys) -> None:
    path = old_warehouse["path"]
    target = tmp_path / "via-cli"
    assert main(["warehouse", "migrate", str(path), "--to", str(target)]) == 0
    out = capsys.readouterr().out
    assert "trajectories" in out and "DIFFERS" not in out and "every table matches" in out
    # Converting into a warehouse that exists is refused; nothing is written or deleted.
    assert main(["warehouse", "migrate", str(path), "--to", str(target)]) == 2
    assert "already holds a warehouse" in capsys.readouterr().err
    assert main(["warehouse", "migrate", str(path), "--to", str(target), "--check"]) == 0
    capsys.readouterr()
    members = next((target / "tables" / "pool_membership" / "run_id=run-a" / "round=1").glob("*.parquet"))
    table = pq.read_table(members)
    pq.write_table(table.slice(0, 2), members)
    assert main(["warehouse", "migrate", str(path), "--to", str(target), "--check"]) == 1
    captured = capsys.readouterr()
    assert "pool_membership" in captured.err and "nothing was deleted" in captured.err
    line = next(line for line in captured.out.splitlines() if line.startswith("pool_membership"))
    assert line.split()[1:3] == ["7", "6"] and line.endswith("DIFFERS")
    assert path.exists() and members.exists()


def test_the_default_source_is_the_state_folders_file(old_warehouse, tmp_path: Path) -> None:
    state = old_warehouse["path"].parent
    assert main(["warehouse", "migrate", "--set", f"state_dir={state}"]) == 0
    assert (state / "warehouse" / "catalog" / "layout.json").exists()


def test_files_that_are_not_single_file_warehouses_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    with pytest.raises(DataError, match="schema_version"):
        migrate(other)
    with pytest.raises(DataError, match="No single-file warehouse"):
        migrate(tmp_path / "missing.duckdb")
    newer = tmp_path / "newer.duckdb"
    create_old_file(newer)
    con = duckdb.connect(str(newer))
    con.execute("INSERT INTO schema_version VALUES (3, ?)", [STAMP])
    con.close()
    with pytest.raises(DataError, match="version 3"):
        migrate(newer)
    assert not (tmp_path / "warehouse").exists()


def test_an_interrupted_migration_leaves_no_warehouse_and_the_next_one_starts_over(
    old_warehouse, tmp_path: Path
) -> None:
    source = old_warehouse["path"]
    target = default_target(source)
    staging = target.parent / ".warehouse.migrating"
    staging.mkdir()
    (staging / "leftover.parquet").write_bytes(b"from a killed migrate")
    with pytest.raises(DataError, match="coevolve warehouse migrate"):
        Warehouse(target)  # the pipeline refuses to start beside the unconverted file
    report = migrate(source)
    assert report.ok and not staging.exists()
    assert not (target / "leftover.parquet").exists()


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize(
    "crash_at",
    ["after:tables/trajectories/", "after:catalog/rounds/", "before:catalog/layout.json"],
    ids=["after-a-table-file", "after-a-catalog-record", "before-the-layout-record"],
)
def test_a_migration_killed_at_a_commit_point_then_run_again_equals_an_uninterrupted_one(
    old_warehouse, tmp_path, crash_at
) -> None:
    """The process dies (tests/crash_at.py) at the point; the pipeline refuses the state folder; a plain re-run
    completes."""
    path = old_warehouse["path"]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    died = subprocess.run([sys.executable, "-m", "tests.crash_at", crash_at, "warehouse", "migrate", str(path)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert died.returncode == CRASH_EXIT, died.stdout + died.stderr
    target = default_target(path)
    with pytest.raises(DataError, match="coevolve warehouse migrate"):
        Warehouse(target)
    assert main(["warehouse", "migrate", str(path)]) == 0
    reference = tmp_path / "uninterrupted"
    assert migrate(path, reference).ok
    assert _listing(target) == _listing(reference)


@pytest.mark.slow
@pytest.mark.exhaustive  # deselected unless COEVOLVE_CRASH_EXHAUSTIVE=1 (tests/conftest.py)
def test_exhaustive_a_migration_killed_before_and_after_every_write_then_run_again_equals_an_uninterrupted_one(
    old_warehouse, tmp_path
) -> None:
    """Every traced write is a crash point, before and after; each death is followed by the same command,
    which dies at the next point, until a last plain run. Until the publishing rename the pipeline refuses
    the state folder; after it, the target is the uninterrupted migration's."""
    path = old_warehouse["path"]
    target = default_target(path)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}

    def migrate_dying_at(spec: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tests.crash_at", spec, "warehouse", "migrate", str(path)],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip

    started = time.monotonic()
    trace = tmp_path / "writes.txt"
    assert migrate_dying_at(f"trace:{trace}").returncode == 0
    reference = tmp_path / "uninterrupted"
    os.rename(target, reference)
    seen: Counter[str] = Counter()
    points = []
    for written in trace.read_text().splitlines():
        seen[written] += 1
        points.append(f"{written}#{seen[written]}")
    assert points[-1] == f"{target}#1"  # the publishing rename is the last write
    for spec in (f"{when}:{point}" for point in points for when in ("before", "after")):
        died = migrate_dying_at(spec)
        assert died.returncode == CRASH_EXIT, (spec, died.stdout + died.stderr)
        if spec != f"after:{target}#1":
            with pytest.raises(DataError, match="coevolve warehouse migrate"):
                Warehouse(target)
    # Killed after publishing, before its check: the warehouse is complete, so the same command refuses
    # to overwrite it and names --check, which confirms it.
    again = migrate_dying_at("trace:/dev/null")
    assert again.returncode == 2 and "already holds a warehouse" in again.stderr
    assert main(["warehouse", "migrate", str(path), "--check"]) == 0
    assert _listing(target) == _listing(reference)
    print(f"\n{len(points)} commit points, {2 * len(points)} crashes, {time.monotonic() - started:.0f} s")
