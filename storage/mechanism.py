"""Mechanism measurements of one round, read from the warehouse: why a round did (or did not) learn.

- informative-group share: of the round's GRPO groups (the rollouts of one task in one training
  step of a round of one run: a step's samples are k x group_size onwards), the share whose rewards
  are not all equal; a group with one reward, or one trajectory, has
  no advantage to learn from;
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

_INFORMATIVE = """
SELECT count(*) AS groups, count(*) FILTER (WHERE hi > lo) AS informative
FROM (
    SELECT task_id, max(reward) AS hi, min(reward) AS lo
    FROM trajectories WHERE run_id = ? AND round = ? GROUP BY task_id, sample // ?
)
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


def _informative(con: duckdb.DuckDBPyConnection, run_id: str, round_: int, group_size: int) -> float:
    row = con.execute(_INFORMATIVE, [run_id, round_, group_size]).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns exactly one row
    groups, informative = row
    return informative / groups if groups else math.nan


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


def round_mechanism(wh: Warehouse, run_id: str, round_: int, group_size: int) -> dict[str, Any]:
    """The three measurements of one round, read in one session (``group_size``: rollout.group_size)."""
    con = wh.connect()
    try:
        return {
            "informative_groups": _informative(con, run_id, round_, group_size),
            "heldout_coverage": _coverage(con, run_id, round_),
            "accepted_by_kind": _accepted(con, run_id, round_),
        }
    finally:
        con.close()
