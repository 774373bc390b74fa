"""Convert a single-file warehouse (``warehouse.duckdb``, layout versions 1 and 2) to the open-table layout.

``coevolve warehouse migrate [PATH] [--to ROOT]`` calls `migrate`: it reads the old file read-only,
writes every table as the Parquet files and catalog records a fresh warehouse holds (storage/tables.py,
storage/catalog.py), then `compare`s both sides table by table. A local target is written as a hidden
staging folder and renamed into place in one step, so it exists whole or not at all; on an object
store the layout record is written after every table file and record. The old file is never changed, and
nothing is deleted when the comparison fails: the report says which table differs. How both sides are
compared: storage/single_file_check.py.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from coevolve.errors import DataError
from storage.columns import CALL_TYPE, SCHEMAS, conform
from storage.single_file_check import MigrationReport, compare, source_version
from storage.tables import TableFiles, fsync_dir, part_name
from storage.warehouse import Warehouse

# The hidden folder beside the target that a local migration writes before renaming it onto the target.
STAGING_SUFFIX = ".migrating"
# Rows per written file of the bulk tables (trajectories with their steps, tasks).
BATCH_ROWS = 4096


def default_target(source: str | os.PathLike[str]) -> Path:
    """Where the converted warehouse goes by default: the folder ``warehouse`` beside the old file."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(source)))).parent / "warehouse"


def migrate(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    batch_rows: int = BATCH_ROWS,
) -> MigrationReport:
    """Copy every table of the old file into a new warehouse at ``target``, then compare both sides.

    ``target`` defaults to `default_target`; it may be a URL (``s3://bucket/prefix``, with fsspec
    ``storage_options``). A target that already holds a warehouse is refused, so nothing is mixed.
    """
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(source))))
    source_version(path)
    root = os.fspath(target) if target is not None else str(default_target(path))
    files = TableFiles.open(root, storage_options)
    if files.exists(f"{files.path}/catalog/layout.json"):
        raise DataError(
            f"{files.root} already holds a warehouse; migrate into a new place (--to), or compare the two with --check."
        )
    if not files.is_local:
        # An object store has no rename: the layout record goes last, so until then the pipeline refuses the
        # prefix (Warehouse refuses files without a layout) and a re-run rewrites the same deterministic names.
        _copy_all(path, root, storage_options, batch_rows)
        return compare(path, root, storage_options)
    if os.path.isdir(files.path) and os.listdir(files.path):
        raise DataError(f"{files.root} is not empty; migrate into a new or empty folder (--to), nothing was written.")
    # Written in a hidden folder beside the target and renamed onto it in one step: an interrupted
    # migrate leaves no target at all (the pipeline refuses to start beside the old file), and the
    # next migrate starts over in a fresh staging folder.
    staging = os.path.join(os.path.dirname(files.path), f".{os.path.basename(files.path)}{STAGING_SUFFIX}")
    shutil.rmtree(staging, ignore_errors=True)
    _copy_all(path, staging, None, batch_rows)
    os.rename(staging, files.path)
    fsync_dir(os.path.dirname(files.path))
    return compare(path, root, storage_options)


def _copy_all(path: Path, root: str, storage_options: dict[str, Any] | None, batch_rows: int) -> None:
    """Every table of the old file into the warehouse at ``root``; its layout record is written last."""
    old = duckdb.connect(str(path), read_only=True)
    try:
        with Warehouse(root, storage_options=storage_options, publish_layout=False) as wh:
            _copy_catalog(old, wh)
            _copy_tasks(old, wh, batch_rows)
            _copy_pool(old, wh)
            _copy_trajectories(old, wh, batch_rows)
            _copy_small(old, wh, "signals", ["signal_id", "kind", "trajectory_id", "task_id", "evidence::VARCHAR"])
            candidate_columns = ["task_id", "signal_key", "signal_id", "origin", "accepted", "reason", "task::VARCHAR"]
            _copy_small(old, wh, "candidates", candidate_columns)
            _copy_evaluations(old, wh)
            wh.publish_layout()
    finally:
        old.close()


