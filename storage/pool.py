"""Immutable pool snapshots: one Parquet file per round, named by a content digest.

The digest is computed from the tasks' content hashes, not from the file bytes, so the same pool
always has the same digest whatever Parquet writer or compression wrote it. The digest is what
MLflow records, and what links a checkpoint to the pool it was trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import polars as pl

from coevolve.errors import DataError, disk_full_as_error
from coevolve.records import Task

_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "task_id": pl.String,
    "origin": pl.String,
    "round": pl.Int32,
    "tools": pl.List(pl.String),
    "task": pl.String,
}


def pool_digest(tasks: list[Task]) -> str:
    """sha256 over the sorted content hashes: independent of task order and of file encoding."""
    joined = "\n".join(sorted(t.content_hash for t in tasks))
    return hashlib.sha256(joined.encode()).hexdigest()


def _frame(tasks: list[Task]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "task_id": [t.task_id for t in tasks],
            "origin": [t.provenance.origin for t in tasks],
            "round": [t.provenance.round for t in tasks],
            "tools": [t.tools for t in tasks],
            "task": [json.dumps(t.to_dict(), sort_keys=True, default=str) for t in tasks],
        },
        schema=_SCHEMA,
    )


def write_pool_snapshot(tasks: list[Task], path: Path) -> str:
    """Writes the pool to path (Parquet) once and returns its digest.

    Writing the same pool again is a no-op; writing a different pool to an existing path raises
    DataError, because a snapshot that MLflow already refers to must never change.
    """
    path = Path(path)
    wanted = pool_digest(tasks)
    if path.exists():
        existing = pool_digest(read_pool_snapshot(path))
        if existing != wanted:
            raise DataError(
                f"Pool snapshot {path} already exists with different content (digest {existing[:12]}, "
                f"new pool {wanted[:12]}); snapshots are immutable, write the new pool to another path."
            )
        return wanted
    # Write to a temporary file and rename, so a crash never leaves a half-written snapshot behind; a full
    # disk is one line naming the folder.
    with disk_full_as_error(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            _frame(tasks).write_parquet(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return wanted


def read_pool_snapshot(path: Path, expected_digest: str | None = None) -> list[Task]:
    """Reads a snapshot back into tasks, in written order; checks its digest when one is given."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Pool snapshot {path} does not exist.")
    try:
        frame = pl.read_parquet(path, columns=["task"])
        tasks = [Task.from_dict(json.loads(text)) for text in frame["task"].to_list()]
    except DataError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DataError(f"Pool snapshot {path} cannot be read ({type(exc).__name__}: {first}).") from exc
    if expected_digest is not None:
        actual = pool_digest(tasks)
        if actual != expected_digest:
            raise DataError(
                f"Pool snapshot {path} has digest {actual}, expected {expected_digest}; "
                "the file was changed or replaced after it was recorded."
            )
    return tasks
