"""Mechanism measurements of one round, read from the warehouse: why a round did (or did not) learn.

- informative-group share: of the round's GRPO groups (the rollouts of one task in one training
  step of a round of one run: a step's samples are k x group_size onwards), the share whose rewards
  are not all equal; a group with one reward, or one trajectory, has
  no advantage to learn from;
- what the round played: its episodes (trajectories), its groups, and episodes per informative group,
  the rollout cost of one group the update learns from (with dynamic sampling a step plays replacement
  tasks until it has enough informative groups, so this is what the curriculum saves or spends);
- calibration of the curriculum's estimates: for the tasks round r played, the mean absolute difference
  between the estimate of their success the sampler drew with (``task_difficulty`` of round r, written
  before the round's first rollout) and the success they then had in round r, weighted by their episodes
  in round r; nan for a round without ``task_difficulty`` rows (runs made before the table, or whose
  sampler never wrote it);
- difficulty histogram: pool r's tasks counted by that estimate in five bins of width 0.2 (the last
  one closed: an estimate of 1.0 counts in 0.8-1.0); empty without ``task_difficulty`` rows;
- held-out tool-pattern coverage: the share of the held-out split's distinct tool bigrams that some
  task of the pool the round trained on (pool r) also has. A task's bigrams are its consecutive call
  names over the whole reference (turns flattened); a one-call task contributes its single tool name.
  The held-out references are only measured here, never trained on;
- accepted candidates by kind: the round's accepted candidates joined to their signals by
  signal_id; a candidate with no stored signal counts as "random": the random control's targets
  (signal ids ``random:<round>:<i>``, tasks/synthesize.random_targets) are never stored as signals.

Every function reads through ``Warehouse.connect`` (the DuckDB views of storage/VIEWS.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import duckdb

from storage.warehouse import Warehouse

# Pool membership round of the run's held-out split (tasks.common.HELDOUT_ROUND; storage does not import tasks).
HELDOUT_POOL_ROUND = -1
# Kind of an accepted candidate that answers no stored signal: the random-synthesis control.
RANDOM_KIND = "random"
# Bins of the difficulty histogram, by estimated success: [0, 0.2), [0.2, 0.4), ..., [0.8, 1.0].
DIFFICULTY_BINS: tuple[str, ...] = ("0.0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0")

_GROUPS = """
SELECT count(*) AS groups, count(*) FILTER (WHERE hi > lo) AS informative, coalesce(sum(episodes), 0) AS episodes
FROM (
    SELECT task_id, max(reward) AS hi, min(reward) AS lo, count(*) AS episodes
    FROM trajectories WHERE run_id = ? AND round = ? GROUP BY task_id, sample // ?
)
"""

# Rows of the round in task_difficulty, and the episode-weighted mean |estimate - observed success in
# the round| over the tasks the round played (NULL when it played none of them).
_CALIBRATION = """
SELECT count(*) AS tasks,
       sum(episodes_in_round * abs(estimate - success_in_round)) / nullif(sum(episodes_in_round), 0) AS mae
FROM v_task_difficulty WHERE run_id = ? AND round = ?
"""

_DIFFICULTY_HISTOGRAM = f"""
SELECT least(CAST(floor(estimate * {len(DIFFICULTY_BINS)}) AS INTEGER), {len(DIFFICULTY_BINS) - 1}) AS bin,
       count(*) AS tasks
