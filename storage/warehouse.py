"""The trajectory warehouse: every record the pipeline produces, as open table files, and SQL to read them.

Where rows live (storage/README.md has the layout and why):

- trajectories, steps, signals, candidates, evaluations and pool membership: Parquet files under
  ``<root>/tables/``, hive-partitioned by run and round (`storage.tables`); tasks, content-addressed
  and shared by runs, under ``<root>/tables/tasks/``;
- runs, rounds and finished stages: one JSON record each under ``<root>/catalog/`` (`storage.catalog`).

``root`` is a folder (default ``<state_dir>/warehouse``) or ``s3://bucket/prefix`` through fsspec.
Nothing holds a lock: every file and record is written whole in one atomic step, so any number of
readers (``coevolve sql``, the DuckDB CLI, Polars, Spark) read while stages write, and several
processes write disjoint shards of one round at once. DuckDB stays the engine: `connect` opens an
in-memory DuckDB session whose views (storage/VIEWS.md) scan the files again on every query, so a
session held open sees rows written after it opened.

Re-running a stage replaces its rows: bulk rows (trajectories, steps) go to files named after the
episodes they hold; the small tables (pool, signals, candidates, evaluations) keep one file per
partition that a write merges into by key.

Every multi-file write ends with one record, written last, that readers and resume trust: a batch's
trajectories file (its steps and counts are rows only once it exists), a stage's record, a round's
``finished`` record, a migrated layout (storage/README.md, "Commit points").
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path
from typing import Any

from coevolve.errors import DataError
from coevolve.stages import CLEARING_ORDER
from storage.catalog import Catalog, record_time
from storage.columns import SCHEMAS
from storage.layouts import LATEST_VERSION
from storage.round_records import RoundRecords
from storage.small_tables import SmallTables
from storage.tables import PLACEHOLDER_RUN, TableFiles
from storage.task_stats import TaskStats
from storage.trajectory_rows import TrajectoryRows
from storage.views import CATALOG_COLUMNS

# The file the single-file layout kept beside today's warehouse folder (``<state_dir>/warehouse.duckdb``).
SINGLE_FILE_NAME = "warehouse.duckdb"

# The stages a round may clear, in round order; clear_round drops a stage and every stage after it.
STAGES: tuple[str, ...] = CLEARING_ORDER

# Rows a stage writes for its own round, deleted when that stage is cleared for a re-run.
_STAGE_TABLES: dict[str, tuple[str, ...]] = {
    "rollout": ("trajectories", "steps", "tool_call_counts"),
    "mine": ("signals",),
    "synthesize": ("candidates",),
    "evaluate": ("evaluations",),
}


class Warehouse(RoundRecords, TrajectoryRows, SmallTables, TaskStats):
    """The warehouse under one root: table files, bookkeeping records, and DuckDB views over them.

    Its parts, by concern: `storage.views` (sessions, views, partition reads), `storage.round_records`
    (runs, rounds, stages), `storage.trajectory_rows` (trajectories and steps), `storage.small_tables`
    (signals, candidates, evaluations, pools, tasks). This class opens the root and checks its layout.
    """

    def __init__(
        self,
        root: Path | str,
        read_only: bool = False,
        storage_options: dict[str, Any] | None = None,
        publish_layout: bool = True,
    ) -> None:
        """Open the warehouse at ``root``, creating a new one where nothing is yet.

        A root that holds anything but a new warehouse's own files and no layout record (an interrupted
        migration, another program's files), and a new root beside an unconverted single-file
        ``warehouse.duckdb``, are refused: a run never silently starts again from round 0.
        ``publish_layout=False`` (storage/single_file_conversion.py) opens a root without a layout record and
        without writing one: its writer fills the tables first and calls `publish_layout` last.
        """
        self.files = TableFiles.open(root, storage_options)
        self.root = self.files.root
        self.read_only = read_only
        self.catalog = Catalog(self.files)
        self._closed = False
        self._refuse_file(root)
        layout = self._layout()
        if layout is None:
            if read_only:
                raise self._not_a_warehouse(
                    self.root, "it holds no catalog/layout.json, which a warehouse has from its start"
                )
            if publish_layout:
                self._refuse_unmigrated()
                self._refuse_foreign_files()
                self._create()
        else:
            self._check_version(int(layout.get("version", 0)))
            if not read_only:
                self._write_missing_empty_files()

    # -- layout ----------------------------------------------------------------------------------

    def _layout(self) -> dict[str, Any] | None:
        path = self.catalog.layout_path()
        try:
            layout = self.catalog.get(path)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self._damaged_layout(path) from exc
        except NotADirectoryError as exc:
            if self.read_only:  # a reader names a path inside a file: nothing here is a warehouse to repair
                raise self._not_a_warehouse(self.root, "a file stands where its folders would be") from exc
            raise self._damaged_file(root=self.root) from exc
        if layout is not None and not (isinstance(layout, dict) and isinstance(layout.get("version"), int)):
            raise self._damaged_layout(path)
        return layout

    def _damaged_layout(self, path: str) -> DataError:
        return DataError(
            f"Warehouse {self.root} is damaged: {self.files.url(path)} is not the layout record this code writes "
            f'(a JSON object with an integer "version"). Restore it from a backup, or move it aside (mv {path} '
            f'{path}.damaged) and write {{"version": {LATEST_VERSION}}} in its place if the warehouse was written '
            "by this code; the table files under tables/ and the other records under catalog/ are untouched."
        )

    def _refuse_file(self, root: Path | str) -> None:
        text = os.fspath(root)
        if "://" in text or not os.path.isfile(text):
            return
        if _is_single_file_warehouse(text):
            raise DataError(
                f"{text} is a warehouse file of the single-file layout; convert it once with "
                f"`coevolve warehouse migrate {text}` "
                "(it writes the open-table layout beside it and compares every row)."
            )
        raise self._damaged_file(text)

    @classmethod
    def for_queries(cls, root: Path | str, storage_options: dict[str, Any] | None = None) -> Warehouse:
        """The warehouse at ``root`` opened read-only for ad-hoc queries (`coevolve sql`).

        A path that is not a warehouse folder (any other file, a folder without a layout record) is refused
        as such: a reader that names the wrong path gets no advice to move it. A single-file warehouse
        (``warehouse.duckdb``) names its conversion; a warehouse folder whose records are damaged says how to
        recover, as for every reader.
        """
        text = os.fspath(root)
        if "://" not in text and os.path.isfile(text) and not _is_single_file_warehouse(text):
            raise cls._not_a_warehouse(text, "it is a file")
        return cls(root, read_only=True, storage_options=storage_options)

    @staticmethod
    def made_at(root: Path | str, storage_options: dict[str, Any] | None = None) -> bool:
        """Whether a warehouse has been made at ``root`` (its layout record exists); a new run's has not yet."""
        files = TableFiles.open(root, storage_options)
        return files.exists(Catalog(files).layout_path())

    @staticmethod
    def _not_a_warehouse(root: str, why: str) -> DataError:
        return DataError(
            f"{root} is not a warehouse folder ({why}); a run's warehouse is <state_dir>/warehouse, or warehouse.uri."
        )

    def _damaged_file(self, root: str) -> DataError:
        return DataError(
            f"Warehouse {root} is damaged: it is a file, not a warehouse folder this code can read. Restore it from a "
            f"backup, or move it aside (mv {root} {root}.damaged) to start a new warehouse, in which the run starts "
            "again from round 0. Pool snapshots, checkpoints and the MLflow store are separate files and are untouched."
        )

    def _refuse_unmigrated(self) -> None:
        """A new warehouse beside the single-file one it replaces would restart the run from round 0."""
        if not self.files.is_local:
            return
        old = os.path.join(os.path.dirname(self.files.path), SINGLE_FILE_NAME)
        if os.path.isfile(old):
            raise DataError(
                f"{old} is a warehouse of the single-file layout and {self.root} holds no warehouse yet; convert it "
                f"once with `coevolve warehouse migrate {old}` (it writes {self.root} and compares every row). "
                "Starting a new warehouse here would restart the run from round 0 and overwrite its pool snapshots and "
                f"checkpoints; to really start anew, move {old} aside first."
            )

    def _refuse_foreign_files(self) -> None:
        """Only a new warehouse's own files (placeholders, partial files) may be in a root without a layout."""
        try:
            found = [p for p in self.files.fs.find(self.files.path) if not p.endswith(".partial")]
        except FileNotFoundError:
            return
        placeholders = (f"{PLACEHOLDER_RUN}.parquet", f"{PLACEHOLDER_RUN}.json", "0.json")
        foreign = [
            p
            for p in found
            if posixpath.basename(p) not in placeholders or ("/run_id=" in p and f"/run_id={PLACEHOLDER_RUN}/" not in p)
        ]
        if foreign:
            raise DataError(
                f"{self.root} holds {len(foreign)} file(s) (e.g. {self.files.url(foreign[0])}) but no layout record "
                f"({self.files.url(self.catalog.layout_path())}): it is not a warehouse this code wrote, or a "
                "`coevolve warehouse migrate` into it was interrupted. Run that migrate again (it starts over), or "
                "point warehouse.uri / state_dir at an empty place; nothing here was changed."
            )

    def _create(self) -> None:
        for table, schema in SCHEMAS.items():
            target = self._empty_file(table)
            if not self.files.exists(target):
                self.files.write(target, schema.empty_table())
        for kind in CATALOG_COLUMNS:
            self.catalog.put_placeholder(kind)
        self.catalog.put(self.catalog.layout_path(), {"version": LATEST_VERSION, "created_at": record_time()})

    def _write_missing_empty_files(self) -> None:
        # A table added within the layout version (storage/columns.py) has no empty file in a warehouse
        # made before it, and a damaged one moved aside as its error says leaves none either: writing it now lets
        # every view match before the table's first row.
        for table in SCHEMAS:
            target = self._empty_file(table)
            if not self.files.exists(target):
                self.files.write(target, SCHEMAS[table].empty_table())

    def publish_layout(self) -> None:
        """Write the placeholders and, last, the layout record: from then on the root opens as a warehouse."""
        self._writable()
        self._create()

    def _check_version(self, version: int) -> None:
        if version > LATEST_VERSION:
            raise DataError(
                f"Warehouse {self.root} has layout version {version}, but this code knows versions up to "
                f"{LATEST_VERSION}; upgrade the code (or use a new warehouse) before opening it."
            )
        if version < LATEST_VERSION:
            raise DataError(
                f"Warehouse {self.root} has layout version {version}, older than {LATEST_VERSION}; "
                f"convert it with `coevolve warehouse migrate {self.root}`."
            )

    def schema_version(self) -> int:
        layout = self._layout() or {}
        return int(layout.get("version", 0))

    def close(self) -> None:
        """Marks the warehouse closed; nothing is held open between calls."""
        self._closed = True

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- re-running a stage ----------------------------------------------------------------------

    def clear_round(self, run_id: str, round: int, from_stage: str) -> None:
        """Forgets from_stage and every later stage of a round, with the rows those stages wrote."""
        self._writable()
        if from_stage not in STAGES:
            raise DataError(f"Unknown stage {from_stage!r}; stages are {', '.join(STAGES)}.")
        dropped = STAGES[STAGES.index(from_stage) :]
        # Stage marks go first, last stage first: an interruption never leaves a stage marked
        # finished without its rows.
        for stage in reversed(dropped):
            for path in self.catalog.stage_paths(run_id, round, stage):
                self.catalog.remove(path)
        for stage in dropped:
            for table in _STAGE_TABLES.get(stage, ()):
                self.files.delete(self.files.files(table, run_id, round))


def _is_single_file_warehouse(path: str) -> bool:
    """A DuckDB database file, as the single-file layout's ``warehouse.duckdb`` is (its header names DuckDB)."""
    try:
        with open(path, "rb") as handle:
            return b"DUCK" in handle.read(16)
    except OSError:  # a file this process cannot read is no warehouse it could open either
        return False
