"""The layout version: kept in catalog/layout.json, checked on every open; other versions are refused with the way
forward."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from coevolve.errors import DataError
from storage.layouts import LATEST_VERSION, LAYOUTS
from storage.single_file_schema import SINGLE_FILE_MIGRATIONS
from storage.warehouse import Warehouse


def layout_file(root: Path) -> Path:
    return root / "catalog" / "layout.json"


def test_a_new_warehouse_records_the_latest_layout_version(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    Warehouse(root).close()
    assert json.loads(layout_file(root).read_text())["version"] == LATEST_VERSION
    assert Warehouse(root, read_only=True).schema_version() == LATEST_VERSION


def test_opening_a_warehouse_again_keeps_its_layout_record(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    Warehouse(root).close()
    first = layout_file(root).read_text()
    Warehouse(root).close()
    assert layout_file(root).read_text() == first


def test_layout_versions_are_numbered_after_the_single_file_ones() -> None:
    versions = [v for v, _ in SINGLE_FILE_MIGRATIONS] + [v for v, _ in LAYOUTS]
    assert versions == sorted(set(versions)) and versions[-1] == LATEST_VERSION


def test_every_documented_view_exists(warehouse: Warehouse) -> None:
    views = warehouse.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal")["view_name"].to_list()
    assert set(views) >= {
        "v_success_by_round",
        "v_success_by_task",
        "v_tool_failure_rates",
        "v_signal_mix",
        "v_pool_growth",
        "v_forgetting_events",
        "v_acceptance_rates",
        "v_bfcl_multi_turn",
        "v_training_steps",
    }


@pytest.mark.parametrize("read_only", [False, True])
def test_a_warehouse_of_a_newer_layout_is_refused_with_its_version(tmp_path: Path, read_only: bool) -> None:
    root = tmp_path / "wh"
    Warehouse(root).close()
    layout_file(root).write_text(json.dumps({"version": LATEST_VERSION + 1}))
    with pytest.raises(DataError, match=f"layout version {LATEST_VERSION + 1}.*upgrade the code"):
        Warehouse(root, read_only=read_only)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_warehouse_of_an_older_layout_says_to_migrate(tmp_path: Path, read_only: bool) -> None:
    root = tmp_path / "wh"
    Warehouse(root).close()
    layout_file(root).write_text(json.dumps({"version": LATEST_VERSION - 1}))
    with pytest.raises(DataError, match="coevolve warehouse migrate") as caught:
        Warehouse(root, read_only=read_only)
    assert str(root) in str(caught.value)
    assert json.loads(layout_file(root).read_text())["version"] == LATEST_VERSION - 1, "nothing is converted on open"


@pytest.mark.parametrize("read_only", [False, True])
def test_a_single_file_warehouse_given_as_the_root_says_to_migrate(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / "warehouse.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP)")
    con.close()
    before = path.read_bytes()
    with pytest.raises(DataError, match=f"coevolve warehouse migrate {path}"):
        Warehouse(path, read_only=read_only)
    assert path.read_bytes() == before, "the old file is left as it was"


def test_read_only_open_of_a_missing_warehouse_names_it_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="missing"):
        Warehouse(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()


def test_a_read_only_warehouse_refuses_writes(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    Warehouse(root).close()
    with pytest.raises(DataError, match="read-only"):
        Warehouse(root, read_only=True).ensure_run("r", {})
