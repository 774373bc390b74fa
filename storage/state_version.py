"""The state folder's stamp: which versions of the warehouse layout, the records and the training schedule it holds.

A state folder is continued by later commands (`coevolve evolve` resumes after its last finished round), so
a folder written by an older version of this code must be refused before any work, not half-continued: a
run trained with another schedule has checkpoints that lack what this one resumes (the optimizer state),
and rounds recorded with other records would mix with this code's. Two stamps say what a folder holds:

- ``<state_dir>/state.json``: the folder's versions, ``{"layout": 3, "records": 2, "schedule": 2, ...}``
  (storage/layouts.py lists every version and what it means), written when a command first opens a new
  folder or an unstamped one whose runs all match this code;
- ``versions`` in each run's record in the warehouse (``catalog/runs/<run>.json``, written by
  `RoundRecords.ensure_run`): the record and schedule versions that run was made with.

A folder made before the stamps existed is judged by what its warehouse records: a run whose recorded
configuration has no ``training.batches_per_round`` was trained with schedule 1 (one batch a round, no
optimizer state saved), and a round record without its ``settings`` was written with records of version 1.

`check_state` runs before any work of `coevolve evolve`, `coevolve round` and every round flow: it reads
two small JSON files (every run record once, for an unstamped folder) and writes only the stamp of a
folder it accepts.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from coevolve.config import PipelineConfig
from coevolve.console import shown
from coevolve.errors import ConfigError, DataError
from coevolve.run_settings import changed_settings, round_settings
from storage.catalog import Catalog, record_time
from storage.layouts import LATEST_RECORDS, LATEST_SCHEDULE, LATEST_VERSION, SCHEDULES
from storage.tables import TableFiles
from storage.warehouse import Warehouse

STATE_FILE = "state.json"

# What each stamped version is called in a message, and what its versions mean.
_NAMES = {"layout": "warehouse layout", "records": "record version", "schedule": "training schedule"}
_SCHEDULES: dict[int, str] = dict(SCHEDULES)


def current_versions() -> dict[str, int]:
    """The versions this code writes and continues: the folder's stamp."""
    return {"layout": LATEST_VERSION, "records": LATEST_RECORDS, "schedule": LATEST_SCHEDULE}


def stamp_path(config: PipelineConfig) -> Path:
    return config.state_dir / STATE_FILE


def run_versions(run: dict[str, Any] | None, rounds: list[dict[str, Any]]) -> dict[str, int]:
    """The record and schedule versions of a run: its record's stamp, or what its records show when unstamped.

    The inference knows the one change an unstamped run can predate: the training schedule of
    ``training.batches_per_round`` steps (schedule 2, whose configuration names that field) and round records
    that hold their settings (records 2).
    """
    if _stamped(run):
        stamped = (run or {})["versions"]
        return {"records": int(stamped["records"]), "schedule": int(stamped["schedule"])}
    training = ((run or {}).get("config") or {}).get("training")
    schedule = 1 if isinstance(training, dict) and "batches_per_round" not in training else LATEST_SCHEDULE
    records = 1 if any("settings" not in r for r in rounds) else LATEST_RECORDS
    return {"records": records, "schedule": schedule}


def _stamped(run: dict[str, Any] | None) -> bool:
    """Whether a run's record carries its versions (`RoundRecords.ensure_run` writes them)."""
    stamped = (run or {}).get("versions")
    return isinstance(stamped, dict) and all(isinstance(stamped.get(k), int) for k in ("records", "schedule"))


def check_state(config: PipelineConfig) -> None:
    """Refuse a state folder or run made with other versions than this code's, before anything is written.

    Accepts a new folder and one whose stamp (or, unstamped, every run it records) matches this code, and
    stamps such a folder when it has no stamp yet. Raises DataError, one line naming the versions and a new
    state folder as the way on, when the folder's stamp, a run of an unstamped folder or the configured run
    differs; nothing is written then.
    """
    stamp = _read_stamp(config)
    current = current_versions()
    if stamp is not None:
        found = {k: stamp.get(k) for k in current}
        if found != current:
            raise _refusal(config, "was stamped", found)
    root = config.warehouse_path
    files = TableFiles.open(root, config.warehouse.storage_options)
    if not files.exists(Catalog(files).layout_path()):
        if stamp is None and not files.exists(files.path):
            _write_stamp(config)  # a new state folder and warehouse: this code makes everything in them
        # Otherwise not a warehouse this code wrote (another program's files, an interrupted migrate): the
        # warehouse refuses it, naming the way on, when the round opens it. Nothing is stamped until then.
        return
    rounds: dict[str, list[dict[str, Any]]] = {}
    with Warehouse(root, read_only=True, storage_options=config.warehouse.storage_options) as wh:
        catalog = wh.catalog
        if stamp is None:  # every run the folder holds: it is stamped only when all of them match
            runs = {r["run_id"]: r for r in catalog.records("runs")}
            for record in catalog.records("rounds"):
                rounds.setdefault(record["run_id"], []).append(record)
        else:
            # A stamped folder was checked when it was stamped; its configured run is checked again (its record
            # alone once stamped), since a run written by other code (a converted warehouse) may have joined it.
            run = catalog.get(catalog.run_path(config.run_id))
            runs = {config.run_id: run} if run is not None else {}
            rounds[config.run_id] = [] if _stamped(run) else catalog.records("rounds", config.run_id)
    for run_id in sorted(set(runs) | set(rounds)):
        versions = run_versions(runs.get(run_id), rounds.get(run_id, []))
        if any(versions[k] != current[k] for k in versions):
            raise _refusal(config, f"holds run {run_id!r}, made", versions)
    if stamp is None:
        _write_stamp(config)


