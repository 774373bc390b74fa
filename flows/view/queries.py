"""Every query the view runs, over a locked read-only warehouse session (storage/views.py `connect(locked=True)`).

Each function takes the session and the page's ids and filters as parameters (never spliced into the SQL) and
returns plain rows: lists of dicts, as the templates read them. Rows are capped (`LIST_ROWS`) so a page of a
large warehouse stays small; a page says when more matched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb

# Rows a list on a page shows at most (episodes, tasks, candidates); the page says when more matched.
LIST_ROWS = 200


@dataclass(frozen=True)
class Filters:
    """The query parameters a list page narrows its rows with; None: not filtered on."""

    run: str | None = None
    round: int | None = None
    task: str | None = None
    tool: str | None = None
    success: bool | None = None
    kind: str | None = None
    verdict: str | None = None  # accepted, rejected, pending


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params or [])
    names = [c[0] for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _json(value: Any) -> Any:
    """A JSON column as Python (DuckDB hands JSON over as text)."""
    if value is None or not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


# --- the front page ----------------------------------------------------------------------------------------------


def runs(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The runs, oldest first, with their environment and model."""
    return _rows(con, "SELECT run_id, environment, model, created_at FROM v_runs")


def rounds(con: duckdb.DuckDBPyConnection, run: str | None = None) -> list[dict[str, Any]]:
    """Every round record (status, summary, times) of one run or all, in run and round order."""
    found = _rows(
        con,
        "SELECT run_id, round, status, summary, started_at, finished_at FROM rounds "
        "WHERE ? IS NULL OR run_id = ? ORDER BY run_id, round",
        [run, run],
    )
    for row in found:
        row["summary"] = _json(row["summary"]) or {}
        started, finished = row["started_at"], row["finished_at"]
        row["seconds"] = (finished - started).total_seconds() if started and finished else None
    return found


