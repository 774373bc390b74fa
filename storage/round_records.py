"""The warehouse's bookkeeping: runs, rounds and finished stages, as catalog records (storage/catalog.py)."""

from __future__ import annotations

import json
from typing import Any

from coevolve.errors import DataError
from coevolve.records import RoundSummary
from coevolve.redact import redact
from storage.catalog import record_time
from storage.layouts import LATEST_RECORDS, LATEST_SCHEDULE
from storage.views import WarehouseViews

_STAGE_COSTS = """
SELECT stage, seconds, tokens_generated, tokens_per_s, episodes, optimizer_steps, peak_rss_mib, peak_gpu_mib
FROM v_stage_cost WHERE run_id = ? AND round = ? AND seconds IS NOT NULL
"""
_TRAINING_STEPS = """
SELECT round, step, checkpoint, trained_from, trained_on, optimizer_resumed_from, global_step
FROM v_training_steps WHERE run_id = ? ORDER BY round, step
"""


class RoundRecords(WarehouseViews):
    """Runs with their configuration, rounds with their status and summary, stages with their output."""

    def ensure_run(self, run_id: str, config: dict[str, Any]) -> None:
        """Records the run and its configuration; the creation time of an existing run is kept.

        The record is stamped with the record and schedule versions the run is made with (``versions``,
        storage/state_version.py), which a later command checks before continuing the run.
        """
        self._writable()
        existing = self.catalog.get(self.catalog.run_path(run_id)) or {}
        # Anyone who can query the warehouse reads this record: a credential that reached the configuration is masked.
        record = {"run_id": run_id, "created_at": existing.get("created_at", record_time()), "config": redact(config)}
        record["versions"] = existing.get("versions") or {"records": LATEST_RECORDS, "schedule": LATEST_SCHEDULE}
        self.catalog.put(self.catalog.run_path(run_id), record)

    def start_round(self, run_id: str, round: int, flow_run_id: str, settings: dict[str, Any] | None = None) -> None:
        """Marks a round running, with the settings that decide its results (``settings``).

        A round started before keeps its ``started_at`` and its stage records; one started with other
        ``settings`` is refused, naming the fields, since its recorded stages would mix with the new
        ones. A finished round is left as it is (running it again only reads its records back).
        """
        self._writable()
        path = self.catalog.round_path(run_id, round)
        existing = self.catalog.get(path) or {}
        if existing.get("status") == "finished":
            return
        recorded = existing.get("settings")
        if settings is not None and recorded is not None:
            changed = sorted(k for k in set(settings) | set(recorded) if settings.get(k) != recorded.get(k))
            if changed:
                shown = ", ".join(f"{k}: {recorded.get(k)!r} -> {settings.get(k)!r}" for k in changed[:6])
                raise DataError(
                    f"Round {round} of run {run_id!r} was started with other settings ({shown}); its recorded stages "
                    "would mix with this configuration's. Run it with the settings it was started with, or use a new "
                    f"run_id (or state_dir) for the new settings."
                )
        self.catalog.put(
            path,
            {"run_id": run_id, "round": round, "status": "running", "summary": None, "flow_run_id": flow_run_id,
             "started_at": existing.get("started_at") or record_time(), "finished_at": None,
             "settings": settings if settings is not None else recorded},
        )  # fmt: skip

    def finish_round(self, run_id: str, round: int, summary: RoundSummary) -> None:
        """Marks a round finished with its summary; written after the version stage's record."""
        self._writable()
        path = self.catalog.round_path(run_id, round)
        existing = self.catalog.get(path) or {}
        self.catalog.put(
            path,
            {"run_id": run_id, "round": round, "status": "finished", "summary": summary.to_dict(),
             "flow_run_id": summary.flow_run_id or existing.get("flow_run_id"),
             "started_at": existing.get("started_at") or record_time(), "finished_at": record_time(),
             "settings": existing.get("settings")},
        )  # fmt: skip

    def round_records(self, run_id: str) -> list[dict[str, Any]]:
        """The round records of a run (status, summary, started_at, finished_at), in round order."""
        return sorted(self.catalog.records("rounds", run_id), key=lambda r: r["round"])

    def mark_stage(
        self, run_id: str, round: int, stage: str, output: dict[str, Any], cost: dict[str, Any] | None = None
    ) -> None:
        """Records that a stage of a round finished, with the output a resumed round reuses and, beside it, what
        running it cost (``cost``: seconds, peak memory; tasks/stage_cost.py), which `v_stage_cost` shows."""
        self._writable()
        record = {"run_id": run_id, "round": round, "stage": stage, "finished_at": record_time(), "output": output}
        if cost is not None:
            record["cost"] = cost
        self.catalog.put(self.catalog.stage_path(run_id, round, stage), record)

    def stage_output(self, run_id: str, round: int, stage: str) -> dict[str, Any] | None:
        """The output recorded by mark_stage, or None when that stage has not finished."""
        record = self.catalog.get(self.catalog.stage_path(run_id, round, stage))
        return None if record is None else record["output"]

    def stage_costs(self, run_id: str, round: int) -> dict[str, dict[str, Any]]:
        """What each recorded stage of a round cost, by record name: its `v_stage_cost` row (seconds, tokens
        generated and per second, episodes, optimizer steps, peak memory) without its NULLs; stages recorded
        without a cost (by older versions) are left out."""
        con = self.connect()
        try:
            cursor = con.execute(_STAGE_COSTS, [run_id, round])
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            con.close()
        return {row.pop("stage"): {k: v for k, v in row.items() if v is not None} for row in rows}

    def training_steps(self, run_id: str) -> list[dict[str, Any]]:
        """Every recorded training step of a run in the order it trained (the rows of ``v_training_steps``):
        round, step, the checkpoint it wrote, the one it trained (``trained_from``), which stored
        trajectories it trained on (``trained_on``), the optimizer state it resumed and its global step."""
        con = self.connect()
        try:
            cursor = con.execute(_TRAINING_STEPS, [run_id])
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            con.close()
        return [{**row, "trained_on": json.loads(row["trained_on"]) if row["trained_on"] else None} for row in rows]

    def rounds(self, run_id: str) -> list[RoundSummary]:
        """Summaries of the finished rounds of a run, in round order."""
        records = [r for r in self.catalog.records("rounds", run_id) if r.get("summary") is not None]
        return [RoundSummary(**r["summary"]) for r in sorted(records, key=lambda r: r["round"])]

    def finished_round(self, run_id: str, round: int) -> dict[str, Any] | None:
        """The record of a finished round (status, summary, finished_at), None while it is not finished.

        A finished round is never run again: what it recorded is its result, and a configuration with more
        training steps than it ran would otherwise add steps to a round whose record says it is finished.
        """
        record = self.catalog.get(self.catalog.round_path(run_id, round))
        return record if record is not None and record.get("status") == "finished" else None

    def round_status(self, run_id: str, round: int) -> str | None:
        """'running', 'finished', or None when the round was never started."""
        record = self.catalog.get(self.catalog.round_path(run_id, round))
        return None if record is None else record["status"]
