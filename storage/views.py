"""What every part of the warehouse reads through: its files and records, DuckDB sessions with a view
per table, and the rows of one partition straight from its files.

`WarehouseViews` is the base the warehouse's parts share (storage/warehouse.py composes them); it
holds no state of its own beyond what `Warehouse.__init__` sets.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from coevolve.errors import DataError, PipelineError
from storage.catalog import Catalog
from storage.columns import ADDED_TABLES, SCHEMAS, conform
from storage.layouts import VIEWS
from storage.tables import PLACEHOLDER_RUN, TableFiles

# The files of a trajectory batch besides its trajectories file, which write_batch writes last.
BATCH_PARTS: tuple[str, ...] = ("steps", "tool_call_counts")
# Columns of the bookkeeping records (storage/catalog.py) as their views show them.
CATALOG_COLUMNS: dict[str, dict[str, str]] = {
    "runs": {"run_id": "VARCHAR", "created_at": "TIMESTAMP", "config": "JSON"},
    "rounds": {"run_id": "VARCHAR", "round": "INTEGER", "status": "VARCHAR", "summary": "JSON",
               "flow_run_id": "VARCHAR", "started_at": "TIMESTAMP", "finished_at": "TIMESTAMP"},
    "stage_runs": {"run_id": "VARCHAR", "round": "INTEGER", "stage": "VARCHAR", "finished_at": "TIMESTAMP",
                   "output": "JSON", "cost": "JSON"},
}  # fmt: skip
# The statements the query door (`WarehouseViews.sql`, `coevolve sql`) runs: reads. DuckDB's parser types
# DESCRIBE, SHOW, SUMMARIZE, VALUES, WITH ... SELECT and FROM-first queries as SELECT too. Every other type
# writes (COPY, EXPORT, CREATE, INSERT), reaches outside the warehouse (ATTACH; INSTALL and LOAD, both typed LOAD),
# changes the session (SET, PRAGMA, CALL, DROP) or may run another statement (EXPLAIN ANALYZE, PIVOT's MULTI).
READ_STATEMENTS: frozenset[duckdb.StatementType] = frozenset({duckdb.StatementType.SELECT})
READ_FORMS = "SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE"
# A query may spill to disk this many times its memory limit: a sort or join somewhat larger than memory still
# answers, while an endless one cannot fill the disk before its time limit stops it.
QUERY_SPILL_FACTOR = 4


def _no_rows(table: str) -> str:
    """A query with ``table``'s columns (and run_id, round for a partitioned table) and no rows, in SQL alone: a
    script cannot register data."""
    con = duckdb.connect()
    try:
        con.register("empty", SCHEMAS[table].empty_table())
        columns = con.execute("DESCRIBE SELECT * FROM empty").fetchall()
    finally:
        con.close()
    typed = ", ".join(f'CAST(NULL AS {kind}) AS "{name}"' for name, kind, *_ in columns)
    partition = "" if table == "tasks" else ", NULL::VARCHAR AS run_id, NULL::INTEGER AS round"
    return f"SELECT {typed}{partition} WHERE false"


def _frame(relation: duckdb.DuckDBPyRelation, printable: bool) -> pl.DataFrame:
    """The relation's rows as a Polars frame. ``printable``: one whose values Polars cannot import or hand back
    (a UNION, an infinite date) comes back with every column as DuckDB's text of it, rather than failing after
    the query has run (the door prints the rows it fetched)."""
    try:
        frame = relation.pl()
        if printable:
            frame.rows()  # every value as the printer reads it
        return frame
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, pa.ArrowException, ValueError, OverflowError):
        if not printable:
            raise
        return relation.project(", ".join(f'CAST("{c}" AS VARCHAR) AS "{c}"' for c in relation.columns)).pl()


class QueryRefused(PipelineError):
    """A query the query door does not run: a statement that is not a read, or a read outside the warehouse."""


class QueryStopped(PipelineError):
    """A query of the query door interrupted at its time limit."""

    def __init__(self, timeout_s: float | None) -> None:
        super().__init__(
            f"query stopped at its time limit of {timeout_s:g} s; give it longer with `coevolve sql --timeout S` "
            "(or warehouse.query_timeout_s), or narrow it (a WHERE on run_id and round, a LIMIT)."
        )


class QueryTooLarge(PipelineError):
    """A query of the query door that needed more memory and spill space than its limits."""

    def __init__(self, memory_mb: int | None) -> None:
        super().__init__(
            f"query needs more than its memory limit of {memory_mb} MB and {QUERY_SPILL_FACTOR}x that spilled to "
            "disk; raise warehouse.query_memory_mb, or narrow it (a WHERE on run_id and round, fewer columns)."
        )


@dataclass(frozen=True)
class QueryLimits:
    """What one query of the door may take: seconds, memory, and where its spill folder is made."""

    timeout_s: float | None = None
    memory_mb: int | None = None
    spill_root: Path | None = None  # None: the system's temporary folder


@dataclass(frozen=True)
class QueryResult:
    """The rows of a query that were fetched (its first ones, in its order) and how many it returned in all."""

    frame: pl.DataFrame
    total: int


class WarehouseViews:
    """The files, records and DuckDB sessions of one warehouse root, shared by the warehouse's parts."""

    files: TableFiles
    root: str
    read_only: bool
    catalog: Catalog
    _closed: bool

    def _writable(self) -> None:
        if self._closed:
            raise DataError(f"Warehouse {self.root} is closed.")
        if self.read_only:
            raise DataError(f"Warehouse {self.root} was opened read-only; it cannot be written.")

    def glob(self, table: str) -> str:
        """The file pattern of a table as DuckDB reads it."""
        if table == "tasks":
            return self.files.url(f"{self.files.table_dir(table)}/*.parquet")
        return self.files.url(f"{self.files.table_dir(table)}/*/*/*.parquet")

    def scan(self, table: str, empty_file: bool = True) -> str:
        """The SQL that reads a table's files (what its view is defined as). ``empty_file`` False: the table's
        empty file is missing, so its files are read without it (there must be at least one)."""
        pattern = self.glob(table).replace("'", "''")
        # The table's empty file comes first: DuckDB takes the columns from it, so defining the view
        # reads one small file, not every file's footer, and a damaged file fails only the queries
        # that read it. Every file of a layout version has the same columns (SCHEMAS), except a column
        # added within the version (columns.conform): files written before it lack it, and DuckDB ignores
        # it in later files when the empty file (written with the warehouse) lacks it too.
        empty = self.files.url(self._empty_file(table)).replace("'", "''")
        files = f"['{empty}', '{pattern}']" if empty_file else f"['{pattern}']"
        if table == "tasks":
            # Tasks are content-addressed: the same id always holds the same task, so keep one row of each.
            return f"SELECT * FROM read_parquet({files}) QUALIFY row_number() OVER (PARTITION BY task_id) = 1"
        if table in BATCH_PARTS:
            # A batch's trajectories file is its commit record (write_batch writes it last): steps and
            # counts of a batch without one (a writer killed, or still writing, between the files) are not rows yet.
            heads = self.glob("trajectories").replace("'", "''")
            return (
                f"SELECT * EXCLUDE (filename) FROM read_parquet({files}, hive_partitioning = true, "
                "hive_types = {'run_id': VARCHAR, 'round': INTEGER}, filename = true) "
                f"WHERE run_id <> '{PLACEHOLDER_RUN}' "
                "AND regexp_extract(filename, '[^/]+/[^/]+/[^/]+$') IN "
                f"(SELECT regexp_extract(file, '[^/]+/[^/]+/[^/]+$') FROM glob('{heads}'))"
            )
        return (
            f"SELECT * FROM read_parquet({files}, hive_partitioning = true, "
            f"hive_types = {{'run_id': VARCHAR, 'round': INTEGER}}) WHERE run_id <> '{PLACEHOLDER_RUN}'"
        )

    def _empty_file(self, table: str) -> str:
        """The empty file every table holds from the start (partition run_id=_empty/round=0): the views
        take the table's columns from it and match it before the first row is written."""
        if table == "tasks":
            return f"{self.files.table_dir(table)}/{PLACEHOLDER_RUN}.parquet"
        return f"{self.files.partition_dir(table, PLACEHOLDER_RUN, 0)}/{PLACEHOLDER_RUN}.parquet"

    def _scan_without_empty_file(self, table: str) -> str:
        """A table whose empty file is missing (a warehouse made before the table, or the file moved aside when
        damaged): its columns from SCHEMAS, its rows from the files it has when the session opens."""
        if not self.files.files(table):
            return _no_rows(table)
        rows = self.scan(table, empty_file=False)
        return f"SELECT * FROM ({_no_rows(table)}) UNION ALL BY NAME SELECT * FROM ({rows})"

    def _session(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        if not self.files.is_local:
            con.register_filesystem(self.files.fs)
        return con

    def connect(self, locked: bool = False) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB session with a view per table and the analysis views (storage/VIEWS.md).

        The views re-read the files on every query: a session kept open sees later writes. Close it
        when done; it holds no lock on anything. ``locked``: once the views exist, the session may read
        the warehouse's own files and nothing else, and cannot change its settings back (`_lock_down`).
        """
        if self._closed:
            raise DataError(f"Warehouse {self.root} is closed.")
        con = self._session()
        try:
            try:
                con.execute(self.view_script(without_empty_file=()))  # the usual case, without a look per table
            except duckdb.IOException:
                # Defining a table's view reads its empty file (`scan`); one that is missing (moved aside when
                # damaged) leaves the table's columns to SCHEMAS.
                missing = [t for t in SCHEMAS if not self.files.exists(self._empty_file(t))]
                if not missing:
                    raise
                con.close()
                con = self._session()
                con.execute(self.view_script(without_empty_file=missing))
        except duckdb.Error as exc:
            con.close()
            damaged = self._damaged_table_file(exc, "")  # a damaged empty file fails every session
            if damaged is None:
                raise
            raise damaged from None
        if locked:
            self._lock_down(con)
        return con

    def view_script(self, without_empty_file: Collection[str] | None = None) -> str:
        """The SQL that defines every view of a session: one per table, one per kind of record, the analysis views.

        What `connect` runs, and what storage/VIEWS.md writes to ``views.sql`` for the DuckDB CLI, so the two
        cannot differ. The files are named by absolute path (or URL), so the script runs from any folder.
        ``without_empty_file``: the tables whose empty file is missing (moved aside when damaged), whose views
        take their columns from SCHEMAS; None looks for them.
        """
        if without_empty_file is None:
            without_empty_file = [t for t in SCHEMAS if not self.files.exists(self._empty_file(t))]
        statements = []
        for table in SCHEMAS:
            if table in without_empty_file or (
                table in ADDED_TABLES and not self.files.exists(self._empty_file(table))
            ):
                statements.append(f"CREATE VIEW {table} AS {self._scan_without_empty_file(table)}")
            else:
                statements.append(f"CREATE VIEW {table} AS {self.scan(table)}")
        statements += [f"CREATE VIEW {kind} AS {self._catalog_scan(kind)}" for kind in CATALOG_COLUMNS]
        return "".join(f"{statement};\n" for statement in statements) + VIEWS

    def _lock_down(
        self, con: duckdb.DuckDBPyConnection, memory_mb: int | None = None, spill: Path | None = None
    ) -> None:
        """No file outside the warehouse, no extension, and no way to SET either back.

        ``memory_mb``: the session's memory limit; ``spill``: the folder it spills to past it (at most
        `QUERY_SPILL_FACTOR` times the limit), else none, so no folder besides the warehouse is readable.

        ``allowed_directories`` admits the warehouse root (which the views scan) to a session whose external
        access is off. It admits writes there too, so the statement check of `sql` is the wall that keeps
        COPY out, and this lock-down the one behind it. A filesystem registered from fsspec (an object
        store) is matched by the URL its files are read by (``s3://bucket/prefix/...``), which is what
        `TableFiles.url` gives.
        """
        root = (self.files.url(self.files.path).rstrip("/") + "/").replace("'", "''")
        if memory_mb is not None:
            con.execute(f"SET memory_limit = '{int(memory_mb)}MB'")
            con.execute(f"SET max_temp_directory_size = '{int(memory_mb) * QUERY_SPILL_FACTOR}MB'")
        # temp_directory is set before external access goes off (after, DuckDB refuses to change it).
        temp = "" if spill is None else str(spill).replace("'", "''")
        con.execute(f"SET temp_directory = '{temp}'")
        con.execute(f"SET allowed_directories = ['{root}']")
        con.execute("SET enable_external_access = false")
        # The extensions the views need (parquet, json, icu) are built into the duckdb wheel; anything else
        # would be downloaded, and the project works offline.
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET lock_configuration = true")

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

    def sql(self, query: str, limits: QueryLimits | None = None) -> pl.DataFrame:
        """Runs a read-only query (e.g. on the v_* views) and returns the result as a Polars frame.

        The query door of `coevolve sql`: DuckDB's own parser types every statement, and a query holding
        anything but reads (`READ_STATEMENTS`) is refused before any of it runs. The reads run in a locked
        session (`_lock_down`) that opens no file outside the warehouse. Either refusal is a
        `QueryRefused`; nothing is ever written. ``limits``: its time and memory (`QueryLimits`).
        """
        return self.query(query, limits=limits, printable=False).frame

    def query(
        self, query: str, rows: int | None = None, limits: QueryLimits | None = None, printable: bool = True
    ) -> QueryResult:
        """`sql`, keeping only the first ``rows`` rows (None: all) and counting the rest without holding them.

        The head is fetched with a LIMIT (DuckDB stops early, or keeps a top-N for an ORDER BY) and the rows
        past it are counted by a second pass that holds none of them, so printing 50 rows of a hundred million
        takes the memory of 50. A query past ``limits.timeout_s`` is interrupted: `QueryStopped`. ``printable``:
        values Polars cannot hand back (a UNION, an infinite date) come as text instead of failing.
        """
        limits = limits or QueryLimits()
        # A folder of this session's own for DuckDB's spill files: a session's temp_directory is readable through
        # the door whatever allowed_directories says, so it must hold nothing but what this query spills (DuckDB's
        # default, .tmp in the working folder, could hold anything). Removed with the session.
        spill_root = limits.spill_root
        made_root = spill_root is not None and not spill_root.exists()
        spill = None
        if spill_root is not None:
            try:
                spill_root.mkdir(parents=True, exist_ok=True)
                spill = Path(tempfile.mkdtemp(prefix="sql-", dir=spill_root))
            except OSError:  # a read-only state folder is still read: the spill folder goes to the system's
                spill_root, made_root = None, False
        if spill is None:
            spill = Path(tempfile.mkdtemp(prefix="sql-"))
        con = self.connect()
        stopped = threading.Event()

        def interrupt() -> None:
            stopped.set()
            con.interrupt()

        timer = threading.Timer(limits.timeout_s, interrupt) if limits.timeout_s else None
        try:
            self._lock_down(con, limits.memory_mb, spill)
            self._refuse_all_but_reads(con, query)
            if timer is not None:
                timer.start()
            try:
                relation = con.sql(query)
                # Polars cannot import DuckDB's INTERVAL (e.g. a difference of timestamps): show it as text.
                if any(str(t) == "INTERVAL" for t in relation.types):
                    relation = relation.project(
                        ", ".join(
                            f'CAST("{c}" AS VARCHAR) AS "{c}"' if str(t) == "INTERVAL" else f'"{c}"'
                            for c, t in zip(relation.columns, relation.types, strict=True)
                        )
                    )
                if rows is None:
                    frame = _frame(relation, printable)
                    return QueryResult(frame, frame.height)
                frame = _frame(relation.limit(rows + 1), printable)
                if frame.height <= rows:
                    return QueryResult(frame, frame.height)
                counted = relation.aggregate("count(*)").fetchall()
                return QueryResult(frame.head(rows), int(counted[0][0]))
            except duckdb.Error as exc:
                if stopped.is_set():
                    raise QueryStopped(limits.timeout_s) from None
                if isinstance(exc, duckdb.OutOfMemoryException):
                    raise QueryTooLarge(limits.memory_mb) from None
                refused = self._query_error(exc, query)
                if refused is None:
                    raise
                raise refused from exc
        finally:
            if timer is not None:
                timer.cancel()
            con.close()
            shutil.rmtree(spill, ignore_errors=True)
            if made_root and spill_root is not None:  # a reader leaves the state folder as it found it
                with contextlib.suppress(OSError):  # another query's spill folder is still in it
                    spill_root.rmdir()

    def _refuse_all_but_reads(self, con: duckdb.DuckDBPyConnection, query: str) -> None:
        """`QueryRefused` naming the first statement that is not a read (a syntax error is DuckDB's own)."""
        statements = con.extract_statements(query)
        if not statements:
            raise QueryRefused("query refused: it holds no statement")
        for number, statement in enumerate(statements, start=1):
            if statement.type in READ_STATEMENTS:
                continue
            text = " ".join(statement.query.rstrip().rstrip(";").split())
            shown = text if len(text) <= 60 else f"{text[:59]}…"
            where = "the statement" if len(statements) == 1 else f"statement {number} of {len(statements)}"
            raise QueryRefused(
                f"query refused: {where} ({shown}) is {statement.type.name}; the warehouse's query door runs "
                f"reads only ({READ_FORMS}), and nothing was run. Derived tables go in a DuckDB file of your "
                'own (docs/warehouse.md, "Derived tables").'
            )

    def _query_error(self, exc: duckdb.Error, query: str) -> PipelineError | None:
        """What a failed read raises instead of DuckDB's error: a refusal for a file outside the warehouse, a
        DataError naming a damaged file of the warehouse; None for any other failure (a typo, a type error)."""
        if isinstance(exc, duckdb.PermissionException):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return QueryRefused(
                f"query refused: {first}; the warehouse's query door reads the files under {self.root} only."
            )
        return self._damaged_table_file(exc, query)

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
        if table in BATCH_PARTS:
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
