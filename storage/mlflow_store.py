"""The MLflow store a tracker opens: what kind it is, and the checks that run before MLflow touches it.

A damaged SQLite file makes MLflow retry for minutes before it fails, so `Tracker` checks the file
first and names the way back; a server or a database that is only busy is worth a retry instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from coevolve.errors import ConfigError, DataError

_SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    database = make_url(tracking_uri).database
    return Path(database) if database and database != ":memory:" else None


def damaged_store(path: Path, reason: str) -> DataError:
    return DataError(
        f"MLflow store {path} is damaged or unusable ({reason}). Restore it from a backup, or move it aside "
        f"(mv {path} {path}.damaged) to start a new store, which no longer lists the earlier runs and model "
        "versions. The warehouse, pool snapshots and checkpoints are separate files and are untouched."
    )


def check_store_file(path: Path) -> None:
    """Refuse a store file that cannot hold an SQLite database before MLflow retries it for minutes."""
    if path.is_dir():
        raise damaged_store(path, "it is a directory, not an SQLite file")
    if path.parent.exists() and not path.parent.is_dir():
        raise damaged_store(path, f"{path.parent} is a file, not a folder")
    if path.is_file():
        if not os.access(path, os.R_OK | os.W_OK):
            raise damaged_store(path, "it is not readable and writable by this user")
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_HEADER))
        if head and head != _SQLITE_HEADER:
            raise damaged_store(path, "it is not an SQLite database file")
    elif path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        raise damaged_store(path, f"its folder {path.parent} is not writable by this user")


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
