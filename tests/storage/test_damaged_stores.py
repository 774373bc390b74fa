"""Damaged stores: a warehouse or MLflow file that cannot be read is a DataError naming the file and the way back.

A DataError is bad data, so Prefect does not retry it; only a store behind a server that may come
back (InfrastructureError) is retried.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import duckdb
import pytest
from prefect.states import Failed

from coevolve.errors import DataError, InfrastructureError, is_retryable
from storage.tracking import Tracker
from storage.warehouse import Warehouse


def noise(size: int) -> bytes:
    return random.Random(0).randbytes(size)


def retried(exc: Exception) -> bool:
    return is_retryable(None, None, Failed(data=exc))


def assert_says_how_to_recover(error: DataError, path: Path) -> None:
    message = str(error)
    assert str(path) in message and "\n" not in message
    assert "from a backup" in message and "move it aside" in message and "untouched" in message


RUN = "run-a"


@pytest.fixture
def healthy_warehouse(tmp_path: Path, make_task, make_trajectory) -> Path:
    root = tmp_path / "warehouse"
    with Warehouse(root) as wh:
        tasks = [make_task(i) for i in range(20)]
        wh.write_tasks(tasks)
        wh.set_pool(RUN, 0, [t.task_id for t in tasks])
        wh.write_trajectories([make_trajectory(t.task_id, s, s == 0) for t in tasks for s in range(2)])
    return root


def trajectory_file(root: Path) -> Path:
    (path,) = (root / "tables" / "trajectories" / f"run_id={RUN}" / "round=0").glob("*.parquet")
    return path


def assert_says_how_to_redo(error: DataError, path: Path) -> None:
    message = str(error)
    assert str(path) in message and "\n" not in message
    assert "move it aside" in message and "coevolve round --round 0" in message


# -- the warehouse: its table files ---------------------------------------------------------------


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "damaged block"])
def test_a_damaged_table_file_is_a_data_error_that_says_how_to_recover(healthy_warehouse, damage):
    path = trajectory_file(healthy_warehouse)
    data = bytearray(path.read_bytes())
    if damage == "random bytes":
        data = bytearray(noise(len(data)))
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[4 : len(data) // 2] = noise(len(data) // 2 - 4)
    path.write_bytes(bytes(data))
    wh = Warehouse(healthy_warehouse, read_only=True)
    with pytest.raises(DataError) as caught:
        wh.trajectories(RUN, 0)
    assert_says_how_to_redo(caught.value, path)
    with pytest.raises(DataError) as caught:
        wh.sql("SELECT count(*) FROM trajectories")
    assert_says_how_to_redo(caught.value, path)
    assert not retried(caught.value)


def test_a_file_that_is_not_parquet_among_the_tables_is_a_data_error(healthy_warehouse):
    stray = trajectory_file(healthy_warehouse).parent / "notes.parquet"
    stray.write_text("round 0 looked fine\n")
    with pytest.raises(DataError) as caught:
        Warehouse(healthy_warehouse, read_only=True).sql("SELECT count(*) FROM trajectories")
    assert_says_how_to_redo(caught.value, stray)


def test_the_other_tables_stay_readable_beside_a_damaged_file(healthy_warehouse, make_task):
    trajectory_file(healthy_warehouse).write_bytes(noise(1000))
    wh = Warehouse(healthy_warehouse, read_only=True)
    assert len(wh.pool(RUN, 0)) == 20
    assert wh.sql("SELECT count(*) AS n FROM steps")["n"][0] == 80


ROWS = (
    "SELECT (SELECT count(*) FROM tasks) AS tasks, (SELECT count(*) FROM trajectories) AS trajectories, "
    "(SELECT count(*) FROM steps) AS steps, (SELECT count(*) FROM signals) AS signals"
)


def empty_file(root: Path, table: str) -> Path:
    """The file a table holds from the warehouse's start, which holds no rows (storage/views.py `_empty_file`)."""
    if table == "tasks":
        return root / "tables" / "tasks" / "_empty.parquet"
    return root / "tables" / table / "run_id=_empty" / "round=0" / "_empty.parquet"


