"""Damaged stores: a warehouse or MLflow file that cannot be read is a DataError naming the file and the way back.

A DataError is bad data, so Prefect does not retry it; only a store behind a server that may come
back (InfrastructureError) is retried.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

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


@pytest.fixture
def healthy_warehouse(tmp_path: Path, make_task) -> Path:
    path = tmp_path / "warehouse.duckdb"
    with Warehouse(path) as wh:
        wh.write_tasks([make_task(i) for i in range(20)])
    return path


# -- the warehouse --------------------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_a_warehouse_of_random_bytes_is_a_data_error_that_says_how_to_recover(tmp_path, read_only):
    path = tmp_path / "warehouse.duckdb"
    path.write_bytes(noise(20_000))
    with pytest.raises(DataError) as caught:
        Warehouse(path, read_only=read_only)
    assert_says_how_to_recover(caught.value, path)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_truncated_warehouse_is_a_data_error_that_says_how_to_recover(healthy_warehouse, read_only):
    healthy_warehouse.write_bytes(healthy_warehouse.read_bytes()[:8192])
    with pytest.raises(DataError) as caught:
        Warehouse(healthy_warehouse, read_only=read_only)
    assert_says_how_to_recover(caught.value, healthy_warehouse)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_warehouse_with_a_damaged_block_is_a_data_error_that_says_how_to_recover(healthy_warehouse, read_only):
    data = bytearray(healthy_warehouse.read_bytes())
    data[12288 : 12288 + 16384] = noise(16384)
    healthy_warehouse.write_bytes(bytes(data))
    with pytest.raises(DataError) as caught:
        Warehouse(healthy_warehouse, read_only=read_only)
    assert_says_how_to_recover(caught.value, healthy_warehouse)


def test_a_damaged_warehouse_is_not_retried(tmp_path):
    path = tmp_path / "warehouse.duckdb"
    path.write_bytes(noise(20_000))
    with pytest.raises(DataError) as caught:
        Warehouse(path)
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