def finished_round_notice(config: PipelineConfig, round_: int) -> str | None:
    """What `coevolve round --round R` prints instead of running a finished round; None to run it.

    Checks the state folder first (`check_state`). A finished round is never opened again: its records
    are its result, and a configuration with more training steps would add steps to a round recorded as
    finished. Reads the round's record only.
    """
    check_state(config)
    root = config.warehouse_path
    files = TableFiles.open(root, config.warehouse.storage_options)
    if not files.exists(Catalog(files).layout_path()):
        return None  # no round recorded yet (or no warehouse this code wrote, which the round refuses)
    with Warehouse(root, read_only=True, storage_options=config.warehouse.storage_options) as wh:
        record = wh.finished_round(config.run_id, round_)
    if record is None:
        return None
    return (
        f"round {round_} of run {config.run_id!r} finished at {record.get('finished_at') or '?'} UTC and is never "
        "run again; nothing was done (coevolve status shows its results)"
    )


def refuse_other_finished_run(config: PipelineConfig, finished: int) -> None:
    """`refuse_other_settings` for the newest of a run's ``finished`` rounds: what `coevolve evolve` checks before
    it says a finished run has nothing to run."""
    if finished <= 0:
        return
    with Warehouse(config.warehouse_path, read_only=True, storage_options=config.warehouse.storage_options) as wh:
        record = wh.finished_round(config.run_id, finished - 1)
    if record is not None:
        refuse_other_settings(config, finished - 1, record)


def refuse_other_settings(config: PipelineConfig, round_: int, record: dict[str, Any]) -> None:
    """Raise ConfigError, in one line, when finished round ``round_`` (its ``record``) was run with other settings
    than ``config``'s: its results answer for that configuration (another environment, policy or schedule), not
    for this one, so the command must not say the work is done.

    A round recorded before rounds recorded their settings is taken as it is.
    """
    recorded = record.get("settings")
    if recorded is None:
        return
    changed = changed_settings(recorded, round_settings(config))
    if changed:
        raise ConfigError(
            f"run {config.run_id!r} in {shown(config.state_dir)} finished round {round_} with other settings "
            f"({changed}), so its rounds do not answer for this configuration; give it a state folder or run id of "
            "its own: --set state_dir=DIR or --set run_id=NAME"
        )


def _read_stamp(config: PipelineConfig) -> dict[str, Any] | None:
    path = stamp_path(config)
    try:
        stamp = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise _damaged_stamp(path, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(stamp, dict) or not all(isinstance(stamp.get(k), int) for k in current_versions()):
        raise _damaged_stamp(path, "not a JSON object with an integer layout, records and schedule")
    return stamp


def _damaged_stamp(path: Path, detail: str) -> DataError:
    detail = " ".join(detail.split())[:200]
    return DataError(
        f"State folder stamp {path} is damaged ({detail}). Move it aside (mv {path} {path}.damaged): the next "
        "command stamps the folder again from the runs its warehouse records."
    )


def _write_stamp(config: PipelineConfig) -> None:
    """``state.json`` written whole (a temporary file renamed onto it): a reader never sees half a stamp."""
    path = stamp_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {**current_versions(), "stamped_at": record_time()}
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(stamp, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _refusal(config: PipelineConfig, holder: str, found: dict[str, Any]) -> DataError:
    """One line: what the folder holds, what this code continues, and the way on that works (a new folder)."""
    current = current_versions()
    differ = [k for k in current if k in found and found[k] != current[k]]

    def named(k: str) -> str:
        meaning = _SCHEDULES.get(found[k]) if k == "schedule" else None
        known = f" ({meaning})" if meaning else (" (newer than this code knows)" if _newer(found[k], k) else "")
        return f"{_NAMES[k]} {found[k]}{known}"

    made = " and ".join(named(k) for k in differ)
    needs = " and ".join(f"{_NAMES[k]} {current[k]}" for k in differ)
    state = config.state_dir
    if config.warehouse.uri:
        # The runs live in the warehouse at warehouse.uri: a new state folder alone would find them again.
        fix = "Start a new state folder and warehouse (--set state_dir=NEW_FOLDER --set warehouse.uri=NEW_URI)"
    else:
        fix = "Start a new state folder (--set state_dir=NEW_FOLDER)"
    return DataError(
        f"State folder {state} {holder} with {made}; this code continues only {needs}. {fix}; nothing in {state} "
        "was changed."
    )


def _newer(value: Any, key: str) -> bool:
    return isinstance(value, int) and value > current_versions()[key]
