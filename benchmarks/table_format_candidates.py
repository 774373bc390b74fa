"""The table-format benchmark's candidates (benchmarks/table_formats.py): plain Parquet, Delta Lake, DuckLake.

Each appends batches, replaces a partition and gives a DuckDB reader over its files.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.table_format_workload import PART_COLUMNS


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ParquetFormat:
    name = "parquet"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.steps = root / "steps"

    def version(self) -> str:
        return f"pyarrow {pa.__version__}"

    def open_writer(self):
        return None

    def close_writer(self, handle) -> None:
        pass

    def _write_file(self, table: pa.Table, final: Path) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"  # not *.parquet: DuckDB's glob matches dotfiles
        pq.write_table(table.drop_columns(PART_COLUMNS), tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    def append(self, handle, table: pa.Table, run_id: str, round_: int, seq: int) -> None:
        self._write_file(table, self.steps / f"run_id={run_id}" / f"round={round_}" / f"part-{seq:05d}.parquet")

    def replace_partition(self, run_id: str, round_: int, parts: list[pa.Table]) -> None:
        directory = self.steps / f"run_id={run_id}" / f"round={round_}"
        keep = set()
        for seq, table in enumerate(parts):
            final = directory / f"part-{seq:05d}.parquet"
            self._write_file(table, final)
            keep.add(final.name)
        for stale in directory.glob("part-*.parquet"):
            if stale.name not in keep:
                stale.unlink()

    def reader(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.execute(
            f"CREATE VIEW steps AS SELECT * FROM read_parquet('{self.steps}/**/*.parquet', hive_partitioning = true)"
        )
        return con

    def leftovers(self) -> int:
        return sum(1 for _ in self.steps.rglob("*.tmp"))


class DeltaFormat:
    name = "delta"

    def __init__(self, root: Path) -> None:
        # A candidate's own package, installed only to run this benchmark; the project is not importable in
        # the ducklake child's interpreter, so coevolve.optional is not used in this file.
        import deltalake  # noqa: PLC0415 - imported only when the delta candidate runs

        self.dl = deltalake
        self.root = root
        self.uri = str(root / "steps")

    def version(self) -> str:
        return f"deltalake {self.dl.__version__}"

    def open_writer(self):
        return None

    def close_writer(self, handle) -> None:
        pass

    def append(self, handle, table: pa.Table, run_id: str, round_: int, seq: int) -> None:
        self.dl.write_deltalake(self.uri, table, mode="append", partition_by=PART_COLUMNS)

    def replace_partition(self, run_id: str, round_: int, parts: list[pa.Table]) -> None:
        self.dl.write_deltalake(
            self.uri, pa.concat_tables(parts), mode="overwrite", partition_by=PART_COLUMNS,
            predicate=f"run_id = '{run_id}' AND round = {round_}",
        )  # fmt: skip

    def reader(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.register("steps", self.dl.DeltaTable(self.uri).to_pyarrow_dataset())
        return con

    def leftovers(self) -> int:
        live = {u.split("/")[-1] for u in self.dl.DeltaTable(self.uri).file_uris()}
        return sum(
            1 for f in Path(self.uri).rglob("*") if f.is_file() and "_delta_log" not in f.parts and f.name not in live
        )


class DuckLakeFormat:
    name = "ducklake"

    def __init__(self, root: Path) -> None:
        # Only in the ducklake child's interpreter (--ducklake-python), which has duckdb 1.5.5 and the extension.
        import duckdb_extension_ducklake  # noqa: PLC0415 - present only in the ducklake child's interpreter

        self.root = root
        self.catalog = root / "catalog.ducklake"
        self.data = root / "data"
        self.extension = (
            Path(duckdb_extension_ducklake.__file__).parent
            / "extensions"
            / f"v{duckdb.__version__}"
            / "ducklake.duckdb_extension"
        )

    def version(self) -> str:
        extension = importlib.metadata.version("duckdb-extension-ducklake")
        return f"duckdb {duckdb.__version__} + duckdb-extension-ducklake {extension}"

    def _attach(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.execute(f"LOAD '{self.extension}'")
        self.data.mkdir(parents=True, exist_ok=True)
        mode = ", READ_ONLY" if read_only else ""
        con.execute(f"ATTACH 'ducklake:{self.catalog}' AS lake (DATA_PATH '{self.data}/'{mode})")
        return con

    def open_writer(self):
        return self._attach()

    def close_writer(self, handle) -> None:
        handle.close()

    def append(self, handle, table: pa.Table, run_id: str, round_: int, seq: int) -> None:
        con = handle if handle is not None else self._attach()
        try:
            con.register("batch", table)
            if not con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND table_name = 'steps'"
            ).fetchone()[0]:
                con.execute("CREATE TABLE lake.steps AS FROM batch LIMIT 0")
                con.execute("ALTER TABLE lake.steps SET PARTITIONED BY (run_id, round)")
            con.execute("INSERT INTO lake.steps SELECT * FROM batch")
            con.unregister("batch")
        finally:
            if handle is None:
                con.close()

    def replace_partition(self, run_id: str, round_: int, parts: list[pa.Table]) -> None:
        con = self._attach()
        try:
            con.register("batch", pa.concat_tables(parts))
            con.execute("BEGIN TRANSACTION")
            con.execute("DELETE FROM lake.steps WHERE run_id = ? AND round = ?", [run_id, round_])
            con.execute("INSERT INTO lake.steps SELECT * FROM batch")
            con.execute("COMMIT")
        finally:
            con.close()

    def reader(self) -> duckdb.DuckDBPyConnection:
        con = self._attach(read_only=True)
        con.execute("CREATE TEMP VIEW steps AS SELECT * FROM lake.steps")
        return con

    def leftovers(self) -> int:
        con = self._attach(read_only=True)
        try:
            live = {
                Path(r[0]).name
                for r in con.execute("SELECT data_file FROM ducklake_list_files('lake', 'steps')").fetchall()
            }
        finally:
            con.close()
        return sum(1 for f in self.data.rglob("*") if f.is_file() and f.name not in live)


FORMATS = {"parquet": ParquetFormat, "delta": DeltaFormat, "ducklake": DuckLakeFormat}
