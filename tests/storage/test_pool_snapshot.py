"""Pool snapshots are immutable Parquet files checked by a content digest."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from coevolve.errors import DataError
from storage.pool import pool_digest, read_pool_snapshot, write_pool_snapshot


def test_a_snapshot_reads_back_the_same_tasks_in_order(tmp_path: Path, make_task) -> None:
    tasks = [make_task(2), make_task(0, origin="rare", round=1), make_task(1)]
    path = tmp_path / "pools" / "pool-000.parquet"
    digest = write_pool_snapshot(tasks, path)
    assert read_pool_snapshot(path, expected_digest=digest) == tasks


def test_a_snapshot_has_one_row_per_task_with_its_origin_and_tools(tmp_path: Path, make_task) -> None:
    tasks = [make_task(0), make_task(1, origin="boundary", round=2)]
    path = tmp_path / "pool.parquet"
    write_pool_snapshot(tasks, path)
    frame = pl.read_parquet(path)
    assert frame.columns == ["task_id", "origin", "round", "tools", "task"]
    assert frame.select("task_id", "origin", "round").rows() == [
        (t.task_id, t.provenance.origin, t.provenance.round) for t in tasks
    ]
    assert frame["tools"].to_list() == [["mkdir", "cd", "ls"]] * 2


def test_the_digest_depends_on_content_not_order(make_task) -> None:
    a, b = make_task(0), make_task(1)
    assert pool_digest([a, b]) == pool_digest([b, a])
    assert pool_digest([a, b]) != pool_digest([a])


def test_writing_the_same_pool_again_is_a_no_op(tmp_path: Path, make_task) -> None:
    path = tmp_path / "pool.parquet"
    first = write_pool_snapshot([make_task(0)], path)
    mtime = path.stat().st_mtime_ns
    assert write_pool_snapshot([make_task(0)], path) == first
    assert path.stat().st_mtime_ns == mtime


def test_a_snapshot_is_never_overwritten_with_another_pool(tmp_path: Path, make_task) -> None:
    path = tmp_path / "pool.parquet"
    write_pool_snapshot([make_task(0)], path)
    with pytest.raises(DataError, match="pool.parquet already exists with different content"):
        write_pool_snapshot([make_task(1)], path)
    assert read_pool_snapshot(path) == [make_task(0)]


def test_a_digest_mismatch_names_the_file(tmp_path: Path, make_task) -> None:
    path = tmp_path / "pool-003.parquet"
    write_pool_snapshot([make_task(0)], path)
    with pytest.raises(DataError, match=r"pool-003\.parquet has digest .* expected 0+"):
        read_pool_snapshot(path, expected_digest="0" * 64)


def test_a_missing_snapshot_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="pool-missing.parquet does not exist"):
        read_pool_snapshot(tmp_path / "pool-missing.parquet")


def test_an_unreadable_snapshot_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pool-bad.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="pool-bad.parquet cannot be read"):
        read_pool_snapshot(path)
