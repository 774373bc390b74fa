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

import hashlib
import json
import os
import posixpath
import re
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from coevolve.errors import DataError
from coevolve.records import Candidate, RoundSummary, Segment, Signal, Step, Task, Trajectory
from coevolve.stages import CLEARING_ORDER
from storage.catalog import PLACEHOLDER_RUN, Catalog
from storage.columns import SCHEMAS, conform, read_calls, tool_call_counts, trajectory_tables
from storage.migrations import LATEST_VERSION, VIEWS
from storage.tables import STALE_PARTIAL_S, TableFiles

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

PARTITIONED = tuple(t for t in SCHEMAS if t != "tasks")
# The files of a trajectory batch besides its trajectories file, which write_batch writes last.
_BATCH_PARTS: tuple[str, ...] = ("steps", "tool_call_counts")
# Keys a write to a small table merges by: a row written again replaces the stored one.
_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "signals": ("signal_id",),
    "candidates": ("task_id", "signal_key"),
    "evaluations": ("split", "task_id"),
}
# Columns of the bookkeeping records (storage/catalog.py) as their views show them.
CATALOG_COLUMNS: dict[str, dict[str, str]] = {
    "runs": {"run_id": "VARCHAR", "created_at": "TIMESTAMP", "config": "JSON"},
    "rounds": {"run_id": "VARCHAR", "round": "INTEGER", "status": "VARCHAR", "summary": "JSON", "flow_run_id": "VARCHAR",
               "started_at": "TIMESTAMP", "finished_at": "TIMESTAMP"},
    "stage_runs": {"run_id": "VARCHAR", "round": "INTEGER", "stage": "VARCHAR", "finished_at": "TIMESTAMP", "output": "JSON"},
}  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(sep=" ")


def part_name(keys: Iterable[str]) -> str:
    """A file name that depends only on which rows a file holds, so re-writing them replaces it."""
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:20]
    return f"part-{digest}"