def baselines(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """Checkpoint 0's held-out and dev success of each run, as round 0's prepare stage recorded them."""
    found = _rows(
        con,
        "SELECT run_id, CAST(json_extract(output, '$.baseline_heldout_success') AS DOUBLE) AS heldout, "
        "CAST(json_extract(output, '$.baseline_dev_success') AS DOUBLE) AS dev "
        "FROM stage_runs WHERE round = 0 AND stage = 'prepare'",
    )
    return {row["run_id"]: row for row in found}


def pool_growth(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Pool size and new tasks per round of every run (rounds >= 0: the sealed splits are left out)."""
    return _rows(
        con,
        "SELECT run_id, round, count(*) AS pool_size FROM pool_membership WHERE round >= 0 "
        "GROUP BY run_id, round ORDER BY run_id, round",
    )


def signal_mix(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Signals of each kind per round of every run, with their share of the round's signals."""
    return _rows(con, "SELECT run_id, round, kind, signals, share FROM v_signal_mix")


# --- a round -----------------------------------------------------------------------------------------------------


def round_record(con: duckdb.DuckDBPyConnection, run: str, round_: int) -> dict[str, Any] | None:
    found = [r for r in rounds(con, run) if r["round"] == round_]
    return found[0] if found else None


def stage_costs(con: duckdb.DuckDBPyConnection, run: str, round_: int) -> list[dict[str, Any]]:
    """The round's stages in the order they finished, with what each cost (`v_stage_cost`)."""
    return _rows(
        con,
        "SELECT stage, kind, step, seconds, tokens_generated, tokens_per_s, episodes, optimizer_steps, skipped, "
        "groups_trained, groups_flat, peak_rss_mib, peak_gpu_mib, finished_at "
        "FROM v_stage_cost WHERE run_id = ? AND round = ?",
        [run, round_],
    )


def training_steps(con: duckdb.DuckDBPyConnection, run: str, round_: int) -> list[dict[str, Any]]:
    """The round's training steps (`v_training_steps`): groups, optimizer steps, loss, skipped."""
    return _rows(
        con,
        "SELECT step, groups, optimizer_steps, global_step, loss, skipped, checkpoint "
        "FROM v_training_steps WHERE run_id = ? AND round = ? ORDER BY step",
        [run, round_],
    )


def groups(con: duckdb.DuckDBPyConnection, run: str, round_: int, group_size: int) -> list[dict[str, Any]]:
    """The round's GRPO groups (one task's episodes of one training step): informative when their rewards differ."""
    return _rows(
        con,
        "SELECT sample // ? AS step, task_id, count(*) AS episodes, "
        "count(*) FILTER (WHERE success) AS successes, min(reward) AS min_reward, max(reward) AS max_reward, "
        "min(reward) < max(reward) AS informative "
        "FROM trajectories WHERE run_id = ? AND round = ? GROUP BY ALL ORDER BY step, informative DESC, task_id "
        f"LIMIT {LIST_ROWS + 1}",
        [max(group_size, 1), run, round_],
    )


def group_counts(con: duckdb.DuckDBPyConnection, run: str, round_: int, group_size: int) -> dict[str, int]:
    """How many of the round's groups were informative and how many flat."""
    found = _rows(
        con,
        "WITH g AS (SELECT min(reward) < max(reward) AS informative FROM trajectories "
        "WHERE run_id = ? AND round = ? GROUP BY sample // ?, task_id) "
        "SELECT count(*) FILTER (WHERE informative) AS informative, count(*) FILTER (WHERE NOT informative) AS flat "
        "FROM g",
        [run, round_, max(group_size, 1)],
    )
    return found[0] if found else {"informative": 0, "flat": 0}


def group_size(con: duckdb.DuckDBPyConnection, run: str) -> int:
    found = _rows(
        con,
        "SELECT CAST(json_extract(config, '$.rollout.group_size') AS INTEGER) AS g FROM runs WHERE run_id = ?",
        [run],
    )
    return int(found[0]["g"] or 1) if found else 1


def round_signals(con: duckdb.DuckDBPyConnection, run: str, round_: int) -> list[dict[str, Any]]:
    """Signals mined in the round, by kind."""
    return _rows(
        con,
        "SELECT kind, count(*) AS signals FROM signals WHERE run_id = ? AND round = ? GROUP BY kind ORDER BY kind",
        [run, round_],
    )


# --- lists with filters ------------------------------------------------------------------------------------------


def episodes(con: duckdb.DuckDBPyConnection, f: Filters) -> list[dict[str, Any]]:
    """Training episodes matching the filters (run, round, task, tool called, success), newest round first."""
    return _rows(
        con,
        "SELECT trajectory_id, run_id, round, task_id, sample, reward, success, finish_reason, num_steps, "
        "tool_sequence FROM trajectories "
        "WHERE (? IS NULL OR run_id = ?) AND (? IS NULL OR round = ?) AND (? IS NULL OR task_id = ?) "
        "AND (? IS NULL OR success = ?) AND (? IS NULL OR list_contains(tool_sequence, ?)) "
        f"ORDER BY run_id, round DESC, task_id, sample LIMIT {LIST_ROWS + 1}",
        [f.run, f.run, f.round, f.round, f.task, f.task, f.success, f.success, f.tool, f.tool],
    )


def candidates(con: duckdb.DuckDBPyConnection, f: Filters) -> list[dict[str, Any]]:
    """Synthesized candidates matching the filters (run, round, signal kind, verdict), with the signal they answer."""
    verdict = {"accepted": True, "rejected": False}.get(f.verdict or "")
    return _rows(
        con,
        "SELECT c.run_id, c.round, c.task_id, c.origin, c.accepted, c.reason, s.kind, c.signal_id "
        "FROM candidates AS c LEFT JOIN signals AS s ON s.run_id = c.run_id AND s.signal_id = c.signal_id "
        "WHERE (? IS NULL OR c.run_id = ?) AND (? IS NULL OR c.round = ?) "
        "AND (? IS NULL OR coalesce(s.kind, c.origin) = ?) "
        "AND (? IS NULL OR c.accepted = ?) AND (? <> 'pending' OR c.accepted IS NULL) "
        f"ORDER BY c.run_id, c.round DESC, c.task_id LIMIT {LIST_ROWS + 1}",
        [f.run, f.run, f.round, f.round, f.kind, f.kind, verdict, verdict, f.verdict or ""],
    )


# --- an episode --------------------------------------------------------------------------------------------------


def episode(con: duckdb.DuckDBPyConnection, trajectory_id: str) -> dict[str, Any] | None:
    """One episode's head: its run, round, task, outcome and token ids (the first segment's prompt)."""
    found = _rows(
        con,
        "SELECT trajectory_id, run_id, round, task_id, sample, reward, success, finish_reason, num_steps, "
        "tool_sequence, duration_s, prompt_ids, len(completion_ids) AS completion_tokens, "
        "list_sum(completion_mask) AS generated_tokens FROM trajectories WHERE trajectory_id = ? LIMIT 1",
        [trajectory_id],
    )
    return found[0] if found else None


def episode_steps(con: duckdb.DuckDBPyConnection, run: str, round_: int, trajectory_id: str) -> list[dict[str, Any]]:
    """The episode's steps in order: the model's text, each tool call with its result, the checker's error."""
    found = _rows(
        con,
        "SELECT step_index, step_number, turn, model_text, calls, observations, error, completion_tokens "
        "FROM steps WHERE run_id = ? AND round = ? AND trajectory_id = ? ORDER BY step_index",
        [run, round_, trajectory_id],
    )
    for row in found:
        observations = row["observations"] or []
        row["calls"] = [
            {
                "name": call["name"],
                "arguments": {k: _json(v) for k, v in (call["arguments"] or {}).items()},
                "result": observations[i] if i < len(observations) else None,
            }
            for i, call in enumerate(row["calls"] or [])
        ]
        row["unanswered"] = observations[len(row["calls"]) :]
    return found


def signals_of_episode(con: duckdb.DuckDBPyConnection, run: str, trajectory_id: str) -> list[dict[str, Any]]:
    """Signals mined from the episode, with the tasks synthesized from each."""
    return _rows(
        con,
        "SELECT s.signal_id, s.kind, s.evidence, "
        "list(c.task_id ORDER BY c.task_id) FILTER (WHERE c.task_id IS NOT NULL) AS tasks "
        "FROM signals AS s LEFT JOIN candidates AS c ON c.run_id = s.run_id AND c.signal_id = s.signal_id "
        "WHERE s.run_id = ? AND s.trajectory_id = ? GROUP BY ALL ORDER BY s.signal_id",
        [run, trajectory_id],
    )


def prepared_checkpoint(con: duckdb.DuckDBPyConnection, run: str) -> str | None:
    """Checkpoint 0 of a run (round 0's prepare record): its folder holds the run's tokenizer."""
    found = _rows(
        con,
        "SELECT json_extract_string(output, '$.checkpoint') AS checkpoint FROM stage_runs "
        "WHERE run_id = ? AND round = 0 AND stage = 'prepare'",
        [run],
    )
    return found[0]["checkpoint"] if found else None


# --- a task ------------------------------------------------------------------------------------------------------


def task(con: duckdb.DuckDBPyConnection, task_id: str) -> dict[str, Any] | None:
    """The task's row: environment, origin, the round that made it, the episode and signal it came from, its text."""
    found = _rows(
        con,
        "SELECT task_id, environment, origin, round, parent_trajectory_id, signal_id, task, tools "
        "FROM tasks WHERE task_id = ?",
        [task_id],
    )
    if not found:
        return None
    row = found[0]
    row["task"] = _json(row["task"])
    return row


def task_candidates(con: duckdb.DuckDBPyConnection, task_id: str) -> list[dict[str, Any]]:
    """Every time the task was synthesized: the run and round, the signal (kind, evidence, episode it was mined
    from) and the validator's verdict and reason."""
    return _rows(
        con,
        "SELECT c.run_id, c.round, c.origin, c.accepted, c.reason, c.signal_id, c.signal_key, s.kind, s.evidence, "
        "s.trajectory_id AS mined_from, s.task_id AS mined_from_task "
        "FROM candidates AS c LEFT JOIN signals AS s ON s.run_id = c.run_id AND s.signal_id = c.signal_id "
        "WHERE c.task_id = ? ORDER BY c.run_id, c.round",
        [task_id],
    )


def synthesis_context(con: duckdb.DuckDBPyConnection, run: str, round_: int, signal_id: str) -> Any:
    """How the synthesizer made candidates for one signal (its exploration and abstraction), as recorded."""
    found = _rows(
        con,
        "SELECT json_extract(output, ?) AS context FROM stage_runs "
        "WHERE run_id = ? AND round = ? AND stage = 'synthesize'",
        [f"$.contexts.{json.dumps(signal_id)}", run, round_],
    )
    return _json(found[0]["context"]) if found else None


def task_plays(con: duckdb.DuckDBPyConnection, task_id: str, f: Filters) -> list[dict[str, Any]]:
    """Every later play of the task by run and round: episodes and successes, then each episode (filtered)."""
    return _rows(
        con,
        "SELECT run_id, round, count(*) AS episodes, count(*) FILTER (WHERE success) AS successes, "
        "avg(reward) AS mean_reward, list(trajectory_id ORDER BY sample)[1:8] AS examples FROM trajectories "
        "WHERE task_id = ? AND (? IS NULL OR run_id = ?) AND (? IS NULL OR round = ?) "
        "AND (? IS NULL OR success = ?) GROUP BY run_id, round ORDER BY run_id, round",
        [task_id, f.run, f.run, f.round, f.round, f.success, f.success],
    )


def task_pools(con: duckdb.DuckDBPyConnection, task_id: str) -> list[dict[str, Any]]:
    """The pools (run, round) the task is in; round -1 is the held-out split, -3 the dev split."""
    return _rows(
        con,
        "SELECT run_id, list(round ORDER BY round) AS rounds FROM pool_membership WHERE task_id = ? GROUP BY run_id",
        [task_id],
    )