@pytest.mark.parametrize("table", ["trajectories", "tasks", "signals"])
def test_a_damaged_empty_file_is_one_line_and_moving_it_aside_keeps_every_row(healthy_warehouse, table):
    before = Warehouse(healthy_warehouse, read_only=True).sql(ROWS).rows()
    path = empty_file(healthy_warehouse, table)
    path.write_bytes(noise(200))
    with pytest.raises(DataError) as caught:
        Warehouse(healthy_warehouse, read_only=True).sql("SELECT count(*) FROM v_success_by_round")
    message = str(caught.value)
    assert "\n" not in message and f"Warehouse file {path} is not a readable Parquet file" in message
    assert "empty file and holds no rows" in message and "LINE 1" not in message
    assert f"(mv {path} {path}.damaged)" in message
    path.rename(f"{path}.damaged")  # the printed fix
    assert Warehouse(healthy_warehouse, read_only=True).sql(ROWS).rows() == before
    # The views.sql script for the DuckDB CLI (storage/VIEWS.md) defines the same views without the file.
    with Warehouse(healthy_warehouse, read_only=True) as wh:
        script = wh.view_script()
    con = duckdb.connect()
    con.execute(script)
    assert con.execute(ROWS).fetchall() == before
    Warehouse(healthy_warehouse).close()  # opened for writing, as a round opens it: the file is written anew
    assert path.is_file()
    assert Warehouse(healthy_warehouse, read_only=True).sql(ROWS).rows() == before


# -- the warehouse: its catalog and its root ------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b'{"version": 3', b"[3]", b'{"version": "three"}', noise(300)])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_damaged_layout_record_is_a_data_error_that_says_how_to_recover(healthy_warehouse, content, read_only):
    layout = healthy_warehouse / "catalog" / "layout.json"
    layout.write_bytes(content)
    with pytest.raises(DataError) as caught:
        Warehouse(healthy_warehouse, read_only=read_only)
    assert_says_how_to_recover(caught.value, layout)
    assert not retried(caught.value)
    assert layout.read_bytes() == content, "a damaged record is never overwritten"


@pytest.mark.parametrize("read_only", [False, True])
def test_a_warehouse_root_of_random_bytes_is_a_data_error_that_says_how_to_recover(tmp_path, read_only):
    path = tmp_path / "warehouse"
    path.write_bytes(noise(20_000))
    with pytest.raises(DataError) as caught:
        Warehouse(path, read_only=read_only)
    assert_says_how_to_recover(caught.value, path)
    assert not retried(caught.value)


# -- the MLflow store -----------------------------------------------------------------------------


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def test_an_mlflow_store_of_random_bytes_is_a_data_error_not_retried(tmp_path):
    store = tmp_path / "mlflow.db"
    store.write_bytes(noise(20_000))
    with pytest.raises(DataError) as caught:
        Tracker(sqlite_uri(store), "exp", tmp_path / "artifacts")
    assert not isinstance(caught.value, InfrastructureError) and not retried(caught.value)
    assert_says_how_to_recover(caught.value, store.resolve())


def test_a_truncated_mlflow_store_is_a_data_error_not_retried(tmp_path):
    store = tmp_path / "mlflow.db"
    Tracker(sqlite_uri(store), "exp", tmp_path / "artifacts")
    store.write_bytes(store.read_bytes()[: store.stat().st_size // 3])
    with pytest.raises(DataError) as caught:
        Tracker(sqlite_uri(store), "exp", tmp_path / "artifacts")
    assert not retried(caught.value)
    assert_says_how_to_recover(caught.value, store.resolve())


def test_an_mlflow_store_path_that_is_a_folder_is_a_data_error(tmp_path):
    store = tmp_path / "mlflow.db"
    store.mkdir()
    with pytest.raises(DataError, match="is a directory") as caught:
        Tracker(sqlite_uri(store), "exp", tmp_path / "artifacts")
    assert_says_how_to_recover(caught.value, store.resolve())


def test_a_tracking_server_that_does_not_answer_is_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(InfrastructureError) as caught:
        Tracker(f"http://127.0.0.1:{port}", "exp", tmp_path / "artifacts")
    assert retried(caught.value)