class Warehouse:
    """The warehouse under one root: table files, bookkeeping records, and DuckDB views over them."""

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
        ``publish_layout=False`` (storage/migrate.py) opens a root without a layout record and
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
                raise DataError(f"Warehouse {self.root} does not exist; run a round (or open it read-write) first.")
            if publish_layout:
                self._refuse_unmigrated()
                self._refuse_foreign_files()
                self._create()
        else:
            self._check_version(int(layout.get("version", 0)))

    # -- layout ----------------------------------------------------------------------------------

    def _layout(self) -> dict[str, Any] | None:
        path = self.catalog.layout_path()
        try:
            layout = self.catalog.get(path)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self._damaged_layout(path) from exc
        except NotADirectoryError as exc:
            raise self._damaged_file(root=self.root) from exc
        if layout is not None and not (isinstance(layout, dict) and isinstance(layout.get("version"), int)):
            raise self._damaged_layout(path)
        return layout

    def _damaged_layout(self, path: str) -> DataError:
        return DataError(
            f"Warehouse {self.root} is damaged: {self.files.url(path)} is not the layout record this code writes "
            f'(a JSON object with an integer "version"). Restore it from a backup, or move it aside (mv {path} '
            f"{path}.damaged) and write {{\"version\": {LATEST_VERSION}}} in its place if the warehouse was written "
            "by this code; the table files under tables/ and the other records under catalog/ are untouched."
        )

    def _refuse_file(self, root: Path | str) -> None:
        text = os.fspath(root)
        if "://" in text or not os.path.isfile(text):
            return
        with open(text, "rb") as handle:
            head = handle.read(16)
        if b"DUCK" in head:
            raise DataError(
                f"{text} is a warehouse file of the single-file layout; convert it once with "
                f"`coevolve warehouse migrate {text}` (it writes the open-table layout beside it and compares every row)."
            )
        raise self._damaged_file(text)

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
                f"once with `coevolve warehouse migrate {old}` (it writes {self.root} and compares every row). Starting "
                "a new warehouse here would restart the run from round 0 and overwrite its pool snapshots and "
                f"checkpoints; to really start anew, move {old} aside first."
            )

    def _refuse_foreign_files(self) -> None:
        """Only a new warehouse's own files (placeholders, partial files) may be in a root without a layout."""
        try:
            found = [p for p in self.files.fs.find(self.files.path) if not p.endswith(".partial")]
        except FileNotFoundError:
            return
        foreign = [p for p in found if posixpath.basename(p) not in (f"{PLACEHOLDER_RUN}.parquet", f"{PLACEHOLDER_RUN}.json", "0.json")
                   or "/run_id=" in p and f"/run_id={PLACEHOLDER_RUN}/" not in p]  # fmt: skip
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
        self.catalog.put(self.catalog.layout_path(), {"version": LATEST_VERSION, "created_at": _now()})

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

    def _writable(self) -> None:
        if self._closed:
            raise DataError(f"Warehouse {self.root} is closed.")
        if self.read_only:
            raise DataError(f"Warehouse {self.root} was opened read-only; it cannot be written.")

    # -- sessions --------------------------------------------------------------------------------

    def glob(self, table: str) -> str:
        """The file pattern of a table as DuckDB reads it."""
        if table == "tasks":
            return self.files.url(f"{self.files.table_dir(table)}/*.parquet")
        return self.files.url(f"{self.files.table_dir(table)}/*/*/*.parquet")

    def scan(self, table: str) -> str:
        """The SQL that reads a table's files (what its view is defined as)."""
        pattern = self.glob(table).replace("'", "''")
        # The table's empty file comes first: DuckDB takes the columns from it, so defining the view
        # reads one small file, not every file's footer, and a damaged file fails only the queries
        # that read it. Every file of a layout version has the same columns (SCHEMAS), except a column
        # added within the version (columns.conform): files written before it lack it, and DuckDB ignores
        # it in later files when the empty file (written with the warehouse) lacks it too.
        empty = self.files.url(self._empty_file(table)).replace("'", "''")
        if table == "tasks":
            # Tasks are content-addressed: the same id always holds the same task, so keep one row of each.
            return (
                f"SELECT * FROM read_parquet(['{empty}', '{pattern}']) "
                "QUALIFY row_number() OVER (PARTITION BY task_id) = 1"
            )
        if table in _BATCH_PARTS:
            # A batch's trajectories file is its commit record (write_batch writes it last): steps and
            # counts of a batch without one (a writer killed, or still writing, between the files) are not rows yet.
            heads = self.glob("trajectories").replace("'", "''")
            return (
                f"SELECT * EXCLUDE (filename) FROM read_parquet(['{empty}', '{pattern}'], hive_partitioning = true, "
                f"hive_types = {{'run_id': VARCHAR, 'round': INTEGER}}, filename = true) WHERE run_id <> '{PLACEHOLDER_RUN}' "
                f"AND regexp_extract(filename, '[^/]+/[^/]+/[^/]+$') IN "
                f"(SELECT regexp_extract(file, '[^/]+/[^/]+/[^/]+$') FROM glob('{heads}'))"
            )
        return (
            f"SELECT * FROM read_parquet(['{empty}', '{pattern}'], hive_partitioning = true, "
            f"hive_types = {{'run_id': VARCHAR, 'round': INTEGER}}) WHERE run_id <> '{PLACEHOLDER_RUN}'"
        )

    def _empty_file(self, table: str) -> str:
        """The empty file every table holds from the start (partition run_id=_empty/round=0): the views
        take the table's columns from it and match it before the first row is written."""
        if table == "tasks":
            return f"{self.files.table_dir(table)}/{PLACEHOLDER_RUN}.parquet"
        return f"{self.files.partition_dir(table, PLACEHOLDER_RUN, 0)}/{PLACEHOLDER_RUN}.parquet"

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB session with a view per table and the analysis views (storage/VIEWS.md).

        The views re-read the files on every query: a session kept open sees later writes. Close it
        when done; it holds no lock on anything.
        """
        if self._closed:
            raise DataError(f"Warehouse {self.root} is closed.")
        con = duckdb.connect()
        if not self.files.is_local:
            con.register_filesystem(self.files.fs)
        for table in SCHEMAS:
            con.execute(f"CREATE VIEW {table} AS {self.scan(table)}")
        for kind in ("runs", "rounds", "stage_runs"):
            con.execute(f"CREATE VIEW {kind} AS {self._catalog_scan(kind)}")
        con.execute(VIEWS)
        return con

    def _catalog_scan(self, kind: str) -> str:
        columns = CATALOG_COLUMNS[kind]
        pattern = {
            "runs": f"{self.catalog.dir}/runs/*.json",
            "rounds": f"{self.catalog.dir}/rounds/*/*.json",
            "stage_runs": f"{self.catalog.dir}/stage_runs/*/*/*.json",
        }[kind]
        url = self.files.url(pattern).replace("'", "''")
        spec = "{" + ", ".join(f"'{n}': '{t}'" for n, t in columns.items()) + "}"
        # The placeholder record (Catalog.put_placeholder) keeps the glob matching before the first
        # real record, so a session opened on a new warehouse sees the records written later.
        return (
            f"SELECT * FROM read_json('{url}', columns = {spec}, format = 'auto') "
            f"WHERE run_id IS DISTINCT FROM '{PLACEHOLDER_RUN}'"
        )

    def sql(self, query: str) -> pl.DataFrame:
        """Runs an ad-hoc query (e.g. on the v_* views) and returns the result as a Polars frame."""
        con = self.connect()
        try:
            try:
                relation = con.sql(query)
            except duckdb.Error as exc:
                raise self._damaged_table_file(exc, query) or exc
            if relation is None:  # a statement without a result, e.g. SET or PRAGMA
                return pl.DataFrame()
            # Polars cannot import DuckDB's INTERVAL (e.g. a difference of timestamps): show it as text.
            if any(str(t) == "INTERVAL" for t in relation.types):
                relation = relation.project(
                    ", ".join(
                        f'CAST("{c}" AS VARCHAR) AS "{c}"' if str(t) == "INTERVAL" else f'"{c}"'
                        for c, t in zip(relation.columns, relation.types)
                    )
                )
            try:
                return relation.pl()
            except duckdb.Error as exc:
                raise self._damaged_table_file(exc, query) or exc
        finally:
            con.close()

    def _damaged_table_file(self, exc: Exception, query: str) -> DataError | None:
        """The DataError naming the file and the way back when DuckDB failed on a damaged file under tables/.

        None when the query failed for another reason (a typo, a type error).
        """
        if isinstance(exc, (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)):
            return None
        if isinstance(exc, FileNotFoundError):
            return None
        tables = self.files.url(f"{self.files.path}/tables/")
        match = re.search(re.escape(tables) + r"[^'\"\s]*\.parquet", str(exc))
        if match is not None:
            path = match.group(0) if self.files.is_local else match.group(0).split("://", 1)[1]
            return self.files.damaged(path, str(exc))
        # DuckDB does not always name the file (e.g. a damaged page): read the files of the tables the
        # query names (all of them for the analysis views) until one fails.
        words = set(re.findall(r"[a-z_]+", query.lower()))
        named = [t for t in SCHEMAS if t in words]
        for table in named if named and not any(w.startswith("v_") for w in words) else list(SCHEMAS):
            for path in self.files.files(table):
                try:
                    self.files.read(path)
                except DataError as damaged:
                    return damaged
                except FileNotFoundError:
                    continue
        return None

    def _partition(self, table: str, run_id: str, round_: int, columns: list[str] | None = None) -> pa.Table:
        """The rows of one partition of a table, straight from its files."""
        paths = self.files.files(table, run_id, round_)
        if table in _BATCH_PARTS:
            committed = {os.path.basename(p) for p in self.files.files("trajectories", run_id, round_)}
            paths = [p for p in paths if os.path.basename(p) in committed]
        schema = SCHEMAS[table] if columns is None else pa.schema([SCHEMAS[table].field(c) for c in columns])
        tables = []
        for path in paths:
            try:
                tables.append(conform(table, self.files.read(path, columns), schema))
            except FileNotFoundError:  # replaced between the listing and the read
                continue
        return pa.concat_tables(tables) if tables else schema.empty_table()

    # -- bookkeeping -----------------------------------------------------------------------------

    def ensure_run(self, run_id: str, config: dict[str, Any]) -> None:
        """Records the run and its configuration; the creation time of an existing run is kept."""
        self._writable()
        existing = self.catalog.get(self.catalog.run_path(run_id)) or {}
        record = {"run_id": run_id, "created_at": existing.get("created_at", _now()), "config": config}
        self.catalog.put(self.catalog.run_path(run_id), record)

    def start_round(self, run_id: str, round: int, flow_run_id: str, settings: dict[str, Any] | None = None) -> None:
        """Marks a round running, with the settings that decide its results (``settings``).

        A round started before keeps its ``started_at`` and its stage records; one started with other
        ``settings`` is refused, naming the fields, since its recorded stages would mix with the new
        ones. A finished round is left as it is (running it again only reads its records back).
        """
        self._writable()
        path = self.catalog.round_path(run_id, round)
        existing = self.catalog.get(path) or {}
        if existing.get("status") == "finished":
            return
        recorded = existing.get("settings")
        if settings is not None and recorded is not None:
            changed = sorted(k for k in set(settings) | set(recorded) if settings.get(k) != recorded.get(k))
            if changed:
                shown = ", ".join(f"{k}: {recorded.get(k)!r} -> {settings.get(k)!r}" for k in changed[:6])
                raise DataError(
                    f"Round {round} of run {run_id!r} was started with other settings ({shown}); its recorded stages "
                    "would mix with this configuration's. Run it with the settings it was started with, or use a new "
                    f"run_id (or state_dir) for the new settings."
                )
        self.catalog.put(
            path,
            {"run_id": run_id, "round": round, "status": "running", "summary": None, "flow_run_id": flow_run_id,
             "started_at": existing.get("started_at") or _now(), "finished_at": None,
             "settings": settings if settings is not None else recorded},
        )  # fmt: skip

    def finish_round(self, run_id: str, round: int, summary: RoundSummary) -> None:
        """Marks a round finished with its summary; written after the version stage's record."""
        self._writable()
        path = self.catalog.round_path(run_id, round)
        existing = self.catalog.get(path) or {}
        self.catalog.put(
            path,
            {"run_id": run_id, "round": round, "status": "finished", "summary": summary.to_dict(),
             "flow_run_id": summary.flow_run_id or existing.get("flow_run_id"),
             "started_at": existing.get("started_at") or _now(), "finished_at": _now(),
             "settings": existing.get("settings")},
        )  # fmt: skip

    def round_records(self, run_id: str) -> list[dict[str, Any]]:
        """The round records of a run (status, summary, started_at, finished_at), in round order."""
        return sorted(self.catalog.records("rounds", run_id), key=lambda r: r["round"])

    def mark_stage(self, run_id: str, round: int, stage: str, output: dict[str, Any]) -> None:
        """Records that a stage of a round finished, with the output a resumed round reuses."""
        self._writable()
        self.catalog.put(
            self.catalog.stage_path(run_id, round, stage),
            {"run_id": run_id, "round": round, "stage": stage, "finished_at": _now(), "output": output},
        )

    def stage_output(self, run_id: str, round: int, stage: str) -> dict[str, Any] | None:
        """The output recorded by mark_stage, or None when that stage has not finished."""
        record = self.catalog.get(self.catalog.stage_path(run_id, round, stage))
        return None if record is None else record["output"]

    def clear_round(self, run_id: str, round: int, from_stage: str) -> None:
        """Forgets from_stage and every later stage of a round, with the rows those stages wrote."""
        self._writable()
        if from_stage not in STAGES:
            raise DataError(f"Unknown stage {from_stage!r}; stages are {', '.join(STAGES)}.")
        dropped = STAGES[STAGES.index(from_stage):]
        # Stage marks go first, last stage first: an interruption never leaves a stage marked
        # finished without its rows.
        for stage in reversed(dropped):
            self.catalog.remove(self.catalog.stage_path(run_id, round, stage))
        for stage in dropped:
            for table in _STAGE_TABLES.get(stage, ()):
                self.files.delete(self.files.files(table, run_id, round))

    def rounds(self, run_id: str) -> list[RoundSummary]:
        """Summaries of the finished rounds of a run, in round order."""
        records = [r for r in self.catalog.records("rounds", run_id) if r.get("summary") is not None]
        return [RoundSummary(**r["summary"]) for r in sorted(records, key=lambda r: r["round"])]

    def round_status(self, run_id: str, round: int) -> str | None:
        """'running', 'finished', or None when the round was never started."""
        record = self.catalog.get(self.catalog.round_path(run_id, round))
        return None if record is None else record["status"]

    # -- bulk rows: trajectories and steps -------------------------------------------------------

    def write_trajectories(self, trajs: list[Trajectory], name: str | None = None) -> None:
        """Writes trajectories and their steps as one file per table in each (run, round) partition.

        The file name is ``name`` or derived from the trajectory ids, so writing the same episodes
        again replaces their files. Steps are written before trajectories: a reader that sees a
        trajectory also sees its steps.
        """
        self._writable()
        by_partition: dict[tuple[str, int], list[Trajectory]] = {}
        for t in trajs:
            by_partition.setdefault((t.run_id, t.round), []).append(t)
        for (run_id, round_), group in by_partition.items():
            trajectories, steps = trajectory_tables(group)
            self.write_batch(run_id, round_, trajectories, steps, name)

    def write_batch(self, run_id: str, round_: int, trajectories: pa.Table, steps: pa.Table, name: str | None = None) -> None:
        """Write one batch of trajectory and step rows of a partition, with its tool-call counts.

        All three files get one name, ``name`` or one derived from the trajectory ids; the counts and
        the steps are written before the trajectories, which make the batch visible as episodes.
        """
        self._writable()
        file = name or part_name(trajectories.column("trajectory_id").to_pylist())
        for table, rows in (("tool_call_counts", tool_call_counts(steps)), ("steps", steps), ("trajectories", trajectories)):
            self.files.write(f"{self.files.partition_dir(table, run_id, round_)}/{file}.parquet", rows)

    def stored_episodes(self, run_id: str, round_: int) -> set[tuple[str, int]]:
        """(task_id, sample) of the round's stored trajectories: a rollout that resumes plays only the others.

        Steps and counts of a batch without its trajectories file are invisible to every reader (see
        `scan`); they are removed here only once abandoned (older than STALE_PARTIAL_S), since another
        live writer of the round (a stage re-run on another worker) may be about to commit them.
        """
        heads = {os.path.basename(p) for p in self.files.files("trajectories", run_id, round_)}
        orphans = [p for t in _BATCH_PARTS for p in self.files.files(t, run_id, round_) if os.path.basename(p) not in heads]
        if not self.read_only:
            self.files.delete([p for p in orphans if self.files.age_s(p) > STALE_PARTIAL_S])
            for table in ("trajectories", *_BATCH_PARTS):
                self.files.sweep_partials(table)
        stored = self._partition("trajectories", run_id, round_, ["task_id", "sample"])
        return set(zip(stored.column("task_id").to_pylist(), stored.column("sample").to_pylist()))

    def outcomes(self, run_id: str, round_: int) -> dict[str, list[Any]]:
        """task_id, sample, reward, success and finish_reason of the round's stored trajectories (columns)."""
        columns = ["task_id", "sample", "reward", "success", "finish_reason"]
        return self._partition("trajectories", run_id, round_, columns).to_pydict()

    def tool_sequences(self, run_id: str, round_: int) -> dict[str, list[str]]:
        """trajectory_id -> the tools it called, for the round's stored trajectories."""
        table = self._partition("trajectories", run_id, round_, ["trajectory_id", "tool_sequence"])
        return dict(zip(table.column("trajectory_id").to_pylist(), table.column("tool_sequence").to_pylist()))

    def signals(self, run_id: str, round_: int) -> list[Signal]:
        """The signals the mine stage stored for (run, round), in signal id order."""
        rows = self._partition("signals", run_id, round_).to_pylist()
        return [
            Signal(run_id=run_id, round=round_, kind=r["kind"], trajectory_id=r["trajectory_id"], task_id=r["task_id"],
                   evidence=json.loads(r["evidence"]))
            for r in sorted(rows, key=lambda r: r["signal_id"])
        ]  # fmt: skip

    def trajectories(self, run_id: str, round: int) -> list[Trajectory]:
        """Full trajectories of a round, steps included, ordered by task then sample."""
        heads = self._partition("trajectories", run_id, round).to_pylist()
        step_rows = self._partition("steps", run_id, round).to_pylist()
        steps: dict[str, list[tuple[int, Step]]] = {}
        for row in step_rows:
            steps.setdefault(row["trajectory_id"], []).append(
                (row["step_index"],
                 Step(turn=row["turn"], index=row["step_number"], model_text=row["model_text"],
                      calls=read_calls(row["calls"]), observations=list(row["observations"]), error=row["error"],
                      completion_tokens=row["completion_tokens"]))
            )  # fmt: skip
        heads.sort(key=lambda h: (h["task_id"], h["sample"]))
        return [
            Trajectory(run_id=run_id, round=round, task_id=h["task_id"], sample=h["sample"],
                       steps=[s for _, s in sorted(steps.get(h["trajectory_id"], []), key=lambda x: x[0])],
                       prompt_ids=list(h["prompt_ids"]), completion_ids=list(h["completion_ids"]),
                       completion_mask=list(h["completion_mask"]), logprobs=list(h["logprobs"]), reward=h["reward"],
                       success=h["success"], finish_reason=h["finish_reason"], duration_s=h["duration_s"],
                       later_segments=[Segment(**r) for r in h["later_segments"] or []])
            for h in heads
        ]  # fmt: skip

    def _trajectory_files(self, run_id: str, upto_round: int | None) -> list[str]:
        """The run's trajectory files of rounds <= upto_round (all when None), read off their round=R folder."""
        return [
            p for p in self.files.files("trajectories", run_id)
            if upto_round is None or int(p.rsplit("/round=", 1)[1].split("/", 1)[0]) <= upto_round
        ]  # fmt: skip

    def trajectory_frame(self, run_id: str, upto_round: int | None = None) -> pl.DataFrame:
        """Trajectory outcomes of a run (no token data), rounds <= upto_round: what signal mining reads."""
        columns = ["trajectory_id", "task_id", "sample", "reward", "success", "finish_reason", "tool_sequence"]
        if self.files.is_local:
            # A Polars scan of the run's files: about 7x faster here than the same read through a DuckDB view.
            paths = self._trajectory_files(run_id, upto_round)
            if not paths:
                schema = SCHEMAS["trajectories"]
                empty = pl.from_arrow(pa.schema([schema.field(c) for c in columns]).empty_table())
                frame = empty.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(0, pl.Int32).alias("round")).clear()
            else:
                try:
                    frame = pl.scan_parquet(paths, hive_partitioning=True, extra_columns="ignore").select(["run_id", "round", *columns]).collect()
                except (pl.exceptions.PolarsError, OSError) as exc:
                    raise self._damaged_table_file(exc, "trajectories") or DataError(
                        f"Trajectories of run {run_id!r} in {self.root} cannot be read: {exc}"
                    ) from exc
            frame = frame.with_columns(pl.col("round").cast(pl.Int32), pl.col("run_id").cast(pl.String))
        else:
            con = self.connect()
            try:
                frame = con.sql(
                    f"SELECT run_id, round, {', '.join(columns)} FROM trajectories "
                    "WHERE run_id = $run AND ($upto IS NULL OR round <= $upto)",
                    params={"run": run_id, "upto": upto_round},
                ).pl()
            except duckdb.Error as exc:
                raise self._damaged_table_file(exc, "trajectories") or exc
            finally:
                con.close()
        order = ["trajectory_id", "run_id", "round", "task_id", "sample", "reward", "success", "finish_reason", "tool_sequence"]
        # Sorted by Polars: faster here than an ORDER BY in DuckDB that carries the tool_sequence lists.
        return frame.select(order).sort("round", "task_id", "sample")

    def trajectory_scan(self, run_id: str, upto_round: int | None = None) -> pl.LazyFrame:
        """What signal mining reads, as a lazy frame: a run's trajectories, rounds <= upto_round, unsorted.

        Columns trajectory_id, round (Int32), task_id, sample, reward, tool_sequence. On a local
        warehouse it is a Polars scan of the run's files, so the plan that collects it reads only the
        columns it selects, and only the rounds it filters on (``round`` is the partition key). A
        damaged file fails at collect time; `trajectory_read_error` turns the error into the
        DataError `trajectory_frame` raises. On an object store the rows are read once, through DuckDB.
        """
        columns = ["trajectory_id", "round", "task_id", "sample", "reward", "tool_sequence"]
        if not self.files.is_local:
            frame = self.trajectory_frame(run_id, upto_round)
            return frame.lazy().select(columns)
        paths = self._trajectory_files(run_id, upto_round)
        if not paths:
            fields = SCHEMAS["trajectories"]
            empty = pl.from_arrow(pa.schema([fields.field(c) for c in columns if c != "round"]).empty_table())
            return empty.lazy().with_columns(pl.lit(0, pl.Int32).alias("round")).select(columns)
        # extra_columns: a column added within the layout (columns.conform) is in later files, not in earlier ones.
        scan = pl.scan_parquet(paths, hive_partitioning=True, hive_schema={"run_id": pl.String, "round": pl.Int32}, extra_columns="ignore")
        return scan.select(columns)

    def trajectory_read_error(self, exc: Exception, run_id: str) -> DataError:
        """The DataError for a failed collect of `trajectory_scan`: the damaged file named, or the error itself."""
        return self._damaged_table_file(exc, "trajectories") or DataError(
            f"Trajectories of run {run_id!r} in {self.root} cannot be read: {exc}"
        )

    # -- small tables: merged by key within their partition --------------------------------------

    def _merge(self, table: str, run_id: str, round_: int, rows: pa.Table, file: str = "rows") -> None:
        self._writable()
        keys = _MERGE_KEYS[table]
        target = f"{self.files.partition_dir(table, run_id, round_)}/{file}.parquet"
        new_keys = set(zip(*(rows.column(k).to_pylist() for k in keys)))
        kept = pa.Table.from_pylist([], schema=SCHEMAS[table])
        if self.files.exists(target):
            old = self.files.read(target).cast(SCHEMAS[table])
            keep = [i for i, key in enumerate(zip(*(old.column(k).to_pylist() for k in keys))) if key not in new_keys]
            kept = old.take(pa.array(keep, pa.int64()))
        self.files.write(target, pa.concat_tables([kept, rows.cast(SCHEMAS[table])]))

    def write_signals(self, signals: list[Signal]) -> None:
        by_partition: dict[tuple[str, int], dict[str, Signal]] = {}
        for s in signals:
            by_partition.setdefault((s.run_id, s.round), {})[s.signal_id] = s
        for (run_id, round_), latest in by_partition.items():
            rows = pa.Table.from_pylist(
                [{"signal_id": sid, "kind": s.kind, "trajectory_id": s.trajectory_id, "task_id": s.task_id,
                  "evidence": json.dumps(s.evidence, default=str)} for sid, s in latest.items()],
                schema=SCHEMAS["signals"],
            )  # fmt: skip
            self._merge("signals", run_id, round_, rows)

    def write_candidates(self, run_id: str, round: int, candidates: list[Candidate]) -> None:
        """Writes candidates (with verdicts once validated), keyed by (task, signal) within the round.

        When one signal produced the same task twice, the first copy's row is kept: validation judges
        candidates in order, so the first copy holds the verdict that decided whether the task entered
        the pool (a later copy is only rejected as its duplicate).
        """
        if not candidates:
            return
        latest: dict[tuple[str, str], Candidate] = {}
        for c in candidates:
            latest.setdefault((c.task.task_id, c.signal_id or ""), c)
        rows = pa.Table.from_pylist(
            [{"task_id": key[0], "signal_key": key[1], "signal_id": c.signal_id, "origin": c.task.provenance.origin,
              "accepted": None if c.verdict is None else c.verdict.accepted,
              "reason": None if c.verdict is None else c.verdict.reason,
              "task": json.dumps(c.task.to_dict(), default=str)} for key, c in latest.items()],
            schema=SCHEMAS["candidates"],
        )  # fmt: skip
        self._merge("candidates", run_id, round, rows)

    def write_evaluations(self, run_id: str, round: int, split: str, rows: list[tuple[str, bool, float, str]]) -> None:
        """Writes (task_id, success, reward, trajectory_id) rows of one evaluation split."""
        if not rows:
            return
        latest = {row[0]: row for row in rows}
        table = pa.Table.from_pylist(
            [{"split": split, "task_id": tid, "success": bool(r[1]), "reward": float(r[2]), "trajectory_id": r[3]}
             for tid, r in latest.items()],
            schema=SCHEMAS["evaluations"],
        )  # fmt: skip
        self._merge("evaluations", run_id, round, table, file=f"split-{split}")

    def evaluation_rows(self, run_id: str, round: int, split: str) -> list[tuple[str, bool, float, str]]:
        """(task_id, success, reward, trajectory_id) rows of one evaluation split of (run, round), as write_evaluations takes them."""
        rows = self._partition("evaluations", run_id, round, ["split", "task_id", "success", "reward", "trajectory_id"]).to_pylist()
        return [(r["task_id"], bool(r["success"]), float(r["reward"]), r["trajectory_id"]) for r in rows if r["split"] == split]

    def evaluation_outcomes(self, run_id: str, round: int, split: str) -> dict[str, bool]:
        """task_id -> success of one evaluation split of (run, round)."""
        rows = self._partition("evaluations", run_id, round, ["split", "task_id", "success"]).to_pylist()
        return {r["task_id"]: bool(r["success"]) for r in rows if r["split"] == split}

    def set_pool(self, run_id: str, round: int, task_ids: list[str]) -> None:
        """Replaces the pool of (run, round) with task_ids, keeping their order; duplicates are dropped."""
        self._writable()
        unique = list(dict.fromkeys(task_ids))
        table = pa.Table.from_pydict(
            {"position": list(range(len(unique))), "task_id": unique}, schema=SCHEMAS["pool_membership"]
        )
        self.files.write(f"{self.files.partition_dir('pool_membership', run_id, round)}/members.parquet", table)

    def write_tasks(self, tasks: list[Task]) -> None:
        """Writes tasks by content id, in a file named after the ids it holds."""
        self._writable()
        if not tasks:
            return
        latest = {t.task_id: t for t in tasks}
        table = pa.Table.from_pylist(
            [{"task_id": tid, "environment": t.environment, "origin": t.provenance.origin, "round": t.provenance.round,
              "parent_trajectory_id": t.provenance.parent_trajectory_id, "signal_id": t.provenance.signal_id,
              "content_hash": t.content_hash, "task": json.dumps(t.to_dict(), default=str), "tools": t.tools}
             for tid, t in latest.items()],
            schema=SCHEMAS["tasks"],
        )  # fmt: skip
        self.files.write(f"{self.files.table_dir('tasks')}/{part_name(latest)}.parquet", table)

    def pool(self, run_id: str, round: int) -> list[Task]:
        """The tasks in the pool of (run, round), in the order set_pool was given."""
        members = self._partition("pool_membership", run_id, round).to_pylist()
        if not members:
            return []
        wanted = {m["task_id"] for m in members}
        found: dict[str, Task] = {}
        for path in reversed(self.files.files("tasks")):
            table = self.files.read(path, ["task_id", "task"])
            for tid, text in zip(table.column("task_id").to_pylist(), table.column("task").to_pylist()):
                if tid in wanted and tid not in found:
                    found[tid] = Task.from_dict(json.loads(text))
            if len(found) == len(wanted):
                break
        missing = wanted - set(found)
        if missing:
            raise DataError(
                f"Pool {round} of run {run_id!r} names {len(missing)} task(s) the warehouse {self.root} does not hold "
                f"(e.g. {sorted(missing)[0]}); the files under tables/tasks were removed or damaged."
            )
        return [found[m["task_id"]] for m in sorted(members, key=lambda m: m["position"])]

