"""Compare a single-file warehouse (``warehouse.duckdb``) with the open-table warehouse converted from it.

`compare` runs in one DuckDB session on both sides: the old file attached read-only, the new layout
through the views `Warehouse.connect` defines. Each table is reduced to a canonical projection (the
same columns on both sides, JSON texts with sorted keys, tool calls as name and JSON literal of each
argument), and its digest is the MD5 of the sorted MD5s of its rows, so row order and file
boundaries do not matter but every value does. ``coevolve warehouse migrate --check`` prints it;
the conversion (storage/single_file_conversion.py) ends with it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from coevolve.errors import DataError
from storage.single_file_schema import SINGLE_FILE_VERSION
from storage.warehouse import Warehouse

# Tables in the order they are copied and compared: catalog records first, then table files.
TABLES: tuple[str, ...] = (
    "runs", "rounds", "stage_runs", "tasks", "pool_membership", "trajectories", "steps", "signals", "candidates",
    "evaluations",
)  # fmt: skip


@dataclass(frozen=True)
class TableCheck:
    """Row count and content digest of one table on both sides."""

    table: str
    old_rows: int
    new_rows: int
    old_digest: str
    new_digest: str

    @property
    def ok(self) -> bool:
        return self.old_rows == self.new_rows and self.old_digest == self.new_digest


@dataclass(frozen=True)
class MigrationReport:
    source: str
    target: str
    checks: list[TableCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def mismatched(self) -> list[str]:
        return [c.table for c in self.checks if not c.ok]

    def format(self) -> str:
        """The comparison as a table, one line per table."""
        header = f"{'table':<16} {'old rows':>10} {'new rows':>10}  {'old digest':<16}  {'new digest':<16}  result"
        lines = [header]
        for c in self.checks:
            lines.append(
                f"{c.table:<16} {c.old_rows:>10} {c.new_rows:>10}  {c.old_digest[:16]:<16}  {c.new_digest[:16]:<16}  "
                f"{'ok' if c.ok else 'DIFFERS'}"
            )
        return "\n".join(lines)


def source_version(source: str | os.PathLike[str]) -> int:
    """The layout version of a single-file warehouse; DataError when the file is not one this code converts."""
    path = Path(os.path.expanduser(os.fspath(source)))
    if not path.is_file():
        raise DataError(f"No single-file warehouse at {path}; pass the path of the old warehouse.duckdb.")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise DataError(f"{path} cannot be opened as a DuckDB database ({_one_line(exc)}).") from exc
    try:
        found = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
        ).fetchone()
        if not found or not found[0]:
            raise DataError(f"{path} is a DuckDB file without a schema_version table: not a CoEvolve warehouse.")
        row = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    finally:
        con.close()
    version = int(row[0]) if row else 0
    if not 1 <= version <= SINGLE_FILE_VERSION:
        raise DataError(
            f"{path} has single-file schema version {version}; this code converts versions 1 to {SINGLE_FILE_VERSION}."
        )
    return version


def _one_line(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


_CALLS_NEW = (
    "list_transform(calls, lambda c: struct_pack(name := c.name, args := list_sort(list_transform("
    "coalesce(map_entries(c.arguments), []), lambda e: struct_pack(k := e.key, v := json(e.value)::VARCHAR)))))"
)
_CALLS_OLD = (
    "list_transform(CAST(calls AS JSON[]), lambda c: struct_pack(name := c->>'$.name', "
    "args := list_sort(list_transform("
    "coalesce(map_entries(CAST(c->'$.arguments' AS MAP(VARCHAR, JSON))), []), "
    "lambda e: struct_pack(k := e.key, v := json(e.value)::VARCHAR)))))"
)

# Per table: the canonical columns (the same expressions on both sides unless the old side needs its own).
_CANONICAL: dict[str, list[str]] = {
    "runs": ["run_id", "created_at::VARCHAR", "canonical_json(config::VARCHAR)"],
    "rounds": ["run_id", "round", "status", "canonical_json(summary::VARCHAR)", "flow_run_id", "started_at::VARCHAR",
               "finished_at::VARCHAR"],
    "stage_runs": ["run_id", "round", "stage", "finished_at::VARCHAR", "canonical_json(output::VARCHAR)"],
    "tasks": ["task_id", "environment", "origin", "round", "parent_trajectory_id", "signal_id", "content_hash",
              "canonical_json(task::VARCHAR)", "tools"],
    "pool_membership": ["run_id", "round", "position", "task_id"],
    "trajectories": ["trajectory_id", "run_id", "round", "task_id", "sample", "reward", "success", "finish_reason",
                     "num_steps", "tool_sequence", "prompt_ids", "completion_ids", "completion_mask", "logprobs",
                     "duration_s"],
    "steps": ["run_id", "round", "trajectory_id", "step_index", "step_number", "turn", "model_text", "{calls}",
              "tool_names", "observations", "error", "completion_tokens"],
    "signals": ["run_id", "round", "signal_id", "kind", "trajectory_id", "task_id",
                "canonical_json(evidence::VARCHAR)"],
    "candidates": ["run_id", "round", "task_id", "signal_key", "signal_id", "origin", "accepted", "reason",
                   "canonical_json(task::VARCHAR)"],
    "evaluations": ["run_id", "round", "split", "task_id", "success", "reward", "trajectory_id"],
}  # fmt: skip


def canonical_json(text: str) -> str:
    """A JSON text with sorted keys and fixed separators; text that is not JSON is compared as it is."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return text


def _digest_sql(table: str, source: str, calls: str) -> str:
    columns = ", ".join(f"c{i} := {expr.format(calls=calls)}" for i, expr in enumerate(_CANONICAL[table]))
    return (
        f"WITH h AS (SELECT md5(CAST(struct_pack({columns}) AS VARCHAR)) AS h FROM {source}) "
        "SELECT count(*), coalesce(md5(string_agg(h, ',' ORDER BY h)), md5('')) FROM h"
    )


def compare(
    source: str | os.PathLike[str], target: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> MigrationReport:
    """Row counts and content digests of every table in the old file and in the warehouse at ``target``."""
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(source))))
    source_version(path)
    root = os.fspath(target)
    checks: list[TableCheck] = []
    with Warehouse(root, read_only=True, storage_options=storage_options) as wh:
        con = wh.connect()
        try:
            con.create_function("canonical_json", canonical_json, ["VARCHAR"], "VARCHAR")
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS old (READ_ONLY)")
            for table in TABLES:
                old_source = f"old.main.{table}"
                if table == "steps":
                    # The old steps table has no run_id or round: they come from the step's trajectory.
                    old_source = (
                        "(SELECT s.*, t.run_id, t.round FROM old.main.steps s "
                        "LEFT JOIN old.main.trajectories t USING (trajectory_id))"
                    )
                old = con.execute(_digest_sql(table, old_source, _CALLS_OLD)).fetchone()
                new = con.execute(_digest_sql(table, table, _CALLS_NEW)).fetchone()
                assert old is not None and new is not None  # an aggregate without GROUP BY returns one row
                (old_rows, old_digest), (new_rows, new_digest) = old, new
                checks.append(TableCheck(table, int(old_rows), int(new_rows), old_digest, new_digest))
            con.execute("DETACH old")
        finally:
            con.close()
    return MigrationReport(source=str(path), target=wh.root, checks=checks)
