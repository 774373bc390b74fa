"""Numbered versions of the warehouse layout, and the SQL of its analysis views.

Versions 1 and 2 are the single-file DuckDB warehouse (``warehouse.duckdb``); their SQL is kept
unchanged (storage/single_file_schema.py) because ``coevolve warehouse migrate`` reads files written by
them. Version 3 is the open-table layout (storage/tables.py, storage/catalog.py): its version is kept in
``catalog/layout.json`` and checked whenever a warehouse opens. A version is never edited once
released: change the layout by appending an entry with the function that converts the previous one.

The analysis views are DuckDB SQL over the table views `Warehouse.connect` defines; their columns
are documented in storage/VIEWS.md. The views that read as curves over rounds (success, signal mix,
pool growth, acceptance) list their rows by run and round, so `SELECT *` prints them in order.
"""

from __future__ import annotations

from coevolve.signals import SIGNAL_KINDS

# Layout versions of the open-table warehouse: (version, what changed). A column added to a table
# without converting its files is listed in storage/columns.py (_ADDED_COLUMNS, with the value a file
# without it means) and keeps the version: trajectories.later_segments (an episode's segments after the
# first, tasks/rollout.py; a file without it holds one segment per episode).
LAYOUTS: list[tuple[int, str]] = [
    (
        3,
        "open table files: Parquet under tables/ (hive-partitioned by run_id and round), JSON records under catalog/; "
        "steps carry run_id and round, tool calls are typed (list of struct name, arguments map), per-batch tool-call "
        "counts (tool_call_counts) back v_tool_failure_rates",
    ),
]
LATEST_VERSION: int = LAYOUTS[-1][0]

# Versions of the bookkeeping records (storage/catalog.py, storage/round_records.py): (version, what changed).
# A state folder stamps the version its records were written with (storage/state_version.py); this code reads
# and continues only the latest. Append an entry when a record's meaning changes.
RECORD_VERSIONS: list[tuple[int, str]] = [
    (1, "a round record holds its status, summary and flow run; a round records each of its stages once"),
    (
        2,
        "a round record also holds the settings it started with (a resume with others is refused); a training "
        "step after the first records rollout@K and update@K; an update record names the checkpoint it trained",
    ),
]
LATEST_RECORDS: int = RECORD_VERSIONS[-1][0]

# Versions of the training schedule: what a run's rounds, checkpoints and step records mean. A run trained
# with one schedule cannot be continued with another: its checkpoints lack what the other one resumes.
SCHEDULES: list[tuple[int, str]] = [
    (
        1,
        "one batch a round, trained for training.steps_per_round optimizer steps with a fresh optimizer each round; "
        "checkpoints hold weights only",
    ),
    (
        2,
        "training.batches_per_round steps a round, each on a fresh batch played by the previous step's policy; with "
        "training.carry_optimizer the optimizer state is saved beside each checkpoint and carried across steps and "
        "rounds",
    ),
]
LATEST_SCHEDULE: int = SCHEDULES[-1][0]

