"""The MLflow store a tracker opens: what kind it is, and the checks that run before MLflow touches it.

A damaged SQLite file makes MLflow retry for minutes before it fails, so `Tracker` checks the file
first and names the way back; a server or a database that is only busy is worth a retry instead.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy.engine import make_url

from coevolve.errors import ConfigError, DataError, DiskFullError, PipelineError

_SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    database = make_url(tracking_uri).database
    return Path(database) if database and database != ":memory:" else None


# How long the check of a store waits for another process's write to it (a round of another run).
_BUSY_TIMEOUT_S = 30.0


def damaged_store(path: Path, reason: str) -> PipelineError:
    """The error of a store file MLflow cannot use, with the way back; a full disk is only that."""
    if "disk is full" in reason.lower():
        # SQLite words a full disk as "database or disk is full": the store is intact, the disk needs space.
        return DiskFullError(path.parent)
    return DataError(
        f"MLflow store {path} is damaged or unusable ({reason}). Restore it from a backup, or move it aside "
        f"(mv {path} {path}.damaged) to start a new store, which no longer lists the earlier runs and model "
        "versions. The warehouse, pool snapshots and checkpoints are separate files and are untouched."
    )


def check_store_file(path: Path, writable: bool = True) -> None:
    """Refuse a store file that cannot hold an SQLite database before MLflow retries it for minutes.

    ``writable``: the store must be writable too (a tracker that records rounds); a reader needs only to read it.
    """
    if path.is_dir():
        raise damaged_store(path, "it is a directory, not an SQLite file")
    if path.parent.exists() and not path.parent.is_dir():
        raise damaged_store(path, f"{path.parent} is a file, not a folder")
    if path.is_file():
        if not os.access(path, os.R_OK | os.W_OK if writable else os.R_OK):
            raise damaged_store(path, "it is not readable and writable by this user")
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_HEADER))
        if head and head != _SQLITE_HEADER:
            raise damaged_store(path, "it is not an SQLite database file")
    elif writable and path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        raise damaged_store(path, f"its folder {path.parent} is not writable by this user")


def check_tracking_store(tracking_uri: str) -> None:
    """Refuse a local SQLite store that is damaged anywhere, before a round spends its compute.

    MLflow reads only the pages a query needs, so a damaged page is otherwise found when the version stage
    writes there, at the end of the round. SQLite's own check (``PRAGMA quick_check``) reads every page of the
    file, which stays small: MLflow keeps names, tags and numbers there and the files in the artifact folder.
    Other stores (a tracking server, a database server) are checked by opening them (`storage.tracking.Tracker`).
    """
    path = sqlite_file(tracking_uri)
    if path is None:
        return
    check_store_file(path)
    if not path.is_file() or path.stat().st_size == 0:
        return  # a new store: MLflow creates it
    try:
        # Opened as MLflow opens it (read-write), so a transaction a killed process left half done is rolled back
        # first, as MLflow would: that is a store to resume, not a damaged one. The check itself writes nothing.
        connection = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S)
        try:
            problems = [row[0] for row in connection.execute("PRAGMA quick_check").fetchall()]
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        if is_busy(exc):
            return  # another process is writing it: it opens, and that process checks it as it goes
        raise damaged_store(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
    if problems != ["ok"]:
        raise damaged_store(path, f"SQLite's integrity check reports: {problems[0]}")


def is_tracking_server(tracking_uri: str) -> bool:
    """A tracking URI served by `mlflow server` (http or https), as opposed to a store this process opens itself."""
    return tracking_uri.startswith(("http://", "https://"))


def check_checkpoint_registration(tracking_uri: str, register_checkpoints: str) -> None:
    """Refuse ``register_checkpoints='uri'`` with a tracking server: it would fail at the end of the round.

    A tracking server refuses a model version whose source is a local path (file://) outside the run's
    own artifact folder, and checkpoints are folders under state_dir.
    """
    if register_checkpoints == "uri" and is_tracking_server(tracking_uri):
        raise ConfigError(
            f"tracking.register_checkpoints='uri' cannot be used with the MLflow tracking server {tracking_uri}: a "
            "server refuses to register a checkpoint folder (a file:// source outside the run's artifacts). Use "
            "tracking.register_checkpoints=copy (the server stores the checkpoint as the run's artifacts), or a store "
            "of your own (tracking.mlflow_uri unset, or sqlite:///<shared path>) to register the folder where it is."
        )


def is_busy(exc: Exception) -> bool:
    """A store another process holds for the moment: worth a retry."""
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text
