"""The DuckDB warehouse: every record the pipeline produces, and the SQL to read it back.

Concurrency: DuckDB lets one process hold a file read-write, or any number of processes hold it
read-only, never both. So `Warehouse` never keeps a connection open: each call opens the file,
runs one transaction and closes it. Analysts (``Warehouse(path, read_only=True)`` or the duckdb
CLI with ``-readonly``) get in between two writes; either side that finds the file locked retries
with backoff for ``lock_timeout_s`` and then raises InfrastructureError (which Prefect retries).

Writes are idempotent: each batch deletes the rows with the same keys and inserts the new ones
in one transaction, so re-running a stage replaces its rows instead of duplicating them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from coevolve.errors import DataError, InfrastructureError
from coevolve.records import Candidate, RoundSummary, Signal, Step, Task, ToolCall, Trajectory
from storage.migrations import LATEST_VERSION, MIGRATIONS

# Stage order of one round; clear_round drops a stage and every stage after it.
STAGES: tuple[str, ...] = ("rollout", "mine", "synthesize", "validate", "update", "evaluate", "version")

# Rows a stage writes for its own round, deleted when that stage is cleared for a re-run.
_STAGE_TABLES: dict[str, tuple[str, ...]] = {
    "rollout": ("steps", "trajectories"),
    "mine": ("signals",),
    "synthesize": ("candidates",),
    "evaluate": ("evaluations",),
}

# Trajectories and steps are the bulk of the warehouse; their batches are built as Arrow columns,
# which DuckDB scans without a copy (a Polars frame built from per-row dicts costs ~10x more).
_TRAJECTORY_SCHEMA = pa.schema([
    ("trajectory_id", pa.string()), ("run_id", pa.string()), ("round", pa.int32()), ("task_id", pa.string()),
    ("sample", pa.int32()), ("reward", pa.float64()), ("success", pa.bool_()), ("finish_reason", pa.string()),
    ("num_steps", pa.int32()), ("tool_sequence", pa.list_(pa.string())), ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())), ("completion_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float64())), ("duration_s", pa.float64()),
])  # fmt: skip
_STEP_SCHEMA = pa.schema([
    ("trajectory_id", pa.string()), ("step_index", pa.int32()), ("step_number", pa.int32()), ("turn", pa.int32()),
    ("model_text", pa.string()), ("calls", pa.string()), ("tool_names", pa.list_(pa.string())),
    ("observations", pa.list_(pa.string())), ("error", pa.string()), ("completion_tokens", pa.int32()),
])  # fmt: skip
_TASK_SCHEMA: dict[str, Any] = {
    "task_id": pl.String, "environment": pl.String, "origin": pl.String, "round": pl.Int32,
    "parent_trajectory_id": pl.String, "signal_id": pl.String, "content_hash": pl.String,
    "task": pl.String, "tools": pl.List(pl.String),
}


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


# What DuckDB says about a file whose bytes are not a database it wrote: foreign or random bytes,
# a truncated file, a block whose checksum no longer matches.
_DAMAGE_MARKERS = ("not a valid duckdb database", "could not read enough bytes", "corrupt database file")


def _is_damage_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _DAMAGE_MARKERS)


class Warehouse:
    """One DuckDB file holding runs, rounds, tasks, trajectories, signals and their views."""

    def __init__(self, path: Path | str, read_only: bool = False, lock_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.lock_timeout_s = lock_timeout_s
        self._closed = False
        if read_only and not self.path.exists():
            raise DataError(f"Warehouse {self.path} does not exist; run a round (or open it read-write) first.")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as con:
            if read_only:
                self._check_version(con)
            else:
                self._migrate(con)

    # -- connection handling -------------------------------------------------------------------

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._closed:
            raise DataError(f"Warehouse {self.path} is closed.")
        deadline = time.monotonic() + self.lock_timeout_s
        delay = 0.02
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=self.read_only)
                break
            except duckdb.Error as exc:
                if _is_damage_error(exc):
                    raise self._damaged(exc) from exc
                if not _is_lock_error(exc):
                    raise DataError(f"Warehouse {self.path} cannot be opened: {exc}") from exc
                if time.monotonic() >= deadline:
                    raise InfrastructureError(
                        f"Warehouse {self.path} stayed locked by another process for {self.lock_timeout_s:.0f} s: {exc}"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            yield con
        except duckdb.Error as exc:
            # A damaged block may only show when a query reads it.
            if _is_damage_error(exc):
                raise self._damaged(exc) from exc
            raise
        finally:
            con.close()

    def _damaged(self, exc: Exception) -> DataError:
        return DataError(
            f"Warehouse {self.path} is damaged: it is not a DuckDB database this code can read ({str(exc).splitlines()[0]}). "
            f"Restore it from a backup, or move it aside (mv {self.path} {self.path}.damaged) to start a new warehouse, "
            "in which the run starts again from round 0. Pool snapshots, checkpoints and the MLflow store are "
            "separate files and are untouched."
        )

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self.read_only:
            raise DataError(f"Warehouse {self.path} was opened read-only; it cannot be written.")
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def close(self) -> None:
        """Marks the warehouse closed; no connection is held between calls."""
        self._closed = True

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ----------------------------------------------------------------------------------

    def _stored_version(self, con: duckdb.DuckDBPyConnection) -> int | None:
        exists = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
        ).fetchall()[0][0]
        if not exists:
            return None
        return con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchall()[0][0]

    def _refuse_newer(self, version: int) -> None:
        if version > LATEST_VERSION:
            raise DataError(
                f"Warehouse {self.path} has schema version {version}, but this code knows versions up to "
                f"{LATEST_VERSION}; upgrade the code (or use a new warehouse file) before opening it."
            )

    def _check_version(self, con: duckdb.DuckDBPyConnection) -> None:
        version = self._stored_version(con)
        if version is None:
            raise DataError(f"Warehouse {self.path} has no schema; open it read-write once to create it.")
        self._refuse_newer(version)
        if version < LATEST_VERSION:
            raise DataError(
                f"Warehouse {self.path} has schema version {version}, older than {LATEST_VERSION}; "
                "open it read-write once to migrate it."
            )

    def _migrate(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP)")
        current = self._stored_version(con) or 0
        self._refuse_newer(current)
        for version, sql in MIGRATIONS:
            if version <= current:
                continue
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(sql)
                con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, _now()])
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def schema_version(self) -> int:
        with self._connect() as con:
            return self._stored_version(con) or 0

    # -- writes ----------------------------------------------------------------------------------

    def ensure_run(self, run_id: str, config: dict[str, Any]) -> None:
        """Records the run and its configuration; the creation time of an existing run is kept."""
        with self._transaction() as con:
            con.execute(
                "INSERT INTO runs VALUES (?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET config = excluded.config",
                [run_id, _now(), json.dumps(config, default=str)],
            )

    def write_trajectories(self, trajs: list[Trajectory]) -> None:
        """Writes trajectories and their steps; a trajectory written again replaces the old one."""
        if not trajs:
            return
        latest = {t.trajectory_id: t for t in trajs}
        heads = list(latest.values())
        steps = [(tid, i, s) for tid, t in latest.items() for i, s in enumerate(t.steps)]
        trajectories = pa.Table.from_pydict(
            {
                "trajectory_id": list(latest), "run_id": [t.run_id for t in heads],
                "round": [t.round for t in heads], "task_id": [t.task_id for t in heads],
                "sample": [t.sample for t in heads], "reward": [float(t.reward) for t in heads],
                "success": [bool(t.success) for t in heads], "finish_reason": [t.finish_reason for t in heads],
                "num_steps": [len(t.steps) for t in heads], "tool_sequence": [t.tool_sequence for t in heads],
                "prompt_ids": [list(t.prompt_ids) for t in heads],
                "completion_ids": [list(t.completion_ids) for t in heads],
                "completion_mask": [list(t.completion_mask) for t in heads],
                "logprobs": [[float(x) for x in t.logprobs] for t in heads],
                "duration_s": [float(t.duration_s) for t in heads],
            },
            schema=_TRAJECTORY_SCHEMA,
        )  # fmt: skip
        step_table = pa.Table.from_pydict(
            {
                "trajectory_id": [tid for tid, _, _ in steps], "step_index": [i for _, i, _ in steps],
                "step_number": [s.index for _, _, s in steps], "turn": [s.turn for _, _, s in steps],
                "model_text": [s.model_text for _, _, s in steps],
                "calls": [json.dumps([c.to_dict() for c in s.calls], default=str) for _, _, s in steps],
                "tool_names": [[c.name for c in s.calls] for _, _, s in steps],
                "observations": [list(s.observations) for _, _, s in steps],
                "error": [s.error for _, _, s in steps], "completion_tokens": [s.completion_tokens for _, _, s in steps],
            },
            schema=_STEP_SCHEMA,
        )  # fmt: skip
        keys = pa.table({"trajectory_id": pa.array(list(latest), pa.string())})
        with self._transaction() as con:
            con.register("new_keys", keys)
            con.register("new_trajectories", trajectories)
            con.register("new_steps", step_table)
            # A first write (the usual case) has nothing to replace; skipping the deletes keeps ingest
            # from scanning the whole steps table once per batch.
            (existing,) = con.execute(
                "SELECT count(*) FROM trajectories WHERE trajectory_id IN (SELECT trajectory_id FROM new_keys)"
            ).fetchone()
            if existing:
                con.execute("DELETE FROM steps WHERE trajectory_id IN (SELECT trajectory_id FROM new_keys)")
                con.execute("DELETE FROM trajectories WHERE trajectory_id IN (SELECT trajectory_id FROM new_keys)")
            con.execute("INSERT INTO trajectories SELECT * FROM new_trajectories")
            con.execute("INSERT INTO steps SELECT * FROM new_steps")

    def write_tasks(self, tasks: list[Task]) -> None:
        """Writes tasks by content id; writing a task again replaces it."""
        if not tasks:
            return
        latest = {t.task_id: t for t in tasks}
        rows = [
            {
                "task_id": tid, "environment": t.environment, "origin": t.provenance.origin,
                "round": t.provenance.round, "parent_trajectory_id": t.provenance.parent_trajectory_id,
                "signal_id": t.provenance.signal_id, "content_hash": t.content_hash,
                "task": json.dumps(t.to_dict(), default=str), "tools": t.tools,
            }
            for tid, t in latest.items()
        ]
        frame = pl.DataFrame(rows, schema=_TASK_SCHEMA)
        with self._transaction() as con:
            con.register("new_tasks", frame)
            con.execute("DELETE FROM tasks WHERE task_id IN (SELECT task_id FROM new_tasks)")
            con.execute("INSERT INTO tasks SELECT * FROM new_tasks")

    def set_pool(self, run_id: str, round: int, task_ids: list[str]) -> None:
        """Replaces the pool of (run, round) with task_ids, keeping their order; duplicates are dropped."""
        unique = list(dict.fromkeys(task_ids))
        frame = pl.DataFrame(
            {"run_id": [run_id] * len(unique), "round": [round] * len(unique),
             "position": list(range(len(unique))), "task_id": unique},
            schema={"run_id": pl.String, "round": pl.Int32, "position": pl.Int32, "task_id": pl.String},
        )
        with self._transaction() as con:
            con.execute("DELETE FROM pool_membership WHERE run_id = ? AND round = ?", [run_id, round])
            con.register("new_members", frame)
            con.execute("INSERT INTO pool_membership SELECT * FROM new_members")

    def write_signals(self, signals: list[Signal]) -> None:
        if not signals:
            return
        latest = {(s.run_id, s.round, s.signal_id): s for s in signals}
        frame = pl.DataFrame(
            [
                {"signal_id": s.signal_id, "run_id": s.run_id, "round": s.round, "kind": s.kind,
                 "trajectory_id": s.trajectory_id, "task_id": s.task_id,
                 "evidence": json.dumps(s.evidence, default=str)}
                for s in latest.values()
            ],
            schema={"signal_id": pl.String, "run_id": pl.String, "round": pl.Int32, "kind": pl.String,
                    "trajectory_id": pl.String, "task_id": pl.String, "evidence": pl.String},
        )
        with self._transaction() as con:
            con.register("new_signals", frame)
            con.execute(
                "DELETE FROM signals WHERE (run_id, round, signal_id) IN "
                "(SELECT (run_id, round, signal_id) FROM new_signals)"
            )
            con.execute("INSERT INTO signals SELECT * FROM new_signals")

    def write_candidates(self, run_id: str, round: int, candidates: list[Candidate]) -> None:
        """Writes candidates (with verdicts once validated), keyed by (task, signal) within the round."""
        if not candidates:
            return
        latest = {(c.task.task_id, c.signal_id or ""): c for c in candidates}
        frame = pl.DataFrame(
            [
                {"run_id": run_id, "round": round, "task_id": c.task.task_id, "signal_key": key[1],
                 "signal_id": c.signal_id, "origin": c.task.provenance.origin,
                 "accepted": None if c.verdict is None else c.verdict.accepted,
                 "reason": None if c.verdict is None else c.verdict.reason,
                 "task": json.dumps(c.task.to_dict(), default=str)}
                for key, c in latest.items()
            ],
            schema={"run_id": pl.String, "round": pl.Int32, "task_id": pl.String, "signal_key": pl.String,
                    "signal_id": pl.String, "origin": pl.String, "accepted": pl.Boolean, "reason": pl.String,
                    "task": pl.String},
        )
        with self._transaction() as con:
            con.register("new_candidates", frame)
            con.execute(
                "DELETE FROM candidates WHERE (run_id, round, task_id, signal_key) IN "
                "(SELECT (run_id, round, task_id, signal_key) FROM new_candidates)"
            )
            con.execute("INSERT INTO candidates SELECT * FROM new_candidates")

    def write_evaluations(self, run_id: str, round: int, split: str, rows: list[tuple[str, bool, float, str]]) -> None:
        """Writes (task_id, success, reward, trajectory_id) rows of one evaluation split."""
        if not rows:
            return
        latest = {row[0]: row for row in rows}
        frame = pl.DataFrame(
            {"run_id": [run_id] * len(latest), "round": [round] * len(latest), "split": [split] * len(latest),
             "task_id": list(latest), "success": [bool(r[1]) for r in latest.values()],
             "reward": [float(r[2]) for r in latest.values()], "trajectory_id": [r[3] for r in latest.values()]},
            schema={"run_id": pl.String, "round": pl.Int32, "split": pl.String, "task_id": pl.String,
                    "success": pl.Boolean, "reward": pl.Float64, "trajectory_id": pl.String},
        )
        with self._transaction() as con:
            con.register("new_evaluations", frame)
            con.execute(
                "DELETE FROM evaluations WHERE run_id = ? AND round = ? AND split = ? "
                "AND task_id IN (SELECT task_id FROM new_evaluations)",
                [run_id, round, split],
            )
            con.execute("INSERT INTO evaluations SELECT * FROM new_evaluations")

    def evaluation_outcomes(self, run_id: str, round: int, split: str) -> dict[str, bool]:
        """task_id -> success of one evaluation split of (run, round)."""
        rows = self._fetch(
            "SELECT task_id, success FROM evaluations WHERE run_id = ? AND round = ? AND split = ?", [run_id, round, split]
        )
        return {task_id: bool(success) for task_id, success in rows}

    def start_round(self, run_id: str, round: int, flow_run_id: str) -> None:
        """Marks a round running; restarting a round keeps its earlier stage bookkeeping."""
        with self._transaction() as con:
            con.execute(
                "INSERT INTO rounds VALUES (?, ?, 'running', NULL, ?, ?, NULL) ON CONFLICT (run_id, round) "
                "DO UPDATE SET status = 'running', flow_run_id = excluded.flow_run_id, "
                "started_at = excluded.started_at, finished_at = NULL",
                [run_id, round, flow_run_id, _now()],
            )

    def finish_round(self, run_id: str, round: int, summary: RoundSummary) -> None:
        with self._transaction() as con:
            con.execute(
                "INSERT INTO rounds VALUES (?, ?, 'finished', ?, ?, ?, ?) ON CONFLICT (run_id, round) "
                "DO UPDATE SET status = 'finished', summary = excluded.summary, finished_at = excluded.finished_at, "
                "flow_run_id = coalesce(nullif(excluded.flow_run_id, ''), rounds.flow_run_id)",
                [run_id, round, json.dumps(summary.to_dict(), default=str), summary.flow_run_id, _now(), _now()],
            )

    def mark_stage(self, run_id: str, round: int, stage: str, output: dict[str, Any]) -> None:
        """Records that a stage of a round finished, with the output a resumed round reuses."""
        with self._transaction() as con:
            con.execute(
                "INSERT OR REPLACE INTO stage_runs VALUES (?, ?, ?, ?, ?)",
                [run_id, round, stage, _now(), json.dumps(output, default=str)],
            )

    def stage_output(self, run_id: str, round: int, stage: str) -> dict[str, Any] | None:
        """The output recorded by mark_stage, or None when that stage has not finished."""
        rows = self._fetch(
            "SELECT output FROM stage_runs WHERE run_id = ? AND round = ? AND stage = ?", [run_id, round, stage]
        )
        return json.loads(rows[0][0]) if rows else None

    def clear_round(self, run_id: str, round: int, from_stage: str) -> None:
        """Forgets from_stage and every later stage of a round, with the rows those stages wrote."""
        if from_stage not in STAGES:
            raise DataError(f"Unknown stage {from_stage!r}; stages are {', '.join(STAGES)}.")
        dropped = STAGES[STAGES.index(from_stage):]
        with self._transaction() as con:
            for stage in dropped:
                for table in _STAGE_TABLES.get(stage, ()):
                    if table == "steps":
                        con.execute(
                            "DELETE FROM steps WHERE trajectory_id IN "
                            "(SELECT trajectory_id FROM trajectories WHERE run_id = ? AND round = ?)",
                            [run_id, round],
                        )
                    else:
                        con.execute(f"DELETE FROM {table} WHERE run_id = ? AND round = ?", [run_id, round])
                con.execute(
                    "DELETE FROM stage_runs WHERE run_id = ? AND round = ? AND stage = ?", [run_id, round, stage]
                )

    # -- reads -----------------------------------------------------------------------------------

    def _fetch(self, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        # fetchall only: in DuckDB 2.0 a fetchone() leaves the connection unusable for the next query.
        with self._connect() as con:
            return con.execute(query, params or []).fetchall()

    def sql(self, query: str) -> pl.DataFrame:
        """Runs an ad-hoc query (e.g. on the v_* views) and returns the result as a Polars frame."""
        with self._connect() as con:
            relation = con.sql(query)
            if relation is None:  # a statement without a result, e.g. SET or PRAGMA
                return pl.DataFrame()
            # Polars cannot import DuckDB's INTERVAL (e.g. a difference of timestamps): show it as text.
            if any(str(t) == "INTERVAL" for t in relation.types):
                relation = relation.project(
                    ", ".join(
                        f'CAST("{c}" AS VARCHAR) AS "{c}"' if str(t) == "INTERVAL" else f'"{c}"'
                        for c, t in zip(relation.columns, relation.types)
                    )
                )
            return relation.pl()

    def pool(self, run_id: str, round: int) -> list[Task]:
        """The tasks in the pool of (run, round), in the order set_pool was given."""
        rows = self._fetch(
            "SELECT t.task FROM pool_membership pm JOIN tasks t USING (task_id) "
            "WHERE pm.run_id = ? AND pm.round = ? ORDER BY pm.position",
            [run_id, round],
        )
        return [Task.from_dict(json.loads(r[0])) for r in rows]

    def trajectories(self, run_id: str, round: int) -> list[Trajectory]:
        """Full trajectories of a round, steps included, ordered by task then sample."""
        with self._connect() as con:
            heads = con.execute(
                "SELECT run_id, round, task_id, sample, prompt_ids, completion_ids, completion_mask, logprobs, "
                "reward, success, finish_reason, duration_s, trajectory_id FROM trajectories "
                "WHERE run_id = ? AND round = ? ORDER BY task_id, sample",
                [run_id, round],
            ).fetchall()
            step_rows = con.execute(
                "SELECT s.trajectory_id, s.step_number, s.turn, s.model_text, s.calls, s.observations, s.error, "
                "s.completion_tokens FROM steps s JOIN trajectories t USING (trajectory_id) "
                "WHERE t.run_id = ? AND t.round = ? ORDER BY s.trajectory_id, s.step_index",
                [run_id, round],
            ).fetchall()
        steps: dict[str, list[Step]] = {}
        for tid, number, turn, text, calls, observations, error, tokens in step_rows:
            steps.setdefault(tid, []).append(
                Step(turn=turn, index=number, model_text=text,
                     calls=[ToolCall.from_dict(c) for c in json.loads(calls)],
                     observations=list(observations), error=error, completion_tokens=tokens)
            )
        return [
            Trajectory(run_id=h[0], round=h[1], task_id=h[2], sample=h[3], steps=steps.get(h[12], []),
                       prompt_ids=list(h[4]), completion_ids=list(h[5]), completion_mask=list(h[6]),
                       logprobs=list(h[7]), reward=h[8], success=h[9], finish_reason=h[10], duration_s=h[11])
            for h in heads
        ]

    def trajectory_frame(self, run_id: str, upto_round: int | None = None) -> pl.DataFrame:
        """Trajectory outcomes of a run (no token data), rounds <= upto_round: what signal mining reads."""
        with self._connect() as con:
            return con.sql(
                "SELECT trajectory_id, run_id, round, task_id, sample, reward, success, finish_reason, tool_sequence "
                "FROM trajectories WHERE run_id = ? AND (? IS NULL OR round <= ?) ORDER BY round, task_id, sample",
                params=[run_id, upto_round, upto_round],
            ).pl()

    def rounds(self, run_id: str) -> list[RoundSummary]:
        """Summaries of the finished rounds of a run, in round order."""
        rows = self._fetch(
            "SELECT summary FROM rounds WHERE run_id = ? AND summary IS NOT NULL ORDER BY round", [run_id]
        )
        return [RoundSummary(**json.loads(r[0])) for r in rows]

    def round_status(self, run_id: str, round: int) -> str | None:
        """'running', 'finished', or None when the round was never started."""
        rows = self._fetch("SELECT status FROM rounds WHERE run_id = ? AND round = ?", [run_id, round])
        return rows[0][0] if rows else None
