"""`coevolve sql` is a read-only door: reads run, nothing else does, and nothing on disk changes.

Every check drives the command as a user does (`flows.cli.main` in this process) on a real warehouse
built with the storage helpers: two finished rounds, and a round whose ten tools fail from 6 of 6 calls
down to none. Each check works on its own copy of that state folder, from an empty working folder.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from coevolve.errors import PipelineError
from coevolve.records import RoundSummary
from flows.cli import main
from storage.views import READ_FORMS, QueryLimits, QueryRefused, QueryStopped
from storage.warehouse import Warehouse
from tests.doc_blocks import REPO, command_block
from tests.storage.conftest import build_task, build_trajectory

RUN = "door"
TOOLS = [f"tool_{i}" for i in range(10)]  # tool_i fails max(0, 6 - i) of its 6 calls
LONG_TOOLS = tuple(f"step_{k:02d}_of_a_long_episode" for k in range(12))  # one model_text of 300+ characters


def _build(state: Path) -> None:
    tasks = [build_task(i) for i in range(3)]
    with Warehouse(state / "warehouse") as wh:
        wh.ensure_run(RUN, {"seed": 1})
        wh.write_tasks(tasks)
        for round_ in (0, 1):
            wh.start_round(RUN, round_, f"flow-{round_}")
            wh.set_pool(RUN, round_, [t.task_id for t in tasks])
            wh.write_trajectories(
                [build_trajectory(t.task_id, s, s <= round_, round=round_, run_id=RUN) for t in tasks for s in (0, 1)]
            )
            wh.finish_round(RUN, round_, RoundSummary(RUN, round_, 3, 6, 0.5, {}, 0, 0, 0.0))
        tool_rounds = [
            build_trajectory(
                tasks[0].task_id, i, False, round=2, run_id=RUN, tools=(tool,) * 6,
                observations=tuple("Error: refused" if k < 6 - i else "ok" for k in range(6)),
            )
            for i, tool in enumerate(TOOLS)
        ]  # fmt: skip
        tool_rounds.append(build_trajectory(tasks[1].task_id, 0, True, round=2, run_id=RUN, tools=LONG_TOOLS))
        wh.write_trajectories(tool_rounds)
    (state / "notes.txt").write_text("a file of the state folder, outside the warehouse\n")
    pq.write_table(pa.table({"secret": [1]}), state / "beside.parquet")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("template") / "state"
    _build(state)
    return state


@pytest.fixture
def state(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the state folder of its own, and an empty working folder to run from."""
    copy = tmp_path / "state"
    shutil.copytree(template, copy)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return copy


def snapshot(folder: Path) -> dict[str, tuple[object, ...]]:
    """Every file (content digest, size, modification time) and folder under ``folder``."""
    found: dict[str, tuple[object, ...]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_dir():
            found[str(path.relative_to(folder))] = ("folder",)
        else:
            stat = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(folder))] = (digest, stat.st_size, stat.st_mtime_ns)
    return found


def sql(state: Path, query: str, *flags: str) -> int:
    return main(["sql", query, "--set", f"state_dir={state}", *flags])


def _committed_file(state: Path) -> Path:
    return next((state / "warehouse" / "tables" / "trajectories" / f"run_id={RUN}" / "round=0").glob("*.parquet"))


# -- what is refused ------------------------------------------------------------------------------

