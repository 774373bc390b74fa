"""Per-task statistics of a round's pool: how often each task was played, how it went, what its success is now.

One SQL statement over the trajectories computes, for every task of pool r, its episodes in the rounds
before r, the outcomes of its most recent ``history_episodes`` of them, and a Beta posterior over its
success probability. The prior's mean is the recent success of the pool's other tasks of the same kind
(those calling the same tools), itself shrunk toward the whole pool's with ``kind_strength``
pseudo-episodes, so a task never played starts from what tasks of its kind scored; with no episode at
all the prior mean is 0.5. The posterior is Beta(alpha, beta) with alpha = strength x prior_mean +
successes and beta = strength x (1 - prior_mean) + failures (strength: ``prior_strength``
pseudo-episodes), and the estimate its mean.

The rows are stored once per round (table ``task_difficulty``, partition run_id/round): the sampler
of every training step of the round draws from them (tasks/samplers.py), and `v_task_difficulty`
shows them to an analyst (storage/VIEWS.md).
"""

from __future__ import annotations

import pyarrow as pa

from storage.columns import SCHEMAS
from storage.views import WarehouseViews

# $run, $round, $history (most recent episodes per task), $strength (prior pseudo-episodes of a task),
# $kind_strength (pseudo-episodes of a kind's rate).
_TASK_DIFFICULTY = """
WITH pool AS (
    SELECT DISTINCT task_id FROM pool_membership WHERE run_id = $run AND round = $round
), kinds AS (
    -- A task's kind: the tools its reference calls. Tasks that need the same tools succeed alike.
    SELECT task_id, any_value(origin) AS origin, any_value(list_sort(list_distinct(tools))::VARCHAR) AS kind
    FROM tasks GROUP BY task_id
), ranked AS (
    SELECT t.task_id, t.round, t.success,
           row_number() OVER (PARTITION BY t.task_id ORDER BY t.round DESC, t.sample DESC) AS age
    FROM trajectories AS t JOIN pool USING (task_id)
    WHERE t.run_id = $run AND t.round < $round
), played AS (
    SELECT task_id,
           count(*)                                            AS played,
           count(*) FILTER (WHERE age <= $history)             AS recent_played,
           count(*) FILTER (WHERE age <= $history AND success) AS recent_successes,
           max(round)                                          AS last_round
    FROM ranked GROUP BY task_id
), stats AS (
    SELECT p.task_id, coalesce(k.origin, 'unknown') AS origin, coalesce(k.kind, '') AS kind,
           coalesce(s.played, 0) AS played, coalesce(s.recent_played, 0) AS recent_played,
           coalesce(s.recent_successes, 0) AS recent_successes, s.last_round
    FROM pool AS p LEFT JOIN played AS s USING (task_id) LEFT JOIN kinds AS k USING (task_id)
), overall AS (
    SELECT coalesce(sum(recent_successes) / nullif(sum(recent_played), 0), 0.5) AS rate FROM stats
), by_kind AS (
    SELECT *,
           sum(recent_successes) OVER (PARTITION BY kind) - recent_successes AS kind_successes,
           sum(recent_played) OVER (PARTITION BY kind) - recent_played       AS kind_played
    FROM stats
), priors AS (
    -- The other tasks of its kind, shrunk toward the pool's rate: the task's own episodes are its evidence.
    SELECT b.*, (kind_successes + $kind_strength * o.rate) / (kind_played + $kind_strength) AS prior_mean
    FROM by_kind AS b, overall AS o
)
SELECT task_id, origin,
       CAST(played AS INTEGER) AS played, CAST(recent_played AS INTEGER) AS recent_played,
       CAST(recent_successes AS INTEGER) AS recent_successes, CAST(last_round AS INTEGER) AS last_round,
       prior_mean,
       $strength * prior_mean + recent_successes                       AS alpha,
       $strength * (1 - prior_mean) + recent_played - recent_successes AS beta,
       ($strength * prior_mean + recent_successes) / ($strength + recent_played) AS estimate
FROM priors
ORDER BY task_id
"""


class TaskStats(WarehouseViews):
    """Computes, stores and reads the per-task statistics of a round's pool."""

    def task_difficulty(
        self, run_id: str, round_: int, history_episodes: int, prior_strength: float, kind_strength: float
    ) -> pa.Table:
        """Pool ``round_``'s statistics as stored; computed from the trajectories of earlier rounds and stored
        first when the round has none yet. Earlier rounds never change once finished, so computing again gives
        the same rows: a resumed round draws from the same estimates."""
        stored = self._partition("task_difficulty", run_id, round_)
        if stored.num_rows:
            return stored
        con = self.connect()
        try:
            rows = con.sql(
                _TASK_DIFFICULTY,
                params={
                    "run": run_id,
                    "round": round_,
                    "history": history_episodes,
                    "strength": prior_strength,
                    "kind_strength": kind_strength,
                },
            ).to_arrow_table()
        finally:
            con.close()
        rows = rows.cast(SCHEMAS["task_difficulty"])
        if rows.num_rows and not self.read_only:
            self._writable()
            self.files.write(f"{self.files.partition_dir('task_difficulty', run_id, round_)}/pool.parquet", rows)
        return rows
