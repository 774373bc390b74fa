"""The single-file DuckDB warehouse's schema (``warehouse.duckdb``): layout versions 1 and 2.

Kept unchanged because ``coevolve warehouse migrate`` reads files written by them
(storage/single_file_conversion.py); the open-table layout's versions are in storage/layouts.py.
"""

from __future__ import annotations

_TABLES = """
CREATE TABLE runs (
    run_id      VARCHAR PRIMARY KEY,
    created_at  TIMESTAMP NOT NULL,
    config      JSON
);

CREATE TABLE rounds (
    run_id       VARCHAR NOT NULL,
    round        INTEGER NOT NULL,
    status       VARCHAR NOT NULL,          -- running | finished
    summary      JSON,                      -- RoundSummary.to_dict() once finished
    flow_run_id  VARCHAR,
    started_at   TIMESTAMP,
    finished_at  TIMESTAMP,
    PRIMARY KEY (run_id, round)
);

-- Tasks are content-addressed and shared by runs; a run sees them through pool_membership.
CREATE TABLE tasks (
    task_id               VARCHAR PRIMARY KEY,
    environment           VARCHAR NOT NULL,
    origin                VARCHAR NOT NULL,
    round                 INTEGER NOT NULL,
    parent_trajectory_id  VARCHAR,
    signal_id             VARCHAR,
    content_hash          VARCHAR NOT NULL,
    task                  JSON NOT NULL,
    tools                 VARCHAR[] NOT NULL
);

-- position keeps the order the pool was given in, so reads return the pool as written.
CREATE TABLE pool_membership (
    run_id    VARCHAR NOT NULL,
    round     INTEGER NOT NULL,
    position  INTEGER NOT NULL,
    task_id   VARCHAR NOT NULL,
    PRIMARY KEY (run_id, round, task_id)
);

CREATE TABLE trajectories (
    trajectory_id    VARCHAR PRIMARY KEY,
    run_id           VARCHAR NOT NULL,
    round            INTEGER NOT NULL,
    task_id          VARCHAR NOT NULL,
    sample           INTEGER NOT NULL,
    reward           DOUBLE NOT NULL,
    success          BOOLEAN NOT NULL,
    finish_reason    VARCHAR NOT NULL,
    num_steps        INTEGER NOT NULL,
    tool_sequence    VARCHAR[] NOT NULL,
    prompt_ids       INTEGER[] NOT NULL,
    completion_ids   INTEGER[] NOT NULL,
    completion_mask  TINYINT[] NOT NULL,
    logprobs         DOUBLE[] NOT NULL,
    duration_s       DOUBLE NOT NULL
);

-- step_index is the position in the trajectory; step_number is Step.index as the agent set it.
-- observations[i] is the result of the call named tool_names[i].
CREATE TABLE steps (
    trajectory_id      VARCHAR NOT NULL,
    step_index         INTEGER NOT NULL,
    step_number        INTEGER NOT NULL,
    turn               INTEGER NOT NULL,
    model_text         VARCHAR NOT NULL,
    calls              JSON NOT NULL,
    tool_names         VARCHAR[] NOT NULL,
    observations       VARCHAR[] NOT NULL,
    error              VARCHAR,
    completion_tokens  INTEGER NOT NULL,
    PRIMARY KEY (trajectory_id, step_index)
);

CREATE TABLE signals (
    signal_id      VARCHAR NOT NULL,
    run_id         VARCHAR NOT NULL,
    round          INTEGER NOT NULL,
    kind           VARCHAR NOT NULL,
    trajectory_id  VARCHAR NOT NULL,
    task_id        VARCHAR NOT NULL,
    evidence       JSON NOT NULL,
    PRIMARY KEY (run_id, round, signal_id)
);

-- signal_key is signal_id with '' for candidates of the random control (no signal), so it can be a key.
CREATE TABLE candidates (
    run_id      VARCHAR NOT NULL,
    round       INTEGER NOT NULL,
    task_id     VARCHAR NOT NULL,
    signal_key  VARCHAR NOT NULL,
    signal_id   VARCHAR,
    origin      VARCHAR NOT NULL,
    accepted    BOOLEAN,                    -- NULL until validated
    reason      VARCHAR,
    task        JSON NOT NULL,
    PRIMARY KEY (run_id, round, task_id, signal_key)
);

CREATE TABLE evaluations (
    run_id         VARCHAR NOT NULL,
    round          INTEGER NOT NULL,
    split          VARCHAR NOT NULL,
    task_id        VARCHAR NOT NULL,
    success        BOOLEAN NOT NULL,
    reward         DOUBLE NOT NULL,
    trajectory_id  VARCHAR,
    PRIMARY KEY (run_id, round, split, task_id)
);

-- One row per finished stage of a round: what a resumed round skips and what it reuses.
CREATE TABLE stage_runs (
    run_id       VARCHAR NOT NULL,
    round        INTEGER NOT NULL,
    stage        VARCHAR NOT NULL,
    finished_at  TIMESTAMP NOT NULL,
    output       JSON NOT NULL,
    PRIMARY KEY (run_id, round, stage)
);
"""

