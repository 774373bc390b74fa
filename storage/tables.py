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
import json
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

from coevolve.errors import DataError, disk_full_as_error
from coevolve.stages import record_name

# The run id of the empty file every table holds from the start (`Warehouse._empty_file`) and of the catalog's
# placeholder records, one per kind, so the glob a view reads always matches a file (a DuckDB session opened on a
# new warehouse then sees records written after it opened). Never a real run's id (coevolve/config: a run id starts
# with a letter or digit), never returned by `Catalog.records`; the views leave it out.
PLACEHOLDER_RUN = "_empty"

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

    def aside(self, path: str) -> str:
        """How a user moves a damaged file out of the views' way (a name that no longer ends in .parquet)."""
        if self.is_local:
            return f"move it aside (mv {path} {path}.damaged)"
        url = self.url(path)
        example = f", e.g. `aws s3 mv {url} {url}.damaged`" if url.startswith("s3://") else ""
        return f"move it aside (rename {url} to {url}.damaged with the object store's tools{example})"

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
            tag = f"{_HOST}~{os.getpid()}~{uuid.uuid4().hex[:8]}"
            partial = f"{parent}/.{posixpath.basename(target)}.{tag}{PARTIAL_SUFFIX}"
            # A full disk is one line naming the warehouse; the partial file goes, the target is as it was.
            with disk_full_as_error(self.path, remove=partial):
                os.makedirs(parent, exist_ok=True)
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
        """The error for a file under ``tables/`` that is not a readable Parquet file, with the way to rewrite it.

        A file of a round's partition names the record of the stage that wrote it (for a rollout, the record of
        the training step whose episodes the file holds) when running the round again writes it anew; a round
        that is finished, or whose step was played by a policy that is gone, cannot write it again.
        """
        # DuckDB's message goes on with the statement it failed in ("LINE 1: CREATE VIEW ..."): left out.
        detail = " ".join(detail.split("\nLINE ")[0].split())[:300]
        message = f"Warehouse file {self.url(path)} is not a readable Parquet file ({detail}); "
        if posixpath.basename(path) == f"{PLACEHOLDER_RUN}.parquet":
            # The table's empty file: without it the views take the table's columns from SCHEMAS
            # (`WarehouseViews.connect`), and a command that opens the warehouse for writing writes it anew.
            return DataError(
                message + f"it is the table's empty file and holds no rows: {self.aside(path)}, and the views take "
                "the table's columns from the code until the next round writes the file anew."
            )
        relative = posixpath.relpath(path, self.path).split("/")
        stage = _WRITTEN_BY.get(relative[1]) if len(relative) == 5 and relative[0] == "tables" else None
        run = relative[2].removeprefix("run_id=") if stage else ""
        round_ = relative[3].removeprefix("round=") if stage else ""
        if stage and round_.lstrip("-").isdigit() and int(round_) >= 0:
            advice = self._rewrite_advice(path, relative[1], stage, run, int(round_))
            if advice is not None:
                return DataError(message + advice)
        return DataError(
            message + f"restore it from a backup, or {self.aside(path)} and run the stage "
            "that wrote it again (its record under catalog/stage_runs/ deleted) or `coevolve round --round 0` "
            "in a new warehouse."
        )

    def _rewrite_advice(self, path: str, table: str, stage: str, run: str, round_: int) -> str | None:
        """How the rows of a damaged file of round ``round_`` come back, read off the round's records; None when
        the records do not tell which training step's rollout wrote it."""
        aside = self.aside(path)
        kept = "the round's other rows and records stay as they are, and this file's rows are left out of every query"
        round_record = self._record(f"{self.path}/catalog/rounds/run_id={run}/{round_}.json") or {}
        if round_record.get("status") == "finished":
            return f"restore it from a backup, or {aside}: round {round_} is finished and never runs again, so {kept}."
        step = self._batch_step(path, table, run, round_, round_record) if stage == "rollout" else 0
        if step is None:
            return None
        record = f"{self.path}/catalog/stage_runs/run_id={run}/round={round_}/{record_name(stage, step)}.json"
        recorded = self._record(record)
        played_by = ((recorded or {}).get("output") or {}).get("checkpoint") if stage == "rollout" else None
        if isinstance(played_by, str) and os.path.isabs(played_by) and not os.path.exists(played_by):
            # A step's policy folder is deleted once the next step has trained (training.keep_step_checkpoints).
            return (
                f"restore it from a backup, or {aside}: the policy that played these episodes ({played_by}) is "
                f"gone, so they cannot be played again; {kept}."
            )
        what = f"the rollout of training step {step}" if stage == "rollout" else f"the {stage} stage"
        if recorded is None:
            return (
                f"restore it from a backup, or {aside} and run `coevolve round --round {round_}` again: {what}, "
                "not recorded yet, writes its rows anew."
            )
        return (
            f"restore it from a backup, or {aside}, delete the record of the stage that wrote it, {what} ({record}), "
            f"and run `coevolve round --round {round_}` again: {what} writes its rows anew and the stages already "
            "recorded are kept."
        )

    def _batch_step(self, path: str, table: str, run: str, round_: int, round_record: dict[str, Any]) -> int | None:
        """The training step whose episodes a file of a trajectory batch holds; None when that cannot be told.

        A batch's files share one name (trajectories, steps and tool-call counts), and its episode ids end in
        their sample numbers: step k plays samples k x group_size onwards (coevolve.stages.step_samples), with
        the group size the round started with (or the run's configuration).
        """
        group_size = (round_record.get("settings") or {}).get("rollout.group_size")
        if not isinstance(group_size, int):
            run_record = self._record(f"{self.path}/catalog/runs/{run}.json") or {}
            group_size = ((run_record.get("config") or {}).get("rollout") or {}).get("group_size")
        name = posixpath.basename(path)
        for companion in ("trajectories", "steps"):
            if companion == table or not isinstance(group_size, int) or group_size < 1:
                continue
            try:
                with self.fs.open(f"{self.partition_dir(companion, run, round_)}/{name}", "rb") as handle:
                    ids = pq.read_table(handle, columns=["trajectory_id"]).column("trajectory_id").to_pylist()
            except (pa.ArrowException, OSError):
                continue  # missing or damaged too: the other companion, or the records, may tell
            samples = {s for s in (_sample_of(i) for i in ids) if s is not None}
            steps = {sample // group_size for sample in samples}
            if len(steps) == 1:
                return steps.pop()
        # A round whose records name no training step after the first played only step 0.
        try:
            later = self.fs.glob(f"{self.path}/catalog/stage_runs/run_id={run}/round={round_}/rollout@*.json")
        except FileNotFoundError:
            later = []
        return None if later else 0

    def _record(self, path: str) -> dict[str, Any] | None:
        """A catalog record (storage/catalog.py) as advice reads it: None when it is missing or unreadable."""
        try:
            with self.fs.open(path, "rb") as handle:
                record = json.loads(handle.read())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None


def _sample_of(trajectory_id: Any) -> int | None:
    """The sample number an episode id ends in (``<run>/r<round>/<task>/s<sample>``, coevolve.records)."""
    tail = str(trajectory_id).rsplit("/s", 1)[-1]
    return int(tail) if tail.isdigit() else None


# The stage whose rows a table holds: the one to run again when a file of the table is damaged.
_WRITTEN_BY: dict[str, str] = {
    "trajectories": "rollout",
    "steps": "rollout",
    "tool_call_counts": "rollout",
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