WRITES = {
    "copy to a file": "COPY (SELECT 1) TO 'out.csv'",
    "copy over the tables folder": (
        "COPY (SELECT 1 AS a, 2 AS b) TO '{root}/tables' (FORMAT parquet, PARTITION_BY (a), OVERWRITE)"
    ),
    "copy onto a committed file": "COPY (SELECT * FROM trajectories WHERE false) TO '{committed}' (FORMAT parquet)",
    "export": "EXPORT DATABASE '{cwd}/export'",
    "attach a new file": "ATTACH '{cwd}/new.duckdb' AS scratch",
    "attach inside the warehouse": "ATTACH '{root}/scratch.duckdb' AS scratch",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "create table": "CREATE TABLE kept AS SELECT * FROM trajectories",
    "create view": "CREATE VIEW mine AS SELECT 1",
    "drop": "DROP VIEW v_success_by_round",
    "set the lock-down back": "SET enable_external_access = true",
    "unlock": "SET lock_configuration = false",
    "pragma": "PRAGMA enable_profiling",
    "explain analyze": "EXPLAIN ANALYZE COPY (SELECT 1) TO 'out.csv'",
    "a write after a read": "SELECT 1; COPY (SELECT 1) TO 'out.csv'",
    "a read after a write": "DROP VIEW trajectories; SELECT count(*) FROM v_success_by_round",
}
OUTSIDE = {
    "a system file": "SELECT * FROM read_csv('/etc/passwd', sep = ':', header = false)",
    "a file of the state folder": "SELECT * FROM read_text('{state}/notes.txt')",
    "a path climbing out of the warehouse": "SELECT * FROM read_text('{root}/../notes.txt')",
    "a parquet file beside the warehouse": "SELECT * FROM read_parquet('{state}/beside.parquet')",
    "a listing of another folder": "SELECT * FROM glob('/etc/*')",
}


@pytest.mark.parametrize(
    "template_query",
    [*WRITES.values(), *OUTSIDE.values()],
    ids=[*WRITES, *(f"read {name}" for name in OUTSIDE)],
)
def test_a_statement_that_is_not_a_read_of_the_warehouse_is_refused_and_nothing_changes(
    state: Path, template_query: str, capsys: pytest.CaptureFixture[str]
) -> None:
    query = template_query.format(
        root=state / "warehouse", state=state, cwd=Path.cwd(), committed=_committed_file(state)
    )
    before = snapshot(state)
    code = sql(state, query)
    captured = capsys.readouterr()
    assert code == 2, captured.out
    assert captured.err.startswith("error: query refused: ") and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""
    assert snapshot(state) == before
    assert list(Path.cwd().iterdir()) == []