_VIEWS = """
-- Purpose: the learning curve. Training-rollout success and reward per round.
CREATE VIEW v_success_by_round AS
SELECT run_id, round,
       count(*)                                  AS trajectories,
       count(DISTINCT task_id)                   AS tasks,
       count(*) FILTER (WHERE success)  AS successes,
       avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
       avg(reward)                               AS mean_reward
FROM trajectories
GROUP BY run_id, round;

-- Purpose: which tasks the policy masters or never solves, over all rounds of a run.
CREATE VIEW v_success_by_task AS
SELECT tr.run_id, tr.task_id,
       any_value(t.origin)                        AS origin,
       count(*)                                   AS attempts,
       count(*) FILTER (WHERE tr.success) AS successes,
       avg(CASE WHEN tr.success THEN 1.0 ELSE 0.0 END) AS success_rate,
       min(tr.round)                              AS first_round,
       max(tr.round)                              AS last_round
FROM trajectories tr
LEFT JOIN tasks t USING (task_id)
GROUP BY tr.run_id, tr.task_id;

-- Purpose: which tools the policy misuses. A call failed when its observation is an error
-- (text starting with 'Error', any case, or a JSON/dict result whose first key is "error").
CREATE VIEW v_tool_failure_rates AS
WITH calls AS (
    SELECT tr.run_id,
           unnest(s.tool_names)   AS tool_name,
           unnest(s.observations) AS observation
    FROM steps s JOIN trajectories tr USING (trajectory_id)
), judged AS (
    SELECT run_id, tool_name,
           coalesce(
               lower(ltrim(observation)) LIKE 'error%'
               OR regexp_matches(observation, '^\\s*\\{\\s*["'']error["'']'),
               false) AS failed
    FROM calls
    WHERE tool_name IS NOT NULL
)
SELECT run_id, tool_name,
       count(*)                                  AS calls,
       count(*) FILTER (WHERE failed)   AS failed_calls,
       avg(CASE WHEN failed THEN 1.0 ELSE 0.0 END) AS failure_rate
FROM judged
GROUP BY run_id, tool_name;

-- Purpose: how much each signal kind contributes per round (the paper: boundary is 45-51%).
CREATE VIEW v_signal_mix AS
SELECT run_id, round, kind,
       count(*) AS signals,
       count(*) / sum(count(*)) OVER (PARTITION BY run_id, round) AS share
FROM signals
GROUP BY run_id, round, kind;

-- Purpose: pool size per round and which origins the newly added tasks have.
-- A task is new in a round when no earlier round of the same run had it in its pool.
CREATE VIEW v_pool_growth AS
WITH member AS (
    SELECT pm.run_id, pm.round, pm.task_id, t.origin,
           min(pm.round) OVER (PARTITION BY pm.run_id, pm.task_id) AS first_round
    FROM pool_membership pm LEFT JOIN tasks t USING (task_id)
)
SELECT run_id, round,
       count(*)                                                             AS pool_size,
       count(*) FILTER (WHERE round = first_round)                 AS new_tasks,
       count(*) FILTER (WHERE round = first_round AND origin = 'seed')       AS new_seed,
       count(*) FILTER (WHERE round = first_round AND origin = 'forgetting') AS new_forgetting,
       count(*) FILTER (WHERE round = first_round AND origin = 'boundary')   AS new_boundary,
       count(*) FILTER (WHERE round = first_round AND origin = 'rare')       AS new_rare,
       count(*) FILTER (WHERE round = first_round AND origin = 'random')     AS new_random
FROM member
GROUP BY run_id, round;

-- Purpose: tasks the policy could solve in an earlier round and fails now, measured on
-- per-round success rates (score >= 0.5 before, < 0.5 now), with whether the miner flagged it.
CREATE VIEW v_forgetting_events AS
WITH per_round AS (
    SELECT run_id, task_id, round,
           avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS score
    FROM trajectories
    GROUP BY run_id, task_id, round
), history AS (
    SELECT *,
           max(score) OVER (PARTITION BY run_id, task_id ORDER BY round
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS best_before
    FROM per_round
)
SELECT h.run_id, h.task_id, h.round, h.score, h.best_before,
       EXISTS (SELECT 1 FROM signals s
               WHERE s.run_id = h.run_id AND s.round = h.round
                 AND s.task_id = h.task_id AND s.kind = 'forgetting') AS signalled
FROM history h
WHERE h.best_before >= 0.5 AND h.score < 0.5;

-- Purpose: how many synthesized candidates validation accepts, per round (pending = not yet judged).
CREATE VIEW v_acceptance_rates AS
SELECT run_id, round,
       count(*) FILTER (WHERE accepted)          AS accepted,
       count(*) FILTER (WHERE NOT accepted)      AS rejected,
       count(*) FILTER (WHERE accepted IS NULL)  AS pending,
       count(*) FILTER (WHERE accepted)
           / nullif(count(*) FILTER (WHERE accepted IS NOT NULL), 0) AS acceptance_rate
FROM candidates
GROUP BY run_id, round;
"""

# The single-file DuckDB warehouse, in the order its migrations were applied.
SINGLE_FILE_MIGRATIONS: list[tuple[int, str]] = [
    (1, _TABLES),
    (2, _VIEWS),
]
SINGLE_FILE_VERSION: int = SINGLE_FILE_MIGRATIONS[-1][0]