# -- copying ---------------------------------------------------------------------------------------


def _rows(con: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    relation = con.execute(query, list(params))
    names = [d[0] for d in relation.description]
    return [dict(zip(names, row, strict=True)) for row in relation.fetchall()]


def _table(con: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> pa.Table:
    return con.sql(query, params=list(params) or None).to_arrow_table()


def _stamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(sep=" ")


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _batches(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), max(1, size)):
        yield items[start : start + size]


def _copy_catalog(old: duckdb.DuckDBPyConnection, wh: Warehouse) -> None:
    catalog = wh.catalog
    for r in _rows(old, "SELECT run_id, created_at, config::VARCHAR AS config FROM runs ORDER BY run_id"):
        catalog.put(
            catalog.run_path(r["run_id"]),
            {"run_id": r["run_id"], "created_at": _stamp(r["created_at"]), "config": _json(r["config"])},
        )
    query = (
        "SELECT run_id, round, status, summary::VARCHAR AS summary, flow_run_id, started_at, finished_at "
        "FROM rounds ORDER BY run_id, round"
    )
    for r in _rows(old, query):
        catalog.put(
            catalog.round_path(r["run_id"], r["round"]),
            {"run_id": r["run_id"], "round": r["round"], "status": r["status"], "summary": _json(r["summary"]),
             "flow_run_id": r["flow_run_id"], "started_at": _stamp(r["started_at"]),
             "finished_at": _stamp(r["finished_at"])},
        )  # fmt: skip
    query = "SELECT run_id, round, stage, finished_at, output::VARCHAR AS output FROM stage_runs ORDER BY ALL"
    for r in _rows(old, query):
        catalog.put(
            catalog.stage_path(r["run_id"], r["round"], r["stage"]),
            {"run_id": r["run_id"], "round": r["round"], "stage": r["stage"], "finished_at": _stamp(r["finished_at"]),
             "output": _json(r["output"])},
        )  # fmt: skip


def _select(table: str, exclude: tuple[str, ...] = ()) -> str:
    """The old table's columns that the new files hold, in the new schema's order."""
    return ", ".join(
        f'"{f.name}"::VARCHAR AS "{f.name}"' if f.name in ("task", "evidence") else f'"{f.name}"'
        for f in SCHEMAS[table]
        if f.name not in exclude
    )


def _copy_tasks(old: duckdb.DuckDBPyConnection, wh: Warehouse, batch_rows: int) -> None:
    ids = [r[0] for r in old.execute("SELECT task_id FROM tasks ORDER BY task_id").fetchall()]
    for chunk in _batches(ids, batch_rows):
        old.register("_chunk", pa.table({"task_id": pa.array(chunk, pa.string())}))
        try:
            table = _table(
                old,
                f"SELECT {_select('tasks')} FROM tasks WHERE task_id IN (SELECT task_id FROM _chunk) ORDER BY task_id",
            )
        finally:
            old.unregister("_chunk")
        wh.files.write(f"{wh.files.table_dir('tasks')}/{part_name(chunk)}.parquet", table.cast(SCHEMAS["tasks"]))


def _partitions(old: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, int]]:
    return [
        (r[0], int(r[1])) for r in old.execute(f"SELECT DISTINCT run_id, round FROM {table} ORDER BY ALL").fetchall()
    ]


def _copy_pool(old: duckdb.DuckDBPyConnection, wh: Warehouse) -> None:
    for run_id, round_ in _partitions(old, "pool_membership"):
        table = _table(
            old,
            "SELECT position, task_id FROM pool_membership WHERE run_id = ? AND round = ? ORDER BY position, task_id",
            [run_id, round_],
        )
        target = f"{wh.files.partition_dir('pool_membership', run_id, round_)}/members.parquet"
        wh.files.write(target, table.cast(SCHEMAS["pool_membership"]))


