"""Per-task statistics of a round's pool: how often each task was played, how it went, what its success is now.

One SQL statement over the trajectories computes, for every task of pool r, its episodes in the rounds
before r, the outcomes of its most recent ``history_episodes`` of them, and a Beta posterior over its
success probability. The prior's mean is the recent success of the pool's tasks of the same origin
(seed, boundary, rare, ...), itself shrunk toward the whole pool's with ``prior_strength``
pseudo-episodes, so a task never played starts from what tasks of its kind scored; with no episode at
all the prior mean is 0.5. The posterior is Beta(alpha, beta) with alpha = strength x prior_mean +
successes and beta = strength x (1 - prior_mean) + failures, and the estimate its mean.

The rows are stored once per round (table ``task_difficulty``, partition run_id/round): the sampler
of every training step of the round draws from them (tasks/samplers.py), and `v_task_difficulty`
shows them to an analyst (storage/VIEWS.md).
"""

from __future__ import annotations

import pyarrow as pa

from storage.columns import SCHEMAS
from storage.views import WarehouseViews

# $run, $round, $history (most recent episodes per task), $strength (prior pseudo-episodes).
_TASK_DIFFICULTY = """
WITH pool AS (
    SELECT DISTINCT task_id FROM pool_membership WHERE run_id = $run AND round = $round
), origins AS (
    SELECT task_id, any_value(origin) AS origin FROM tasks GROUP BY task_id
), ranked AS (
    SELECT t.task_id, t.round, t.success,
           row_number() OVER (PARTITION BY t.task_id ORDER BY t.round DESC, t.sample DESC) AS age
    FROM trajectories AS t JOIN pool USING (task_id)
    WHERE t.run_id = $run AND t.round < $round
), played AS (
    SELECT task_id,
           count(*)                                        AS played,
           count(*) FILTER (WHERE age <= $history)         AS recent_played,
           count(*) FILTER (WHERE age <= $history AND success) AS recent_successes,
           max(round)                                      AS last_round
    FROM ranked GROUP BY task_id
), stats AS (
    SELECT p.task_id, coalesce(o.origin, 'unknown') AS origin,
           coalesce(s.played, 0) AS played, coalesce(s.recent_played, 0) AS recent_played,
           coalesce(s.recent_successes, 0) AS recent_successes, s.last_round
    FROM pool AS p LEFT JOIN played AS s USING (task_id) LEFT JOIN origins AS o USING (task_id)
), overall AS (
    SELECT coalesce(sum(recent_successes) / nullif(sum(recent_played), 0), 0.5) AS rate FROM stats
), kinds AS (
    SELECT origin,
           (sum(recent_successes) + $strength * any_value(overall.rate))
               / (sum(recent_played) + $strength) AS prior_mean
    FROM stats, overall GROUP BY origin
)
SELECT task_id, origin,
       CAST(played AS INTEGER) AS played, CAST(recent_played AS INTEGER) AS recent_played,
       CAST(recent_successes AS INTEGER) AS recent_successes, CAST(last_round AS INTEGER) AS last_round,
       prior_mean,
       $strength * prior_mean + recent_successes                       AS alpha,
       $strength * (1 - prior_mean) + recent_played - recent_successes AS beta,
       ($strength * prior_mean + recent_successes) / ($strength + recent_played) AS estimate
FROM stats JOIN kinds USING (origin)
ORDER BY task_id
"""


class TaskStats(WarehouseViews):
    """Computes, stores and reads the per-task statistics of a round's pool."""

    def task_difficulty(self, run_id: str, round_: int, history_episodes: int, prior_strength: float) -> pa.Table:
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
                params={"run": run_id, "round": round_, "history": history_episodes, "strength": prior_strength},
            ).to_arrow_table()
        finally:
            con.close()
        rows = rows.cast(SCHEMAS["task_difficulty"])
        if rows.num_rows and not self.read_only:
            self._writable()
            self.files.write(f"{self.files.partition_dir('task_difficulty', run_id, round_)}/pool.parquet", rows)
        return rows
