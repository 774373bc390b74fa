"""The check of every store a round writes, run before the round's first stage.

A round computes for hours before its last stage writes the MLflow store, and its mine and version
stages read the run's earlier records and files late too: a damaged store found only then costs the
whole round. `check_round_stores` reads them all first, so a damaged one stops the round at its start
with one line naming the file and the way back:

- the MLflow store: a local SQLite file is checked page by page (`storage.mlflow_store.check_tracking_store`),
  then opened as the version stage opens it (`storage.tracking.Tracker`, which also reaches a server);
- the warehouse (opened by the caller, which checks its root and layout record): every catalog record of the
  run (its run, round and stage records) parses, and every table file of the run, and of the shared tasks
  table, has a readable Parquet footer. A damaged page inside a file is found when the file is read, as before.
"""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.optional import optional_module
from storage.columns import SCHEMAS
from storage.mlflow_store import check_tracking_store

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

# MLflow is imported only when the check gets to the store (over a second).
if TYPE_CHECKING:
    import storage.tracking as tracking
else:
    tracking = optional_module("storage.tracking")


def check_round_stores(config: PipelineConfig, wh: Warehouse) -> None:
    """Refuse, before the round's first stage, any store of ``config``'s run that the round writes or reads back."""
    check_run_records(wh, config.run_id)
    check_run_files(wh, config.run_id)
    check_tracking_store(config.mlflow_tracking_uri)
    tracking.Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)


def check_run_records(wh: Warehouse, run_id: str) -> None:
    """Every catalog record of the run is a JSON object of its kind; DataError naming the first that is not."""
    catalog = wh.catalog.dir
    patterns = (
        f"{catalog}/runs/{run_id}.json",
        f"{catalog}/rounds/run_id={run_id}/*.json",
        f"{catalog}/stage_runs/run_id={run_id}/*/*.json",
    )
    for pattern in patterns:
        try:
            paths = sorted(wh.files.fs.glob(pattern))
        except FileNotFoundError:
            continue
        for path in paths:
            try:
                with wh.files.fs.open(path, "rb") as handle:
                    record = json.loads(handle.read())
            except FileNotFoundError:
                continue  # replaced between the listing and the read
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise _damaged_record(wh, path, f"not JSON: {exc}") from exc
            required = "output" if "/stage_runs/" in path else "status" if "/rounds/" in path else "run_id"
            if not isinstance(record, dict) or required not in record:
                raise _damaged_record(wh, path, f"not a record with {required!r}")


def _damaged_record(wh: Warehouse, path: str, reason: str) -> DataError:
    """The error of a damaged catalog record, with what running its round again writes in its place."""
    relative = posixpath.relpath(path, wh.catalog.dir).split("/")
    moved = f"move it aside (mv {path} {path}.damaged)"
    if relative[0] == "runs":
        again = "run the round again: its prepare stage writes the run's record anew"
    else:
        round_ = relative[2].removeprefix("round=").removesuffix(".json") if len(relative) > 2 else "R"
        if relative[0] == "rounds":
            again = f"run `coevolve round --round {round_}` again: it writes the round's record anew"
        else:
            stage = posixpath.splitext(relative[-1])[0]
            again = f"run `coevolve round --round {round_}` again: its {stage} stage runs again and records itself anew"
    return DataError(
        f"Warehouse record {wh.files.url(path)} is damaged ({' '.join(reason.split())[:200]}); restore it from a "
        f"backup, or {moved} and {again}. The table files and the other records are untouched."
    )


def check_run_files(wh: Warehouse, run_id: str) -> None:
    """Every table file of the run, and every tasks file, has a readable Parquet footer; DataError naming one that
    has not (`storage.tables.TableFiles.damaged`, with the stage to run again)."""
    for table in SCHEMAS:
        paths = wh.files.files(table) if table == "tasks" else wh.files.files(table, run_id)
        for path in paths:
            try:
                with wh.files.fs.open(path, "rb") as handle:
                    pq.read_metadata(handle)
            except FileNotFoundError:
                continue  # replaced between the listing and the read
            except (pa.ArrowInvalid, OSError) as exc:
                raise wh.files.damaged(path, str(exc)) from exc