# The analysis views of layout 3, created in every session over the table views.
VIEWS = (
    """
-- Purpose: which runs the warehouse holds, and the environment and model each ran with (its recorded
-- configuration). Every analysis view below names a row's environment from here.
CREATE VIEW v_runs AS
SELECT run_id,
       json_extract_string(config, '$.environment.name') AS environment,
       json_extract_string(config, '$.policy.model')     AS model,
       created_at
FROM runs
ORDER BY created_at, run_id;

-- Purpose: the learning curve. Training-rollout success and reward per round.
CREATE VIEW v_success_by_round AS
SELECT run_id, any_value(r.environment)          AS environment, round,
       count(*)                                  AS trajectories,
       count(DISTINCT task_id)                   AS tasks,
       count(*) FILTER (WHERE success)           AS successes,
       avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
       avg(reward)                               AS mean_reward
FROM trajectories LEFT JOIN v_runs r USING (run_id)
GROUP BY run_id, round
ORDER BY run_id, round;

-- Purpose: which tasks the policy masters or never solves, over all rounds of a run.
-- Trajectories are counted per task before the join, so the join sees one row per task, not per rollout.
CREATE VIEW v_success_by_task AS
WITH per_task AS (
    SELECT run_id, task_id,
           count(*)                                   AS attempts,
           count(*) FILTER (WHERE success)            AS successes,
           avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
           min(round)                                 AS first_round,
           max(round)                                 AS last_round
    FROM trajectories
    GROUP BY run_id, task_id
), origins AS (
    SELECT task_id, any_value(origin) AS origin FROM tasks GROUP BY task_id
)
SELECT p.run_id, r.environment, p.task_id, o.origin, p.attempts, p.successes, p.success_rate, p.first_round,
       p.last_round
FROM per_task p
LEFT JOIN origins o USING (task_id)
LEFT JOIN v_runs r ON r.run_id = p.run_id;

-- Purpose: which tools the policy misuses. A call failed when its observation is an error
-- (text starting with 'error' in any case after spaces, or a JSON/dict result whose first key is
-- "error"). Counted per tool when each batch of steps is written (tool_call_counts,
-- storage/columns.py), so the view sums a few rows per file instead of every observation.
CREATE VIEW v_tool_failure_rates AS
SELECT run_id, any_value(r.environment)                AS environment, tool_name,
       CAST(sum(calls) AS BIGINT)                      AS calls,
       CAST(sum(failed_calls) AS BIGINT)               AS failed_calls,
       CAST(sum(failed_calls) AS DOUBLE) / sum(calls)  AS failure_rate
FROM tool_call_counts LEFT JOIN v_runs r USING (run_id)
GROUP BY run_id, tool_name;

-- Purpose: how much each signal kind contributes per round (the paper: boundary is 45-51%).
CREATE VIEW v_signal_mix AS
SELECT run_id, any_value(r.environment) AS environment, round, kind,
       count(*) AS signals,
       count(*) / sum(count(*)) OVER (PARTITION BY run_id, round) AS share
FROM signals LEFT JOIN v_runs r USING (run_id)
GROUP BY run_id, round, kind
ORDER BY run_id, round, kind;

-- Purpose: pool size per round and which origins the newly added tasks have.
-- A task is new in a round when no earlier round of the same run had it in its pool.
CREATE VIEW v_pool_growth AS
WITH member AS (
    SELECT pm.run_id, pm.round, pm.task_id, t.origin,
           min(pm.round) OVER (PARTITION BY pm.run_id, pm.task_id) AS first_round
    FROM pool_membership pm LEFT JOIN tasks t USING (task_id)
)
SELECT run_id, any_value(r.environment)                                    AS environment, round,
       count(*)                                                             AS pool_size,
       count(*) FILTER (WHERE round = first_round)                          AS new_tasks,
"""
    + "".join(
        # One column per origin: the seed explorer, every registered signal kind (coevolve/signals/), then random.
        f"       count(*) FILTER (WHERE round = first_round AND origin = '{origin}') AS new_{origin},\n"
        for origin in ("seed", *SIGNAL_KINDS)
    )
    + """       count(*) FILTER (WHERE round = first_round AND origin = 'random')     AS new_random
FROM member LEFT JOIN v_runs r USING (run_id)
GROUP BY run_id, round
ORDER BY run_id, round;

-- Purpose: the forgetting signal's rule (coevolve/signals/forgetting.py) over the stored trajectories: a trajectory
-- of round r with reward < 0.5 whose task had a reward >= 0.5 among its last W rewards before
-- round r (W = signals.forgetting_window of the run's recorded configuration; every earlier reward
-- for a run without a record), with whether the miner stored that forgetting signal.
CREATE VIEW v_forgetting_events AS
WITH ordered AS (
    SELECT run_id, task_id, round, sample, reward, trajectory_id,
           row_number() OVER (PARTITION BY run_id, task_id ORDER BY round, sample) AS position
    FROM trajectories
), played AS (
    SELECT run_id, task_id, round, min(position) - 1 AS before
    FROM ordered GROUP BY run_id, task_id, round
), windows AS (
    SELECT p.run_id, p.task_id, p.round, max(o.reward) AS best_before, count(*) AS window_size
    FROM played p
    LEFT JOIN (SELECT run_id, TRY_CAST(json_extract(config, '$.signals.forgetting_window') AS INTEGER) AS w
               FROM runs) c ON c.run_id = p.run_id
    JOIN ordered o ON o.run_id = p.run_id AND o.task_id = p.task_id AND o.position <= p.before
                  AND (c.w IS NULL OR o.position > p.before - c.w)
    GROUP BY p.run_id, p.task_id, p.round
), flagged AS (
    SELECT DISTINCT run_id, round, trajectory_id FROM signals WHERE kind = 'forgetting'
)
SELECT o.run_id, r.environment, o.task_id, o.round, o.trajectory_id, o.sample, o.reward, w.best_before,
       w.window_size, f.trajectory_id IS NOT NULL AS signalled
FROM ordered o
LEFT JOIN v_runs r ON r.run_id = o.run_id
JOIN windows w ON w.run_id = o.run_id AND w.task_id = o.task_id AND w.round = o.round
LEFT JOIN flagged f ON f.run_id = o.run_id AND f.round = o.round AND f.trajectory_id = o.trajectory_id
WHERE w.best_before >= 0.5 AND o.reward < 0.5;

-- Purpose: how many synthesized candidates validation accepts, per round (pending = not yet judged).
CREATE VIEW v_acceptance_rates AS
SELECT run_id, any_value(r.environment)          AS environment, round,
       count(*) FILTER (WHERE accepted)          AS accepted,
       count(*) FILTER (WHERE NOT accepted)      AS rejected,
       count(*) FILTER (WHERE accepted IS NULL)  AS pending,
       count(*) FILTER (WHERE accepted)
           / nullif(count(*) FILTER (WHERE accepted IS NOT NULL), 0) AS acceptance_rate
FROM candidates LEFT JOIN v_runs r USING (run_id)
GROUP BY run_id, round
ORDER BY run_id, round;

-- Purpose: BFCL multi-turn scores as the leaderboard computes them, per evaluated (run, round):
-- accuracy of each category and the overall, the unweighted mean of the four categories with a
-- category that was not evaluated counted as 0 (bfcl-eval's calculate_unweighted_accuracy).
CREATE VIEW v_bfcl_multi_turn AS
WITH per_category AS (
    SELECT run_id, round, split, avg(success::DOUBLE) AS accuracy, count(*) AS tasks
    FROM evaluations
    WHERE split IN ('multi_turn_base', 'multi_turn_miss_func', 'multi_turn_miss_param', 'multi_turn_long_context')
    GROUP BY run_id, round, split
)
SELECT run_id, any_value(r.environment)                                AS environment, round,
       max(accuracy) FILTER (WHERE split = 'multi_turn_base')         AS multi_turn_base,
       max(accuracy) FILTER (WHERE split = 'multi_turn_miss_func')    AS multi_turn_miss_func,
       max(accuracy) FILTER (WHERE split = 'multi_turn_miss_param')   AS multi_turn_miss_param,
       max(accuracy) FILTER (WHERE split = 'multi_turn_long_context') AS multi_turn_long_context,
       sum(accuracy) / 4                                              AS multi_turn_overall,
       count(*) = 4                                                   AS all_categories,
       sum(tasks)                                                     AS tasks
FROM per_category LEFT JOIN v_runs r USING (run_id)
GROUP BY run_id, round
ORDER BY run_id, round;

-- Purpose: a run as one GRPO run: every training step (the update of each of a round's
-- training.batches_per_round batches) in order, the checkpoint it trained and the one it wrote.
CREATE VIEW v_training_steps AS
SELECT run_id, r.environment, round,
       coalesce(CAST(json_extract(output, '$.step') AS INTEGER), 0)        AS step,
       json_extract_string(output, '$.trained_from')                       AS trained_from,
       json_extract_string(output, '$.checkpoint')                         AS checkpoint,
       CAST(json_extract(output, '$.stats.groups') AS INTEGER)             AS groups,
       CAST(json_extract(output, '$.stats.steps') AS INTEGER)              AS optimizer_steps,
       CAST(json_extract(output, '$.stats.global_step') AS INTEGER)        AS global_step,
       CAST(json_extract(output, '$.stats.loss') AS DOUBLE)                AS loss,
       coalesce(CAST(json_extract(output, '$.stats.skipped') AS BOOLEAN), false) AS skipped,
       json_extract_string(output, '$.stats.optimizer_resumed_from')       AS optimizer_resumed_from,
       json_extract(output, '$.trained_on')                                AS trained_on,
       finished_at
FROM stage_runs LEFT JOIN v_runs r USING (run_id)
WHERE stage = 'update' OR stage LIKE 'update@%'
ORDER BY run_id, round, step;

-- Purpose: the curriculum. Each pool task's statistics as round r's sampler saw them (storage/task_stats.py):
-- episodes played before r, recent successes, the Beta posterior of its success and its learnability p(1-p),
-- with the success it then had in round r (NULL when round r did not draw it).
CREATE VIEW v_task_difficulty AS
WITH observed AS (
    SELECT run_id, round, task_id, count(*) AS episodes_in_round, avg(success::DOUBLE) AS success_in_round
    FROM trajectories GROUP BY ALL
)
SELECT d.run_id, r.environment, d.round, d.task_id, d.origin, d.played, d.recent_played, d.recent_successes,
       d.last_round, d.prior_mean, d.alpha, d.beta, d.estimate,
       d.estimate * (1 - d.estimate)            AS learnability,
       coalesce(o.episodes_in_round, 0)         AS episodes_in_round,
       o.success_in_round
FROM task_difficulty AS d
LEFT JOIN observed AS o USING (run_id, round, task_id)
LEFT JOIN v_runs AS r ON r.run_id = d.run_id
ORDER BY d.run_id, d.round, d.task_id;

-- Purpose: what each stage of each round cost: seconds and peak memory as its record measured them
-- (tasks/stage_cost.py; NULL in records of older versions), the tokens its episodes generated, the episodes
-- it played or scored, and the optimizer steps an update took or skipped (no group with reward variance).
CREATE VIEW v_stage_cost AS
WITH group_sizes AS (
    SELECT run_id, coalesce(CAST(json_extract(config, '$.rollout.group_size') AS INTEGER), 1) AS group_size FROM runs
),
step_tokens AS (
    SELECT s.run_id, s.round, t.sample // g.group_size AS step, sum(s.completion_tokens) AS tokens
    FROM steps AS s
    JOIN trajectories AS t USING (run_id, round, trajectory_id)
    JOIN group_sizes AS g USING (run_id)
    GROUP BY ALL
),
records AS (
    SELECT run_id, round, stage, finished_at, output, cost,
           split_part(stage, '@', 1)                                    AS kind,
           coalesce(TRY_CAST(nullif(split_part(stage, '@', 2), '') AS INTEGER), 0) AS step
    FROM stage_runs
)
SELECT c.run_id, r.environment, c.round, c.stage, c.kind, c.step,
       CAST(json_extract(c.cost, '$.seconds') AS DOUBLE)                AS seconds,
       k.tokens                                                         AS tokens_generated,
       k.tokens / nullif(CAST(json_extract(c.cost, '$.seconds') AS DOUBLE), 0) AS tokens_per_s,
       CASE c.kind
           WHEN 'rollout' THEN CAST(json_extract(c.output, '$.trajectories') AS BIGINT)
           WHEN 'update' THEN CAST(json_extract(c.output, '$.stats.trajectories') AS BIGINT)
           WHEN 'evaluate' THEN CAST(json_extract(c.output, '$.heldout_tasks') AS BIGINT)
                + coalesce(CAST(json_extract(c.output, '$.dev_tasks') AS BIGINT), 0)
       END                                                              AS episodes,
       CASE WHEN c.kind = 'update' THEN CAST(json_extract(c.output, '$.stats.steps') AS INTEGER) END
                                                                        AS optimizer_steps,
       CASE WHEN c.kind = 'update'
            THEN coalesce(CAST(json_extract(c.output, '$.stats.skipped') AS BOOLEAN), false) END AS skipped,
       CASE WHEN c.kind = 'update' THEN CAST(json_extract(c.output, '$.stats.groups') AS INTEGER) END
                                                                        AS groups_trained,
       CASE WHEN c.kind = 'update' THEN CAST(json_extract(c.output, '$.stats.groups_flat') AS INTEGER) END
                                                                        AS groups_flat,
       CAST(json_extract(c.cost, '$.peak_rss_mib') AS DOUBLE)           AS peak_rss_mib,
       CAST(json_extract(c.cost, '$.peak_gpu_mib') AS DOUBLE)           AS peak_gpu_mib,
       c.finished_at
FROM records AS c
LEFT JOIN step_tokens AS k ON c.kind = 'rollout' AND k.run_id = c.run_id AND k.round = c.round AND k.step = c.step
LEFT JOIN v_runs AS r ON r.run_id = c.run_id
ORDER BY c.run_id, c.round, c.finished_at, c.stage;
"""
)
