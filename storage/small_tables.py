"""The small tables: signals, candidates, evaluations, pool membership and tasks.

Signals, candidates and evaluations keep one file per partition that a write merges into by key
(a row written again replaces the stored one); a pool is one file per (run, round); tasks are
content-addressed, in files named after the ids they hold.
"""

from __future__ import annotations

import json

import pyarrow as pa

from coevolve.errors import DataError
from coevolve.records import Candidate, Signal, Task
from storage.columns import SCHEMAS
from storage.tables import part_name
from storage.views import WarehouseViews

# Keys a write to a small table merges by: a row written again replaces the stored one.
_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "signals": ("signal_id",),
    "candidates": ("task_id", "signal_key"),
    "evaluations": ("split", "task_id"),
}


class SmallTables(WarehouseViews):
    """Writes and reads signals, candidates, evaluations, pools and tasks."""

    def _merge(self, table: str, run_id: str, round_: int, rows: pa.Table, file: str = "rows") -> None:
        self._writable()
        keys = _MERGE_KEYS[table]
        target = f"{self.files.partition_dir(table, run_id, round_)}/{file}.parquet"
        new_keys = set(zip(*(rows.column(k).to_pylist() for k in keys), strict=True))
        kept = pa.Table.from_pylist([], schema=SCHEMAS[table])
        if self.files.exists(target):
            old = self.files.read(target).cast(SCHEMAS[table])
            keep = [
                i
                for i, key in enumerate(zip(*(old.column(k).to_pylist() for k in keys), strict=True))
                if key not in new_keys
            ]
            kept = old.take(pa.array(keep, pa.int64()))
        self.files.write(target, pa.concat_tables([kept, rows.cast(SCHEMAS[table])]))

    def write_signals(self, signals: list[Signal]) -> None:
        by_partition: dict[tuple[str, int], dict[str, Signal]] = {}
        for s in signals:
            by_partition.setdefault((s.run_id, s.round), {})[s.signal_id] = s
        for (run_id, round_), latest in by_partition.items():
            rows = pa.Table.from_pylist(
                [{"signal_id": sid, "kind": s.kind, "trajectory_id": s.trajectory_id, "task_id": s.task_id,
                  "evidence": json.dumps(s.evidence, default=str)} for sid, s in latest.items()],
                schema=SCHEMAS["signals"],
            )  # fmt: skip
            self._merge("signals", run_id, round_, rows)

    def signals(self, run_id: str, round_: int) -> list[Signal]:
        """The signals the mine stage stored for (run, round), in signal id order."""
        rows = self._partition("signals", run_id, round_).to_pylist()
        return [
            Signal(run_id=run_id, round=round_, kind=r["kind"], trajectory_id=r["trajectory_id"], task_id=r["task_id"],
                   evidence=json.loads(r["evidence"]))
            for r in sorted(rows, key=lambda r: r["signal_id"])
        ]  # fmt: skip

    def write_candidates(self, run_id: str, round: int, candidates: list[Candidate]) -> None:
        """Writes candidates (with verdicts once validated), keyed by (task, signal) within the round.

        When one signal produced the same task twice, the first copy's row is kept: validation judges
        candidates in order, so the first copy holds the verdict that decided whether the task entered
        the pool (a later copy is only rejected as its duplicate).
        """
        if not candidates:
            return
        latest: dict[tuple[str, str], Candidate] = {}
        for c in candidates:
            latest.setdefault((c.task.task_id, c.signal_id or ""), c)
        rows = pa.Table.from_pylist(
            [{"task_id": key[0], "signal_key": key[1], "signal_id": c.signal_id, "origin": c.task.provenance.origin,
              "accepted": None if c.verdict is None else c.verdict.accepted,
              "reason": None if c.verdict is None else c.verdict.reason,
              "task": json.dumps(c.task.to_dict(), default=str)} for key, c in latest.items()],
            schema=SCHEMAS["candidates"],
        )  # fmt: skip
        self._merge("candidates", run_id, round, rows)

    def write_evaluations(self, run_id: str, round: int, split: str, rows: list[tuple[str, bool, float, str]]) -> None:
        """Writes (task_id, success, reward, trajectory_id) rows of one evaluation split."""
        if not rows:
            return
        latest = {row[0]: row for row in rows}
        table = pa.Table.from_pylist(
            [{"split": split, "task_id": tid, "success": bool(r[1]), "reward": float(r[2]), "trajectory_id": r[3]}
             for tid, r in latest.items()],
            schema=SCHEMAS["evaluations"],
        )  # fmt: skip
        self._merge("evaluations", run_id, round, table, file=f"split-{split}")

    def evaluation_rows(self, run_id: str, round: int, split: str) -> list[tuple[str, bool, float, str]]:
        """(task_id, success, reward, trajectory_id) rows of one evaluation split of (run, round),
        as write_evaluations takes them."""
        rows = self._partition(
            "evaluations", run_id, round, ["split", "task_id", "success", "reward", "trajectory_id"]
        ).to_pylist()
        return [
            (r["task_id"], bool(r["success"]), float(r["reward"]), r["trajectory_id"])
            for r in rows
            if r["split"] == split
        ]

    def evaluation_outcomes(self, run_id: str, round: int, split: str) -> dict[str, bool]:
        """task_id -> success of one evaluation split of (run, round)."""
        rows = self._partition("evaluations", run_id, round, ["split", "task_id", "success"]).to_pylist()
        return {r["task_id"]: bool(r["success"]) for r in rows if r["split"] == split}

    def set_pool(self, run_id: str, round: int, task_ids: list[str]) -> None:
        """Replaces the pool of (run, round) with task_ids, keeping their order; duplicates are dropped."""
        self._writable()
        unique = list(dict.fromkeys(task_ids))
        table = pa.Table.from_pydict(
            {"position": list(range(len(unique))), "task_id": unique}, schema=SCHEMAS["pool_membership"]
        )
        self.files.write(f"{self.files.partition_dir('pool_membership', run_id, round)}/members.parquet", table)

    def write_tasks(self, tasks: list[Task]) -> None:
        """Writes tasks by content id, in a file named after the ids it holds."""
        self._writable()
        if not tasks:
            return
        latest = {t.task_id: t for t in tasks}
        table = pa.Table.from_pylist(
            [{"task_id": tid, "environment": t.environment, "origin": t.provenance.origin, "round": t.provenance.round,
              "parent_trajectory_id": t.provenance.parent_trajectory_id, "signal_id": t.provenance.signal_id,
              "content_hash": t.content_hash, "task": json.dumps(t.to_dict(), default=str), "tools": t.tools}
             for tid, t in latest.items()],
            schema=SCHEMAS["tasks"],
        )  # fmt: skip
        self.files.write(f"{self.files.table_dir('tasks')}/{part_name(latest)}.parquet", table)

    def pool(self, run_id: str, round: int) -> list[Task]:
        """The tasks in the pool of (run, round), in the order set_pool was given."""
        members = self._partition("pool_membership", run_id, round).to_pylist()
        if not members:
            return []
        wanted = {m["task_id"] for m in members}
        found: dict[str, Task] = {}
        for path in reversed(self.files.files("tasks")):
            table = self.files.read(path, ["task_id", "task"])
            for tid, text in zip(table.column("task_id").to_pylist(), table.column("task").to_pylist(), strict=True):
                if tid in wanted and tid not in found:
                    found[tid] = Task.from_dict(json.loads(text))
            if len(found) == len(wanted):
                break
        missing = wanted - set(found)
        if missing:
            raise DataError(
                f"Pool {round} of run {run_id!r} names {len(missing)} task(s) the warehouse {self.root} does not hold "
                f"(e.g. {sorted(missing)[0]}); the files under tables/tasks were removed or damaged."
            )
        return [found[m["task_id"]] for m in sorted(members, key=lambda m: m["position"])]
