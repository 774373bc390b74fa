"""Schema migrations: applied once, recorded, and a newer database is refused."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from coevolve.errors import DataError
from storage.migrations import LATEST_VERSION, MIGRATIONS
from storage.warehouse import Warehouse


def test_a_new_file_gets_every_migration_once(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    Warehouse(path).close()
    rows = Warehouse(path, read_only=True).sql("SELECT version FROM schema_version ORDER BY version")
    assert rows["version"].to_list() == [v for v, _ in MIGRATIONS]


def test_migrations_are_numbered_in_increasing_order() -> None:
    versions = [v for v, _ in MIGRATIONS]
    assert versions == sorted(set(versions)) and versions[-1] == LATEST_VERSION


def test_every_documented_view_exists(warehouse: Warehouse) -> None:
    views = warehouse.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal")["view_name"].to_list()
    assert set(views) >= {
        "v_success_by_round", "v_success_by_task", "v_tool_failure_rates", "v_signal_mix",
        "v_pool_growth", "v_forgetting_events", "v_acceptance_rates",
    }


def test_a_database_from_a_newer_version_is_refused_with_its_version(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (?, now())", [LATEST_VERSION + 1])
    con.close()
    for read_only in (False, True):
        with pytest.raises(DataError, match=f"schema version {LATEST_VERSION + 1}.*upgrade the code"):
            Warehouse(path, read_only=read_only)


def test_read_only_open_of_a_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="missing.duckdb"):
        Warehouse(tmp_path / "missing.duckdb", read_only=True)


def test_read_only_open_does_not_migrate_an_older_database(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP)")
    con.execute(MIGRATIONS[0][1])
    con.execute("INSERT INTO schema_version VALUES (1, now())")
    con.close()
    with pytest.raises(DataError, match="open it read-write once to migrate"):
        Warehouse(path, read_only=True)
    assert Warehouse(path).schema_version() == LATEST_VERSION


def test_a_read_only_warehouse_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    with pytest.raises(DataError, match="read-only"):
        Warehouse(path, read_only=True).ensure_run("r", {})