def test_a_refused_write_names_the_statement_and_where_derived_tables_go(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sql(state, "SELECT 1; INSTALL httpfs") == 2
    err = capsys.readouterr().err
    assert "statement 2 of 2 (INSTALL httpfs) is LOAD" in err and "nothing was run" in err
    assert 'docs/warehouse.md, "Derived tables"' in err
    assert "### Derived tables\n" in (REPO / "docs" / "warehouse.md").read_text()


def test_the_python_door_refuses_the_same_and_its_session_stays_locked(state: Path) -> None:
    outside = Path.cwd() / "out.csv"
    with Warehouse(state / "warehouse", read_only=True) as wh:
        with pytest.raises(PipelineError, match="is COPY"):
            wh.sql(f"COPY (SELECT 1) TO '{outside}'")
        # The second wall, on its own: a locked session refuses files outside and cannot be unlocked.
        con = wh.connect(locked=True)
        try:
            assert con.sql("SELECT count(*) FROM trajectories").fetchall() == [(23,)]
            with pytest.raises(duckdb.PermissionException):
                con.sql(f"COPY (SELECT 1) TO '{outside}'")
            with pytest.raises(duckdb.PermissionException):
                con.sql("LOAD httpfs")
            for setting in (
                "enable_external_access = true",
                "allowed_directories = ['/']",
                "lock_configuration = false",
            ):
                with pytest.raises(duckdb.Error, match="locked"):
                    con.sql(f"SET {setting}")
        finally:
            con.close()
    assert not outside.exists()


def test_the_python_door_stops_a_query_at_its_time_limit(state: Path) -> None:
    query = "SELECT count(DISTINCT (range * 7919) % 99999989) AS n FROM range(20000000)"  # a few seconds here
    with Warehouse(state / "warehouse", read_only=True) as wh:
        with pytest.raises(QueryStopped, match="time limit of 0.5 s"):
            wh.sql(query, limits=QueryLimits(timeout_s=0.5))


def test_a_closed_warehouse_refuses_a_write_naming_itself(state: Path) -> None:
    wh = Warehouse(state / "warehouse")
    wh.close()
    with pytest.raises(PipelineError, match=f"^Warehouse {re.escape(str(wh.root))} is closed.$"):
        wh.write_tasks([build_task(9)])


def test_a_state_folder_whose_path_holds_a_quote_answers_queries(state: Path, capsys) -> None:
    quoted = state.parent / "it's here"
    state.rename(quoted)
    assert sql(quoted, "SELECT count(*) AS n FROM trajectories", "--format", "csv") == 0
    assert capsys.readouterr().out.splitlines() == ["n", "23"]


def test_a_warehouse_whose_folder_name_ends_in_x_answers_queries(state: Path, capsys) -> None:
    # The session may read only below the warehouse's root, which is named with its own last character.
    moved = state.parent / "warehouse-X"
    (state / "warehouse").rename(moved)
    query = ["sql", "SELECT count(*) AS n FROM trajectories", "--format", "csv"]
    assert main([*query, "--set", f"state_dir={state}", "--set", f"warehouse.uri={moved}"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "23"]


# Every refusal of a statement: the statement as the user wrote it (spaces folded), up to 60 characters.
REFUSAL = (
    "query refused: {where} ({shown}) is {kind}; the warehouse's query door runs reads only ({forms}), and nothing "
    'was run. Derived tables go in a DuckDB file of your own (docs/warehouse.md, "Derived tables").'
)


@pytest.mark.parametrize(
    "query, where, shown, kind",
    [
        ("CREATE VIEW v AS SELECT 1", "the statement", "CREATE VIEW v AS SELECT 1", "CREATE"),
        ("DROP VIEW X;", "the statement", "DROP VIEW X", "DROP"),  # the closing semicolon goes, nothing else
        # Exactly 60 characters, shown whole; one more, cut to 59 and an ellipsis.
        ("CREATE VIEW v AS SELECT " + "1" * 36, "the statement", "CREATE VIEW v AS SELECT " + "1" * 36, "CREATE"),
        ("CREATE VIEW v AS SELECT " + "1" * 37, "the statement", "CREATE VIEW v AS SELECT " + "1" * 35 + "…", "CREATE"),
        ("SELECT 1;\n  DROP   VIEW\n v_pool_growth ;", "statement 2 of 2", "DROP VIEW v_pool_growth", "DROP"),
        ("COPY (SELECT 1) TO 'a.csv'; SELECT 2; SELECT 3", "statement 1 of 3", "COPY (SELECT 1) TO 'a.csv'", "COPY"),
    ],
)
def test_a_refusal_names_the_statement_its_place_and_its_type(state: Path, query, where, shown, kind) -> None:
    with Warehouse(state / "warehouse", read_only=True) as wh, pytest.raises(QueryRefused) as refused:
        wh.sql(query)
    assert str(refused.value) == REFUSAL.format(where=where, shown=shown, kind=kind, forms=READ_FORMS)


@pytest.mark.parametrize("query", ["", "  ;  ", "-- a comment only"])
def test_a_query_without_a_statement_is_refused_as_such(state: Path, query: str) -> None:
    with Warehouse(state / "warehouse", read_only=True) as wh, pytest.raises(QueryRefused) as refused:
        wh.sql(query)
    assert str(refused.value) == "query refused: it holds no statement"


# -- what runs ------------------------------------------------------------------------------------


def test_reads_over_the_views_answer(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT round, trajectories, successes FROM v_success_by_round ORDER BY round"
    assert sql(state, query, "--format", "json") == 0
    assert json.loads(capsys.readouterr().out) == [
        {"round": 0, "trajectories": 6, "successes": 3},
        {"round": 1, "trajectories": 6, "successes": 6},
        {"round": 2, "trajectories": 11, "successes": 1},
    ]
    for read in ("SELECT * FROM v_success_by_round", "DESCRIBE trajectories", "SUMMARIZE rounds", "SHOW TABLES",
                 "WITH r AS (FROM rounds) SELECT count(*) FROM r", "SELECT 1 AS a; SELECT 2 AS b"):  # fmt: skip
        assert sql(state, read) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[-4:] == ["b", "-", "2", "(1 row)"]
    assert sql(state, "SELECT 1 AS a; SELECT 2 AS b", "--format", "json") == 0
    assert json.loads(capsys.readouterr().out) == [{"b": 2}]


# -- which paths are warehouses -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["a system file", "a file", "an empty folder", "the state folder"])
def test_a_path_that_is_not_a_warehouse_folder_is_refused_as_such(
    state: Path, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = {
        "a system file": Path("/etc/passwd"),
        "a file": tmp_path / "notes.bin",
        "an empty folder": tmp_path / "empty",
        "the state folder": state,
    }[kind]
    if kind == "a file":
        path.write_bytes(os.urandom(2000))
    if kind == "an empty folder":
        path.mkdir()
    assert sql(state, "SELECT 1", "--database", str(path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is not a warehouse folder") and err.count("\n") == 1, err
    assert "mv " not in err and "damaged" not in err and "move it" not in err


def test_a_warehouse_folder_with_a_damaged_record_still_says_how_to_recover(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (state / "warehouse" / "catalog" / "layout.json").write_bytes(b"\x13" * 100)
    assert sql(state, "SELECT 1", "--database", str(state / "warehouse")) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and "from a backup" in err and err.count("\n") == 1


def test_a_single_file_warehouse_names_its_conversion(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "warehouse.duckdb"
    duckdb.connect(str(old)).close()
    assert sql(state, "SELECT 1", "--database", str(old)) == 2
    assert f"coevolve warehouse migrate {old}" in capsys.readouterr().err


# -- what is printed ------------------------------------------------------------------------------


def _table_rows(out: str) -> list[list[str]]:
    """The body rows of a printed table (after its header and rule, before its count line)."""
    lines = out.splitlines()
    assert set(lines[1]) <= {"-", "+"}, out
    return [[cell.strip() for cell in line.split(" | ")] for line in lines[2:-1]]


def test_limit_prints_the_first_n_rows_in_the_query_order_and_counts_the_rest(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "SELECT tool_name, failed_calls FROM v_tool_failure_rates ORDER BY failed_calls DESC, tool_name"
    assert sql(state, query, "--limit", "4") == 0
    out = capsys.readouterr().out
    assert _table_rows(out) == [["tool_0", "6"], ["tool_1", "5"], ["tool_2", "4"], ["tool_3", "3"]]
    with Warehouse(state / "warehouse", read_only=True) as wh:
        total = wh.sql("SELECT count(*) AS n FROM v_tool_failure_rates")["n"][0]
    assert total == len(TOOLS) + len(LONG_TOOLS) + 2  # and mkdir, cd of rounds 0 and 1
    assert out.splitlines()[-1].startswith(f"(the first 4 of {total} rows; {total - 4} more not shown")
    assert "…" not in out


def test_a_table_shows_50_rows_by_default_and_every_row_when_asked(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sql(state, "SELECT range AS i FROM range(120)") == 0
    out = capsys.readouterr().out
    assert [row[0] for row in _table_rows(out)] == [str(i) for i in range(50)]
    assert "70 more not shown" in out.splitlines()[-1]
    assert sql(state, "SELECT range AS i FROM range(120)", "--limit", "0") == 0
    out = capsys.readouterr().out
    assert len(_table_rows(out)) == 120 and out.splitlines()[-1] == "(120 rows)"


def test_cells_are_printed_whole(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Warehouse(state / "warehouse", read_only=True) as wh:
        (text,) = wh.sql("SELECT model_text FROM steps WHERE model_text LIKE 'step_00%'")["model_text"]
    assert len(text) > 300
    query = "SELECT model_text, tool_names FROM steps WHERE model_text LIKE 'step_00%'"
    assert sql(state, query) == 0
    out = capsys.readouterr().out
    assert _table_rows(out)[0] == [text, json.dumps(list(LONG_TOOLS))]


def test_csv_and_json_parse_to_the_rows_of_the_query(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT run_id, round, tool_names, model_text FROM steps ORDER BY round, trajectory_id, step_index"
    with Warehouse(state / "warehouse", read_only=True) as wh:
        expected = wh.sql(query).to_dicts()
    assert len(expected) == 46
    assert sql(state, query, "--format", "json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == expected and captured.err == ""
    assert sql(state, query, "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["run_id"], int(r["round"]), json.loads(r["tool_names"]), r["model_text"]) for r in rows] == [
        (e["run_id"], e["round"], e["tool_names"], e["model_text"]) for e in expected
    ]
    assert sql(state, query, "--format", "json", "--limit", "5") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == expected[:5]
    assert captured.err == "the first 5 of 46 rows; 41 more not shown (--limit N shows N, --limit 0 all)\n"


# -- the documented way to keep a derived table ---------------------------------------------------


def test_the_documented_derived_table_block_builds_a_table_in_a_file_of_your_own(state: Path, tmp_path: Path) -> None:
    work = tmp_path / "analyst"
    (work / ".coevolve").mkdir(parents=True)
    shutil.copytree(state / "warehouse", work / ".coevolve" / "warehouse")
    (work / ".venv").symlink_to(REPO / ".venv")
    before = snapshot(work / ".coevolve")
    block = command_block("analysis.duckdb")
    done = subprocess.run(["bash", "-c", block.text], cwd=work, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert snapshot(work / ".coevolve") == before
    con = duckdb.connect(str(work / "analysis.duckdb"), read_only=True)
    try:
        kept = con.sql("SELECT round, sum(episodes) FROM task_success GROUP BY round ORDER BY round").fetchall()
    finally:
        con.close()
    assert kept == [(0, 6), (1, 6), (2, 11)]


# -- bounds: time, memory, rows fetched, DuckDB's temporary files --------------------------------------------

ENDLESS = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT max(n) FROM t"


def test_an_endless_query_stops_at_its_time_limit_naming_the_flag(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sql(state, ENDLESS, "--timeout", "1") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query stopped at its time limit of 1 s; give it longer with `coevolve sql --timeout")
    assert len(err.strip().splitlines()) == 1
    assert not (state / "tmp").exists()  # the query's spill folder went with it


def test_the_time_limit_has_a_default_in_the_configuration(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sql(state, ENDLESS, "--set", "warehouse.query_timeout_s=1") == 2
    assert "time limit of 1 s" in capsys.readouterr().err


def test_a_time_limit_of_0_lets_a_query_run_as_long_as_it_takes(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "SELECT count(DISTINCT (range * 7919) % 9999991) AS n FROM range(3000000)"  # about a second here
    assert sql(state, query, "--timeout", "0", "--format", "csv") == 0
    assert capsys.readouterr().out.splitlines() == ["n", "3000000"]


def test_a_timeout_that_is_not_seconds_is_refused_by_the_parser(state: Path) -> None:
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(SystemExit):
            sql(state, "SELECT 1", "--timeout", bad)


def test_printing_50_rows_of_a_hundred_million_fetches_only_those(state: Path) -> None:
    """The whole result was converted before --limit cut it: 966 MB for 50 rows."""
    measured = subprocess.run(
        [
            sys.executable, "-c",
            "import resource, subprocess, sys; "
            "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "print(done.stdout.splitlines()[-1])",
            sys.executable, "-m", "flows.cli", "sql", "SELECT * FROM range(100000000)", "--set", f"state_dir={state}",
        ],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    first, last = measured.stdout.splitlines()
    code, max_rss_kib = (int(word) for word in first.split())
    assert code == 0
    assert last == "(the first 50 of 100000000 rows; 99999950 more not shown (--limit N shows N, --limit 0 all))"
    assert max_rss_kib < 600 * 1024


def test_a_file_in_duckdbs_default_temporary_folder_is_not_readable(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DuckDB's temp_directory is readable whatever allowed_directories says; its default is .tmp in the working
    folder, which may hold anything. The door's sessions spill to a fresh folder of their own under state_dir/tmp."""
    Path(".tmp").mkdir()
    Path(".tmp/secret.csv").write_text("secret\n42\n")
    assert sql(state, "SELECT * FROM read_csv('.tmp/secret.csv')") == 2
    assert "query refused" in capsys.readouterr().err
    assert sql(state, f"SELECT * FROM read_csv('{Path.cwd()}/.tmp/secret.csv')") == 2
    assert "query refused" in capsys.readouterr().err


def test_values_polars_cannot_hold_are_printed_as_duckdbs_text(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT {'a': union_value(k := 1)} AS s, 'infinity'::DATE AS d"
    assert sql(state, query) == 0
    assert _table_rows(capsys.readouterr().out) == [["{'a': 1}", "infinity"]]


def test_a_query_past_its_memory_limit_spills_under_the_state_folder_and_answers(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "SELECT count(DISTINCT (range * 7919) % 9999991) AS n FROM range(3000000)"
    assert sql(state, query, "--set", "warehouse.query_memory_mb=64") == 0
    assert "9999991" not in capsys.readouterr().out
    assert not (state / "tmp").exists()


@pytest.mark.parametrize("tmp_there", [False, True], ids=["no tmp folder", "a tmp folder with a file"])
def test_a_query_spills_to_a_folder_of_its_own_under_the_state_folder_and_leaves_it_as_it_found_it(
    state: Path, capsys: pytest.CaptureFixture[str], tmp_there: bool
) -> None:
    if tmp_there:
        (state / "tmp").mkdir()
        (state / "tmp" / "kept.txt").write_text("another process's file\n")
    assert sql(state, "SELECT current_setting('temp_directory') AS spill", "--format", "json") == 0
    (spill,) = [Path(row["spill"]) for row in json.loads(capsys.readouterr().out)]
    assert spill.parent == state / "tmp" and not spill.exists()
    if tmp_there:
        assert [p.name for p in (state / "tmp").iterdir()] == ["kept.txt"]
    else:
        assert not (state / "tmp").exists()


# -- generated statements -------------------------------------------------------------------------------------

FRAGMENTS = [
    "SELECT", "WITH", "FROM", "VALUES", "DESCRIBE", "SHOW", "SUMMARIZE", "COPY", "ATTACH", "DETACH", "INSTALL",
    "LOAD", "CREATE", "DROP", "SET", "RESET", "PRAGMA", "CALL", "EXPLAIN", "ANALYZE", "PIVOT", "EXPORT", "IMPORT",
    "INSERT", "UPDATE", "DELETE", "ALTER", "USE", "CHECKPOINT", "VACUUM", "BEGIN", "COMMIT", "TABLE", "VIEW", "AS",
    "TO", "INTO", "1", "*", "(", ")", ",", ";", "'", '"', "--", "/*", "*/", "$$", "?", "$1", "trajectories",
    "v_success_by_round", "rounds", "range(3)", "read_csv('/etc/passwd')", "read_text('../notes.txt')",
    "glob('/*')", "'out.csv'", "'x.duckdb'", "enable_external_access", "= true", "lock_configuration", "getenv('HOME')",
    "query_table('rounds')", "read_parquet('../beside.parquet')", "WHERE", "ORDER BY 1", "LIMIT 1", "UNION ALL",
    "RECURSIVE", "t(n)", "NULL", "[1, 2]", "{'a': 1}", "INTERVAL 1 DAY", "1::BIT", "union_value(k := 1)",
    "'\\x00'", "\n", "E'\\''", "current_setting('temp_directory')",
]  # fmt: skip
# Values of every kind DuckDB returns, some of which Polars cannot import or hand back.
VALUES = [
    "1", "NULL", "'x'", "1.5", "'NaN'::DOUBLE", "'infinity'::DATE", "'-infinity'::TIMESTAMP", "INTERVAL 1 DAY",
    "1::BIT", "10::VARINT", "1::UHUGEINT", "170141183460469231731687303715884105727::HUGEINT", "'a'::ENUM('a', 'b')",
    "'\\xAA'::BLOB", "gen_random_uuid()", "123.4567::DECIMAL(38, 10)", "[[1], [2, 3]]", "[1, 2]::INT[2]",
    "{'a': 1}", "MAP {'k': 1}", "union_value(k := 1)", "{'a': union_value(k := 1)}", "'12:00:00+02'::TIMETZ",
    "'1'::JSON", "now()", "'2024-01-01'::DATE - '2023-01-01'::DATE", "round", "run_id", "success",
]  # fmt: skip
reads = st.builds(
    "SELECT {} FROM {} LIMIT {}".format,
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=4).map(", ".join),
    st.sampled_from(["trajectories", "range(3)", "rounds", "v_success_by_round"]),
    st.integers(0, 3),
)
statements = reads | st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), min_size=1, max_size=12).map(" ".join)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=statements)
@example(query="--")
@example(query="-x")
def test_any_statement_answers_or_is_refused_in_one_line_and_nothing_changes(
    state: Path, capsys: pytest.CaptureFixture[str], query: str
) -> None:
    before = snapshot(state)
    cwd = sorted(os.listdir("."))
    # After `--`, as a shell user passes a query that could read as an option ("--", "-x").
    code = main(["sql", "--set", f"state_dir={state}", "--timeout", "5", "--", query])
    captured = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert snapshot(state) == before
    assert sorted(os.listdir(".")) == cwd
