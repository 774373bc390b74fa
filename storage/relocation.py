"""A state folder copied, moved or restored elsewhere: the paths its stores recorded follow it.

The stores under ``state_dir`` name files by absolute path: MLflow's SQLite store holds the experiment's
artifact location, each run's artifact URI, each model version's source, the parent checkpoint in the
lineage tags, the pool files of the dataset inputs and ``state_dir`` among the params; the warehouse's
records name checkpoints. Opened from a new place, those would still point at the old one: a later
round would read the old folder's checkpoints and log into its artifacts. So each store is re-rooted
when it is opened: the root it was made at (the ``state_dir`` it recorded) is compared with where it
is now, and every recorded value under the old root is rewritten under the new one, which makes a copy
a complete run of its own. Values outside the old root (a model folder elsewhere) are left as they
are, and so are stores that do not live inside the state folder: a tracking server, an MLflow database
elsewhere, a warehouse on an object store.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from filelock import FileLock

from coevolve.errors import InfrastructureError
from storage.mlflow_store import damaged_store

if TYPE_CHECKING:  # the tracker imports this module without the warehouse's data libraries
    from storage.catalog import Catalog

# The folder of MLflow artifacts under a state folder (PipelineConfig.artifacts_dir).
ARTIFACTS_FOLDER = "mlartifacts"
# Held while one process re-roots a state folder's records, so a round starting beside it waits.
LOCK_NAME = "relocation.lock"

Rewrite = list[tuple[str, str]]


def _under(value: str, root: str) -> bool:
    return value == root or value.startswith(root + "/")


def rewrites(old: Path, new: Path) -> Rewrite:
    """The prefixes a value under ``old`` starts with, as a path and as a file URI, with their replacements.

    A URI's replacement is made from the resolved new root, as the tracker names its artifact folder.
    """
    return [(str(old), str(new)), (old.as_uri(), new.resolve().as_uri())]


def reroot_text(value: str, pairs: Rewrite) -> str:
    """``value`` moved from an old root to the new one, when it is a path or file URI under the old root."""
    for before, after in pairs:
        # A copy made inside its original: a value already under the new root has moved.
        if _under(value, after) and _under(after, before) and after != before:
            return value
        if _under(value, before):
            return after + value[len(before) :]
    return value


def reroot_data(value: Any, pairs: Rewrite) -> Any:
    """Every string in ``value`` (nested mappings and lists, as a JSON record holds them) re-rooted."""
    if isinstance(value, dict):
        return {key: reroot_data(item, pairs) for key, item in value.items()}
    if isinstance(value, list):
        return [reroot_data(item, pairs) for item in value]
    if isinstance(value, str):
        return reroot_text(value, pairs)
    return value


def _reroot_cell(value: str, pairs: Rewrite) -> str:
    """A store cell: a path or URI, or JSON holding them (MLflow's dataset sources)."""
    if value[:1] in ("{", "["):
        try:
            data = json.loads(value)
        except ValueError:
            pass
        else:
            moved = reroot_data(data, pairs)
            return value if moved == data else json.dumps(moved)
    return reroot_text(value, pairs)


def _same_place(old: Path, new: Path) -> bool:
    """The same folder under another name (a symlink), or the very same path."""
    return old == new or old.resolve() == new.resolve()


# -- MLflow ------------------------------------------------------------------------------------------------


def _text_columns(con: sqlite3.Connection) -> Iterator[tuple[str, str]]:
    tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        for column in con.execute(f'PRAGMA table_info("{table}")'):
            kind = str(column[2] or "").upper()
            if not kind or any(word in kind for word in ("CHAR", "TEXT", "CLOB")):
                yield table, str(column[1])


def _recorded_mlflow_roots(con: sqlite3.Connection) -> set[Path]:
    """The state folders the store was used from: each experiment's artifact folder's parent, each run's state_dir."""
    names = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    roots: set[Path] = set()
    if "experiments" in names:
        for (location,) in con.execute("SELECT artifact_location FROM experiments"):
            parts = urlsplit(str(location or ""))
            if parts.scheme == "file" and Path(unquote(parts.path)).name == ARTIFACTS_FOLDER:
                roots.add(Path(unquote(parts.path)).parent)
    if "params" in names:
        for (value,) in con.execute("SELECT DISTINCT value FROM params WHERE key = 'state_dir'"):
            if value and os.path.isabs(str(value)):
                roots.add(Path(str(value)))
    return roots


def follow_moved_mlflow_store(store: Path, artifacts_dir: Path) -> list[Path]:
    """Re-roots an MLflow SQLite store that lives in a state folder opened from a new place; returns the old roots.

    Only a store inside the state folder (``state_dir/mlflow.db`` beside ``state_dir/mlartifacts``) is
    touched: one elsewhere may be shared by state folders in several places. The rows are rewritten in
    one transaction, so a process that opens the store at the same time sees them all moved or none.
    """
    new = Path(os.path.abspath(artifacts_dir)).parent
    if not store.is_file() or store.resolve().parent != new.resolve():
        return []
    try:
        with contextlib.closing(sqlite3.connect(store, timeout=60, isolation_level=None)) as con:
            olds = sorted(root for root in _recorded_mlflow_roots(con) if not _same_place(root, new))
            if not olds:
                return []
            con.execute("BEGIN IMMEDIATE")
            try:
                olds = sorted(root for root in _recorded_mlflow_roots(con) if not _same_place(root, new))
                pairs = [pair for old in olds for pair in rewrites(old, new)]
                for table, column in list(_text_columns(con)):
                    needles = " OR ".join(f'instr("{column}", ?) > 0' for _ in pairs)
                    found = con.execute(
                        f'SELECT rowid, "{column}" FROM "{table}" WHERE {needles}', [before for before, _ in pairs]
                    ).fetchall()
                    for rowid, value in found:
                        moved = _reroot_cell(str(value), pairs)
                        if moved != value:
                            con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', (moved, rowid))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise InfrastructureError(f"MLflow store {store} is busy: {exc}") from exc
        raise damaged_store(store, str(exc).splitlines()[0]) from exc
    except sqlite3.DatabaseError as exc:
        raise damaged_store(store, str(exc).splitlines()[0]) from exc
    return olds


# -- the warehouse's records -------------------------------------------------------------------------------


def follow_moved_records(catalog: Catalog, state_dir: Path) -> list[Path]:
    """Re-roots the warehouse records of every run whose recorded ``state_dir`` is another place; returns those.

    Only a warehouse inside the state folder is touched (one elsewhere, on an object store or a shared
    folder, serves state folders wherever they are). A run's record, which names its root, is rewritten
    last, so a process stopped half-way re-roots the rest when it next opens the folder.
    """
    new = Path(os.path.abspath(state_dir))
    if not catalog.files.is_local or not _under(os.path.realpath(catalog.files.path), os.path.realpath(new)):
        return []
    if not _moved_runs(catalog, new):
        return []  # the usual case: nothing to do, and no lock file made
    moved: list[Path] = []
    with FileLock(str(new / LOCK_NAME)):
        # Again under the lock: another process may have re-rooted them meanwhile.
        for run_id, old in _moved_runs(catalog, new):
            pairs = rewrites(old, new)
            for path in [*_run_record_paths(catalog, run_id), catalog.run_path(run_id)]:
                data = catalog.get(path)
                if data is not None and (rerooted := reroot_data(data, pairs)) != data:
                    catalog.put(path, rerooted)
            moved.append(old)
    return moved


def _moved_runs(catalog: Catalog, new: Path) -> list[tuple[str, Path]]:
    """The runs whose record names another state folder than ``new``, with that folder."""
    found = []
    for record in catalog.records("runs"):
        old = (record.get("config") or {}).get("state_dir")
        if old and os.path.isabs(str(old)) and not _same_place(Path(old), new):
            found.append((str(record["run_id"]), Path(old)))
    return found


def _run_record_paths(catalog: Catalog, run_id: str) -> list[str]:
    found: list[str] = []
    for pattern in (
        f"{catalog.dir}/rounds/run_id={run_id}/*.json",
        f"{catalog.dir}/stage_runs/run_id={run_id}/*/*.json",
    ):
        try:
            found.extend(sorted(catalog.files.fs.glob(pattern)))
        except FileNotFoundError:
            pass
    return found
