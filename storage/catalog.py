"""The warehouse's bookkeeping: runs, rounds and finished stages, one small JSON object per record.

Layout under the warehouse root::

    catalog/layout.json                                   the layout version (storage/layouts.py)
    catalog/runs/<run>.json                               one run and its configuration
    catalog/rounds/run_id=<run>/<round>.json              status, summary, flow run of one round
    catalog/stage_runs/run_id=<run>/round=<n>/<stage>.json  a finished stage and the output it recorded

Each record is written whole in one atomic step (rename on a filesystem, one PUT on an object store)
and read without any lock, so a reader can never hold up the pipeline and never sees half a record.
A record has one writer at a time: the stages of a round run one after another, under the run's lock.
A record commits what was written before it: a stage's record follows its rows, the round's
``finished`` record follows the version stage's record, and `Warehouse.clear_round` forgets stages
last-first before deleting their rows, so a stage is never marked finished without its rows.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from storage.tables import PLACEHOLDER_RUN, TableFiles


def record_time() -> str:
    """Now, as records store their times: UTC without a zone, as DuckDB reads a TIMESTAMP."""
    return datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")


class Catalog:
    """Reads and writes the bookkeeping records of one warehouse root."""

    def __init__(self, files: TableFiles) -> None:
        self.files = files
        self.dir = f"{files.path}/catalog"

    # -- paths ---------------------------------------------------------------------------------

    def layout_path(self) -> str:
        return f"{self.dir}/layout.json"

    def run_path(self, run_id: str) -> str:
        return f"{self.dir}/runs/{run_id}.json"

    def round_path(self, run_id: str, round_: int) -> str:
        return f"{self.dir}/rounds/run_id={run_id}/{int(round_)}.json"

    def stage_path(self, run_id: str, round_: int, stage: str) -> str:
        return f"{self.dir}/stage_runs/run_id={run_id}/round={int(round_)}/{stage}.json"

    def stage_paths(self, run_id: str, round_: int, stage: str) -> list[str]:
        """The records of ``stage`` in a round: its own, and those of its training steps after the first
        (``<stage>@<step>``, coevolve.stages.record_name), later steps first."""
        steps = f"{self.dir}/stage_runs/run_id={run_id}/round={int(round_)}/{stage}@*.json"
        try:
            found = self.files.fs.glob(steps)
        except FileNotFoundError:
            found = []
        number = re.compile(r"@(\d+)\.json$")
        later = sorted(found, key=lambda p: -int(m.group(1)) if (m := number.search(p)) else 0)
        return [*later, self.stage_path(run_id, round_, stage)]

    # -- records -------------------------------------------------------------------------------

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            with self.files.fs.open(path, "rb") as handle:
                return json.loads(handle.read())
        except FileNotFoundError:
            return None

    def put(self, path: str, record: dict[str, Any]) -> None:
        self.files.write_bytes(path, json.dumps(record, default=str, sort_keys=True).encode())

    def put_placeholder(self, kind: str) -> None:
        """Writes the placeholder record of ``kind`` (runs, rounds, stage_runs)."""
        path = {
            "runs": self.run_path(PLACEHOLDER_RUN),
            "rounds": self.round_path(PLACEHOLDER_RUN, 0),
            "stage_runs": self.stage_path(PLACEHOLDER_RUN, 0, PLACEHOLDER_RUN),
        }[kind]
        self.put(path, {"run_id": PLACEHOLDER_RUN})

    def remove(self, path: str) -> None:
        self.files.delete([path])

    def records(self, kind: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every record of ``kind`` (runs, rounds, stage_runs), optionally of one run."""
        if kind == "runs":
            pattern = f"{self.dir}/runs/{run_id or '*'}.json"
        elif kind == "rounds":
            pattern = f"{self.dir}/rounds/run_id={run_id or '*'}/*.json"
        else:
            pattern = f"{self.dir}/stage_runs/run_id={run_id or '*'}/*/*.json"
        try:
            paths = sorted(self.files.fs.glob(pattern))
        except FileNotFoundError:
            return []
        found = []
        for path in paths:
            record = self.get(path)
            # None: removed between the listing and the read.
            if record is not None and record.get("run_id") != PLACEHOLDER_RUN:
                found.append(record)
        return found