def typed_calls(text: str | None) -> list[dict[str, Any]]:
    """The old JSON text of a step's tool calls as the typed column holds them: each argument as its JSON literal."""
    calls = json.loads(text) if text else []
    return [
        {"name": c["name"],
         "arguments": [(k, json.dumps(v, default=str)) for k, v in (c.get("arguments") or {}).items()]}
        for c in calls
    ]  # fmt: skip


def _copy_trajectories(old: duckdb.DuckDBPyConnection, wh: Warehouse, batch_rows: int) -> None:
    """Trajectories and their steps, one pair of files (same name) per batch of a partition."""
    step_columns = [f.name for f in SCHEMAS["steps"]]
    for run_id, round_ in _partitions(old, "trajectories"):
        ids = [
            r[0]
            for r in old.execute(
                "SELECT trajectory_id FROM trajectories WHERE run_id = ? AND round = ? ORDER BY trajectory_id",
                [run_id, round_],
            ).fetchall()
        ]
        for chunk in _batches(ids, batch_rows):
            old.register("_chunk", pa.table({"trajectory_id": pa.array(chunk, pa.string())}))
            try:
                heads = _table(
                    old,
                    f"SELECT {_select('trajectories', exclude=('later_segments',))} FROM trajectories "
                    "WHERE trajectory_id IN (SELECT trajectory_id FROM _chunk) ORDER BY trajectory_id",
                )
                steps = _table(
                    old,
                    f"SELECT {', '.join(c if c != 'calls' else 'calls::VARCHAR AS calls' for c in step_columns)} "
                    "FROM steps WHERE trajectory_id IN (SELECT trajectory_id FROM _chunk) "
                    "ORDER BY trajectory_id, step_index",
                )
            finally:
                old.unregister("_chunk")
            calls = pa.array([typed_calls(t) for t in steps.column("calls").to_pylist()], pa.list_(CALL_TYPE))
            steps = steps.set_column(steps.schema.get_field_index("calls"), "calls", calls)
            # As Warehouse.write_trajectories writes a batch: tool-call counts and steps, then the trajectories.
            # The single-file layout stored one segment per episode (conform adds the empty later_segments).
            wh.write_batch(
                run_id, round_, conform("trajectories", heads), steps.cast(SCHEMAS["steps"]), part_name(chunk)
            )


def _copy_small(old: duckdb.DuckDBPyConnection, wh: Warehouse, table: str, columns: list[str]) -> None:
    """A small table as one ``rows.parquet`` per partition, the file `Warehouse` merges its writes into."""
    for run_id, round_ in _partitions(old, table):
        rows = _table(
            old,
            f"SELECT {', '.join(columns)} FROM {table} WHERE run_id = ? AND round = ? ORDER BY ALL",
            [run_id, round_],
        )
        rows = rows.rename_columns([f.name for f in SCHEMAS[table]])
        wh.files.write(f"{wh.files.partition_dir(table, run_id, round_)}/rows.parquet", rows.cast(SCHEMAS[table]))


def _copy_evaluations(old: duckdb.DuckDBPyConnection, wh: Warehouse) -> None:
    """Evaluations as one ``split-<split>.parquet`` per split of a partition, as `write_evaluations` keeps them."""
    for run_id, round_ in _partitions(old, "evaluations"):
        splits = [
            r[0]
            for r in old.execute(
                "SELECT DISTINCT split FROM evaluations WHERE run_id = ? AND round = ? ORDER BY split", [run_id, round_]
            ).fetchall()
        ]
        for split in splits:
            rows = _table(
                old,
                f"SELECT {_select('evaluations')} FROM evaluations WHERE run_id = ? AND round = ? AND split = ? "
                "ORDER BY task_id",
                [run_id, round_, split],
            )
            target = f"{wh.files.partition_dir('evaluations', run_id, round_)}/split-{split}.parquet"
            wh.files.write(target, rows.cast(SCHEMAS["evaluations"]))