FROM task_difficulty WHERE run_id = ? AND round = ? AND estimate IS NOT NULL
GROUP BY bin ORDER BY bin
"""

_POOL_REFERENCES = """
SELECT t.task
FROM pool_membership AS p JOIN tasks AS t USING (task_id)
WHERE p.run_id = ? AND p.round = ?
"""

_ACCEPTED_BY_KIND = f"""
SELECT coalesce(s.kind, '{RANDOM_KIND}') AS kind, count(*) AS accepted
FROM candidates AS c
LEFT JOIN signals AS s ON s.run_id = c.run_id AND s.signal_id = c.signal_id
WHERE c.run_id = ? AND c.round = ? AND c.accepted
GROUP BY ALL ORDER BY kind
"""


def tool_patterns(reference: Iterable[Iterable[Any]]) -> set[tuple[str, ...]]:
    """Distinct tool patterns of one reference (a list of turns of calls, as ToolCall or dicts with a name).

    Consecutive call-name pairs over the flattened turns; a reference of one call gives that name
    alone, as a 1-tuple; an empty reference gives nothing.
    """
    names = [call["name"] if isinstance(call, dict) else call.name for turn in reference for call in turn]
    if len(names) == 1:
        return {(names[0],)}
    return set(pairwise(names))


def coverage(heldout: Iterable[set[tuple[str, ...]]], pool: Iterable[set[tuple[str, ...]]]) -> float:
    """Share of the distinct patterns of ``heldout`` tasks found in at least one ``pool`` task;
    nan when held-out has none."""
    wanted = set().union(*heldout)
    if not wanted:
        return math.nan
    present = set().union(*pool)
    return len(wanted & present) / len(wanted)


def _pool_patterns(con: duckdb.DuckDBPyConnection, run_id: str, round_: int) -> list[set[tuple[str, ...]]]:
    rows = con.execute(_POOL_REFERENCES, [run_id, round_]).fetchall()
    return [tool_patterns(json.loads(text)["reference"]) for (text,) in rows]


def _groups(con: duckdb.DuckDBPyConnection, run_id: str, round_: int, group_size: int) -> dict[str, Any]:
    """The round's informative share, episodes, groups and episodes per informative group."""
    row = con.execute(_GROUPS, [run_id, round_, group_size]).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns exactly one row
    groups, informative, episodes = (int(v) for v in row)
    return {
        "informative_groups": informative / groups if groups else math.nan,
        "episodes_played": episodes,
        "groups_played": groups,
        "episodes_per_informative_group": episodes / informative if informative else math.nan,
    }


def _calibration(con: duckdb.DuckDBPyConnection, run_id: str, round_: int) -> float:
    row = con.execute(_CALIBRATION, [run_id, round_]).fetchone()
    assert row is not None
    tasks, mae = row
    return float(mae) if tasks and mae is not None else math.nan


def _difficulty_histogram(con: duckdb.DuckDBPyConnection, run_id: str, round_: int) -> dict[str, int]:
    counts = dict(con.execute(_DIFFICULTY_HISTOGRAM, [run_id, round_]).fetchall())
    if not counts:
        return {}
    return {label: int(counts.get(i, 0)) for i, label in enumerate(DIFFICULTY_BINS)}


def _coverage(con: duckdb.DuckDBPyConnection, run_id: str, round_: int) -> float:
    return coverage(_pool_patterns(con, run_id, HELDOUT_POOL_ROUND), _pool_patterns(con, run_id, round_))


def _accepted(con: duckdb.DuckDBPyConnection, run_id: str, round_: int) -> dict[str, int]:
    return {kind: int(n) for kind, n in con.execute(_ACCEPTED_BY_KIND, [run_id, round_]).fetchall()}


def _read(wh: Warehouse, measure: Any, run_id: str, round_: int) -> Any:
    con = wh.connect()
    try:
        return measure(con, run_id, round_)
    finally:
        con.close()


def heldout_coverage(wh: Warehouse, run_id: str, round_: int) -> float:
    """Share of the held-out split's distinct tool patterns present in pool ``round_``;
    nan without held-out patterns."""
    return _read(wh, _coverage, run_id, round_)


def accepted_by_kind(wh: Warehouse, run_id: str, round_: int) -> dict[str, int]:
    """Accepted candidates of the round by the kind of signal they answer
    ('random' when no stored signal has their id)."""
    return _read(wh, _accepted, run_id, round_)


def calibration(wh: Warehouse, run_id: str, round_: int) -> float:
    """Episode-weighted mean |estimate - observed success| of round ``round_``'s played tasks;
    nan without task_difficulty rows for the round."""
    return _read(wh, _calibration, run_id, round_)


def difficulty_histogram(wh: Warehouse, run_id: str, round_: int) -> dict[str, int]:
    """Pool ``round_``'s tasks by estimated success (DIFFICULTY_BINS -> count); empty without task_difficulty rows."""
    return _read(wh, _difficulty_histogram, run_id, round_)


def round_mechanism(wh: Warehouse, run_id: str, round_: int, group_size: int) -> dict[str, Any]:
    """Every measurement of one round, read in one session (``group_size``: rollout.group_size)."""
    con = wh.connect()
    try:
        return {
            **_groups(con, run_id, round_, group_size),
            "heldout_coverage": _coverage(con, run_id, round_),
            "accepted_by_kind": _accepted(con, run_id, round_),
            "calibration": _calibration(con, run_id, round_),
            "difficulty_histogram": _difficulty_histogram(con, run_id, round_),
        }
    finally:
        con.close()
