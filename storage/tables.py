"""The warehouse's table files: Parquet, hive-partitioned by run and round, under a folder or URL.

Layout under the warehouse root (a local folder, or ``s3://bucket/prefix`` through fsspec)::

    tables/<table>/run_id=<run>/round=<round>/<name>.parquet   partitioned tables
    tables/tasks/<name>.parquet                                 content-addressed tasks, shared by runs

Every file is a complete Parquet file that DuckDB, Polars, pyarrow, Spark and Trino read as is; the
partition columns ``run_id`` and ``round`` live in the path (hive style), not in the file.

Writes are atomic: on a local or shared filesystem a file is written under a hidden name beside its
target (``.<name>.parquet.<host>-<pid>-<random>.partial``, which no ``*.parquet`` glob matches) and renamed
onto it; on an object store one PUT makes the object appear whole. A writer killed mid-write leaves at
most a hidden partial file, which readers never see and `sweep_partials` removes. File names are
deterministic (chosen by the caller from what the file holds), so a stage that runs again replaces
exactly its own files.

Why plain Parquet and not Delta Lake or DuckLake: storage/README.md has the measurements.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from coevolve.errors import DataError

PARTIAL_SUFFIX = ".partial"
# A partial file this old is abandoned whoever wrote it: a whole file is written in well under a minute.
STALE_PARTIAL_S = 3600.0
# This machine, as partial files name their writer (with its process id).
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
# Parquet settings of every file: zstd compresses the token-id lists and texts about 3x better than
# snappy at a similar write speed; statistics let readers skip row groups.
_WRITE_OPTIONS: dict[str, Any] = {"compression": "zstd", "write_statistics": True}


def part_name(keys: Iterable[str]) -> str:
    """A file name that depends only on which rows a file holds, so re-writing them replaces it."""
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:20]
    return f"part-{digest}"


@dataclass(frozen=True)
class TableFiles:
    """The Parquet files of a warehouse root: atomic writes, listings, partition deletes."""

    root: str  # the root as given: a local absolute path or a URL
    fs: Any  # an fsspec filesystem
    path: str  # the root as the filesystem names it (no protocol)

    @classmethod
    def open(cls, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> TableFiles:
        text = os.fspath(root)
        options = dict(storage_options or {})
        if "://" not in text:
            text = os.path.abspath(os.path.expanduser(text))
        elif not text.startswith("file://"):
            # Object stores list through fsspec, which caches listings per filesystem instance (and
            # instances are shared within a process): a cached listing would hide files another
            # process wrote since, so listings are fetched anew unless the options say otherwise.
            options.setdefault("use_listings_cache", False)
        fs, path = fsspec.core.url_to_fs(text, **options)
        return cls(root=text, fs=fs, path=path.rstrip("/"))

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    def url(self, path: str) -> str:
        """A path of this filesystem as DuckDB reads it: local paths as they are, others with their protocol."""
        if self.is_local:
            return path
        return f"{_protocols(self.fs)[0]}://{path}"

    # -- naming ------------------------------------------------------------------------------------

    def table_dir(self, table: str) -> str:
        return f"{self.path}/tables/{table}"

    def partition_dir(self, table: str, run_id: str, round_: int) -> str:
        return f"{self.table_dir(table)}/run_id={run_id}/round={int(round_)}"

    # -- writes ------------------------------------------------------------------------------------

    def write(self, target: str, table: pa.Table) -> None:
        """Write ``table`` as the Parquet file ``target``, atomically; an existing file is replaced."""
        buffer = io.BytesIO()
        pq.write_table(table, buffer, **_WRITE_OPTIONS)
        self.write_bytes(target, buffer.getvalue())

    def write_bytes(self, target: str, data: bytes) -> None:
        parent = posixpath.dirname(target)
        if self.is_local:
            os.makedirs(parent, exist_ok=True)
            tag = f"{_HOST}~{os.getpid()}~{uuid.uuid4().hex[:8]}"
            partial = f"{parent}/.{posixpath.basename(target)}.{tag}{PARTIAL_SUFFIX}"
            with open(partial, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
            os.replace(partial, target)
            fsync_dir(parent)  # the new name itself is on disk: a power loss cannot undo the rename
        else:
            # One PUT: the object is visible whole or not at all.
            self.fs.pipe_file(target, data)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

    def sweep_partials(self, table: str) -> int:
        """Remove hidden partial files that killed writers left under ``table``; returns how many.

        A partial file of a writer that is still running (another process writing another shard)
        is left alone: one of a process of this machine that no longer exists, or one older than
        `STALE_PARTIAL_S` (a writer on another machine), is removed.
        """
        if not self.is_local:
            return 0
        found = [p for p in self.fs.glob(f"{self.table_dir(table)}/**") if p.endswith(PARTIAL_SUFFIX)]
        stale = [p for p in found if _abandoned(p)]
        self.delete(stale)
        return len(stale)

    # -- listings ----------------------------------------------------------------------------------

    def files(self, table: str, run_id: str | None = None, round_: int | None = None) -> list[str]:
        """The table's visible Parquet files, sorted, optionally of one run and round."""
        run = "*" if run_id is None else f"run_id={run_id}"
        rnd = "*" if round_ is None else f"round={int(round_)}"
        pattern = f"{self.table_dir(table)}/{run}/{rnd}/*.parquet"
        if table == "tasks":
            pattern = f"{self.table_dir(table)}/*.parquet"
        try:
            found = self.fs.glob(pattern)
        except FileNotFoundError:
            return []
        return sorted(p for p in found if not posixpath.basename(p).startswith("."))

    def age_s(self, path: str) -> float:
        """Seconds since a file was last written; 0 when it is gone or the store does not say."""
        try:
            modified = self.fs.modified(path)
        except (FileNotFoundError, NotImplementedError, OSError):
            return 0.0
        return max(0.0, time.time() - modified.timestamp())

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def read(self, path: str, columns: list[str] | None = None) -> pa.Table:
        try:
            with self.fs.open(path, "rb") as handle:
                return pq.read_table(handle, columns=columns)
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise self.damaged(path, str(exc)) from exc

    def damaged(self, path: str, detail: str) -> DataError:
        """The error for a file under ``tables/`` that is not a readable Parquet file, with the way to rewrite it."""
        detail = " ".join(detail.split())[:300]
        message = f"Warehouse file {self.url(path)} is not a readable Parquet file ({detail}); "
        relative = posixpath.relpath(path, self.path).split("/")
        stage = _WRITTEN_BY.get(relative[1]) if len(relative) == 5 and relative[0] == "tables" else None
        run = relative[2].removeprefix("run_id=") if stage else ""
        round_ = relative[3].removeprefix("round=") if stage else ""
        if stage and round_.lstrip("-").isdigit() and int(round_) >= 0:
            record = f"{self.path}/catalog/stage_runs/run_id={run}/round={round_}/{stage}.json"
            return DataError(
                message + f"restore it from a backup, or move it aside (mv {path} {path}.damaged), delete the "
                f"record of the stage that wrote it ({record}) and run `coevolve round --round {round_}` again: "
                f"the {stage} stage writes it anew and the stages already recorded are kept."
            )
        return DataError(
            message + f"restore it from a backup, or move it aside (mv {path} {path}.damaged) and run the stage "
            "that wrote it again (its record under catalog/stage_runs/ deleted) or `coevolve round --round 0` "
            "in a new warehouse."
        )


# The stage whose rows a table holds: the one to run again when a file of the table is damaged.
_WRITTEN_BY: dict[str, str] = {
    "trajectories": "rollout",
    "steps": "rollout",
    "signals": "mine",
    "candidates": "synthesize",
    "evaluations": "evaluate",
}


def _abandoned(path: str) -> bool:
    """Whether the writer of a partial file is gone: a dead process of this machine, or a file left too long."""
    try:
        if time.time() - os.stat(path).st_mtime > STALE_PARTIAL_S:
            return True
    except FileNotFoundError:
        return False  # renamed into place meanwhile
    host, _, rest = path[: -len(PARTIAL_SUFFIX)].rsplit(".", 1)[-1].partition("~")
    pid = rest.partition("~")[0]
    if host != _HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def fsync_dir(path: str) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (e.g. network mounts) refuse fsync on folders
    finally:
        os.close(fd)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
