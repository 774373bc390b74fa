"""The analysis views give the expected numbers on a small hand-built run."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from coevolve.config import PipelineConfig
from coevolve.errors import PipelineError
from coevolve.records import Candidate, Signal, Verdict
from storage.warehouse import Warehouse
from tasks.mine import mine_signals

RUN = "run-a"


@pytest.fixture
def history(warehouse: Warehouse, make_task, make_trajectory) -> Warehouse:
    """Round 0: t0 solved twice, t1 once; round 1: t0 forgotten, t1 solved twice, cd fails on t0."""
    t0, t1 = make_task(0), make_task(1)
    t2, t3 = make_task(2, origin="boundary", round=1), make_task(3, origin="rare", round=1)
    warehouse.write_tasks([t0, t1, t2, t3])
    warehouse.set_pool(RUN, 0, [t0.task_id, t1.task_id])
    warehouse.set_pool(RUN, 1, [t0.task_id, t1.task_id, t2.task_id, t3.task_id])
    trajs = [
        make_trajectory(t0.task_id, 0, True),
        make_trajectory(t0.task_id, 1, True),
        make_trajectory(t1.task_id, 0, True),
        make_trajectory(t1.task_id, 1, False),
        make_trajectory(t0.task_id, 0, False, round=1, observations=("ok", "Error: no such directory")),
        make_trajectory(t0.task_id, 1, False, round=1, observations=("ok", "error: no such directory")),
        make_trajectory(t1.task_id, 0, True, round=1, observations=('{"error": "exists"}', "ok")),
        make_trajectory(t1.task_id, 1, True, round=1),
    ]
    warehouse.write_trajectories(trajs)
    warehouse.write_signals(
        [
            Signal(RUN, 0, "boundary", trajs[2].trajectory_id, t1.task_id, {}),
            Signal(RUN, 0, "boundary", trajs[3].trajectory_id, t1.task_id, {}),
            Signal(RUN, 0, "rare", trajs[0].trajectory_id, t0.task_id, {}),
            Signal(RUN, 1, "forgetting", trajs[4].trajectory_id, t0.task_id, {}),
        ]
    )
    candidates = [
        Candidate(make_task(10 + i, origin="boundary"), f"boundary:{i}", Verdict(True, "ok")) for i in range(3)
    ]
    candidates.append(Candidate(make_task(20, origin="rare"), "rare:0", Verdict(False, "no reward")))
    candidates.append(Candidate(make_task(21, origin="rare"), "rare:1"))
    warehouse.write_candidates(RUN, 0, candidates)
    return warehouse


def test_success_by_round(history: Warehouse) -> None:
    rows = history.sql(
        "SELECT round, trajectories, tasks, successes, success_rate, mean_reward FROM v_success_by_round ORDER BY round"
    )
    assert rows.rows() == [(0, 4, 2, 3, 0.75, 0.75), (1, 4, 2, 2, 0.5, 0.5)]


def test_mean_reward_by_round_is_the_mean_of_the_rounds_rewards_not_their_best(
    warehouse: Warehouse, make_task, make_trajectory
) -> None:
    """Partial rewards (an environment may grant some to a failed episode) keep the mean apart from the success rate."""
    task = make_task(0)
    warehouse.write_tasks([task])
    rewards = [(0, 1.0, True), (1, 0.5, False), (2, 0.0, False), (3, 0.25, False)]
    warehouse.write_trajectories(
        [dataclasses.replace(make_trajectory(task.task_id, s, ok), reward=r) for s, r, ok in rewards]
    )
    rows = warehouse.sql("SELECT round, successes, success_rate, mean_reward FROM v_success_by_round")
    assert rows.rows() == [(0, 1, 0.25, 0.4375)]


def test_success_by_task(history: Warehouse, make_task) -> None:
    rows = history.sql(
        "SELECT task_id, origin, attempts, successes, success_rate, first_round, last_round FROM v_success_by_task"
    )
    by_task = {r[0]: r[1:] for r in rows.rows()}
    assert by_task[make_task(0).task_id] == ("seed", 4, 2, 0.5, 0, 1)
    assert by_task[make_task(1).task_id] == ("seed", 4, 3, 0.75, 0, 1)


def test_tool_failure_rates_count_error_observations_per_tool(history: Warehouse) -> None:
    rows = history.sql(
        "SELECT tool_name, calls, failed_calls, failure_rate FROM v_tool_failure_rates ORDER BY tool_name"
    )
    assert rows.rows() == [("cd", 8, 2, 0.25), ("mkdir", 8, 1, 0.125)]


# The view's definition, judged on every observation of the steps (what tool_call_counts sums at write time).
FAILURES_FROM_STEPS = """
WITH calls AS (
    SELECT run_id, unnest(tool_names) AS tool_name, unnest(observations) AS observation FROM steps
)
SELECT run_id, tool_name, count(*) AS calls,
       count(*) FILTER (WHERE coalesce(
           lower(ltrim(observation)) LIKE 'error%' OR regexp_matches(observation, '^\\s*\\{\\s*["'']error["'']'),
           false)) AS failed_calls
FROM calls WHERE tool_name IS NOT NULL GROUP BY ALL ORDER BY ALL
"""


def test_tool_failure_rates_equal_judging_every_stored_observation(
    warehouse: Warehouse, make_task, make_trajectory
) -> None:
    tricky = ("  ERROR: denied", "no error here", " {'error': 'x'}", '{"result": "error"}', "Errors", "", "ok")
    trajs = [
        make_trajectory(
            make_task(i).task_id, s, False, round=r, observations=(tricky[(i + s) % 7], tricky[(i + 2 * s + r) % 7])
        )
        for i in range(4)
        for s in range(3)
        for r in range(2)
    ]
    warehouse.write_trajectories(trajs[:10])  # two batches, so counts of several files add up
    warehouse.write_trajectories(trajs[10:])
    expected = warehouse.sql(FAILURES_FROM_STEPS).rows()
    assert (
        warehouse.sql("SELECT run_id, tool_name, calls, failed_calls FROM v_tool_failure_rates ORDER BY ALL").rows()
        == expected
    )
    assert sum(row[3] for row in expected) > 0


def test_a_step_with_fewer_observations_than_calls_counts_the_unanswered_call_as_not_failed(
    warehouse: Warehouse, make_task, make_trajectory
) -> None:
    trajectory = make_trajectory(make_task(0).task_id, 0, False, observations=("Error: x",))
    warehouse.write_trajectories([trajectory])
    expected = warehouse.sql(FAILURES_FROM_STEPS).rows()
    assert (
        warehouse.sql("SELECT run_id, tool_name, calls, failed_calls FROM v_tool_failure_rates ORDER BY ALL").rows()
        == expected
    )


def test_signal_mix_counts_and_shares_kinds_per_round(history: Warehouse) -> None:
    rows = history.sql("SELECT round, kind, signals, share FROM v_signal_mix ORDER BY round, kind")
    assert rows.rows() == [
        (0, "boundary", 2, pytest.approx(2 / 3)),
        (0, "rare", 1, pytest.approx(1 / 3)),
        (1, "forgetting", 1, 1.0),
    ]


def test_pool_growth_counts_new_tasks_by_origin(history: Warehouse) -> None:
    rows = history.sql(
        "SELECT round, pool_size, new_tasks, new_seed, new_boundary, new_rare, new_forgetting "
        "FROM v_pool_growth ORDER BY round"
    )
    assert rows.rows() == [(0, 2, 2, 2, 0, 0, 0), (1, 4, 2, 0, 1, 1, 0)]


def test_forgetting_events_find_a_solved_task_failing_later(history: Warehouse, make_task) -> None:
    rows = history.sql(
        "SELECT task_id, round, sample, reward, best_before, window_size, signalled "
        "FROM v_forgetting_events ORDER BY sample"
    )
    assert rows.rows() == [
        (make_task(0).task_id, 1, 0, 0.0, 1.0, 2, True),
        (make_task(0).task_id, 1, 1, 0.0, 1.0, 2, False),
    ]


def test_forgetting_events_are_the_miners_forgetting_signals(warehouse: Warehouse, make_task, make_trajectory) -> None:
    """A task solved by one of three samples (success rate 1/3) and failed later is forgotten by the miner's
    rule; one whose only success fell out of the last W rewards is not."""
    config = PipelineConfig(run_id=RUN, signals={"forgetting_window": 3, "enabled": ["forgetting"]})
    warehouse.ensure_run(RUN, config.model_dump(mode="json"))
    once, long_ago = make_task(0), make_task(1)
    trajs = [make_trajectory(once.task_id, s, s == 0) for s in range(3)]
    trajs += [make_trajectory(long_ago.task_id, 0, True)] + [
        make_trajectory(long_ago.task_id, s, False, round=1) for s in range(3)
    ]
    trajs += [make_trajectory(t.task_id, s, False, round=2) for t in (once, long_ago) for s in range(2)]
    warehouse.write_trajectories(trajs)
    for round_ in (1, 2):
        warehouse.write_signals(mine_signals(warehouse.trajectory_frame(RUN), round_, RUN, config.signals))
    fired = warehouse.sql("SELECT round, trajectory_id FROM signals WHERE kind = 'forgetting' ORDER BY ALL").rows()
    events = warehouse.sql("SELECT round, trajectory_id FROM v_forgetting_events ORDER BY ALL").rows()
    assert events == fired and len(fired) == 5  # round 1: long_ago x3; round 2: once x2
    assert warehouse.sql("SELECT bool_and(signalled) FROM v_forgetting_events").item() is True


def test_acceptance_rates_leave_pending_candidates_out_of_the_rate(history: Warehouse) -> None:
    rows = history.sql("SELECT round, accepted, rejected, pending, acceptance_rate FROM v_acceptance_rates")
    assert rows.rows() == [(0, 3, 1, 1, 0.75)]


def test_bfcl_multi_turn_overall_is_the_unweighted_mean_with_missing_categories_as_zero(warehouse: Warehouse) -> None:
    warehouse.write_evaluations(RUN, 0, "multi_turn_base", [(f"b{i}", i < 3, float(i < 3), None) for i in range(4)])
    warehouse.write_evaluations(RUN, 0, "multi_turn_miss_func", [("m0", True, 1.0, None), ("m1", False, 0.0, None)])
    warehouse.write_evaluations(RUN, 0, "heldout", [("h0", True, 1.0, None)])
    rows = warehouse.sql(
        "SELECT multi_turn_base, multi_turn_miss_func, multi_turn_miss_param, multi_turn_overall, all_categories, "
        "tasks FROM v_bfcl_multi_turn"
    )
    # (0.75 + 0.5 + 0 + 0) / 4: categories weigh the same whatever their sizes; held-out rows are not BFCL's.
    assert rows.rows() == [(0.75, 0.5, None, 0.3125, False, 6)]


def test_ad_hoc_sql_shows_intervals_as_text_and_refuses_statements_that_are_not_reads(history: Warehouse) -> None:
    frame = history.sql("SELECT TIMESTAMP '2026-01-02 00:00:05' - TIMESTAMP '2026-01-01' AS spread, 1 AS one")
    assert frame.columns == ["spread", "one"]
    assert frame["spread"].dtype == pl.String
    assert frame.row(0) == ("1 day 00:00:05", 1)
    with pytest.raises(PipelineError, match="is SET"):  # tests/storage/test_sql_door.py has the rest
        history.sql("SET threads = 1")


@pytest.mark.parametrize("view", ["v_success_by_round", "v_signal_mix", "v_pool_growth", "v_acceptance_rates"])
def test_views_that_read_as_curves_list_rounds_in_order(warehouse: Warehouse, make_task, make_trajectory, view) -> None:
    task = make_task(0)
    warehouse.write_tasks([task])
    for round_ in (2, 0, 1):  # written out of order, one file per round, as resumed and re-run rounds leave them
        warehouse.write_trajectories([make_trajectory(task.task_id, 0, round_ != 1, round=round_)])
        warehouse.set_pool(RUN, round_, [task.task_id])
        warehouse.write_signals([Signal(RUN, round_, "rare", f"traj-{round_}", task.task_id, {})])
        warehouse.write_candidates(
            RUN, round_, [Candidate(make_task(10 + round_), f"rare:{round_}", Verdict(True, "ok"))]
        )
    rounds = warehouse.sql(f"SELECT round FROM {view}").to_series().to_list()
    assert rounds == [0, 1, 2]


def test_training_steps_lists_every_update_step_in_order_and_older_records_as_step_zero(warehouse: Warehouse) -> None:
    def update(step: int, checkpoint: str, trained_from: str | None, global_step: int) -> dict:
        stats = {"groups": 2, "steps": 1, "global_step": global_step, "loss": 0.5, "skipped": False}
        record = {"checkpoint": checkpoint, "stats": stats, "trained_on": {}, "step": step}
        return record if trained_from is None else {**record, "trained_from": trained_from}

    warehouse.mark_stage(RUN, 0, "update", update(0, "c0s1", None, 1))  # as an older version recorded it
    warehouse.mark_stage(RUN, 1, "update@1", update(1, "c2", "c1s1", 3))
    warehouse.mark_stage(RUN, 1, "update", update(0, "c1s1", "c1", 2))
    warehouse.mark_stage(
        RUN, 1, "rollout@1", {"trajectories": 4, "tasks": 2, "success_rate": 0.5, "finish_reasons": {}}
    )
    rows = warehouse.sql(
        "SELECT round, step, trained_from, checkpoint, global_step FROM v_training_steps ORDER BY ALL"
    ).rows()
    assert rows == [(0, 0, None, "c0s1", 1), (1, 0, "c1", "c1s1", 2), (1, 1, "c1s1", "c2", 3)]


def test_every_analysis_view_names_the_environment_of_its_rows_from_the_run_configuration(
    warehouse: Warehouse, make_task, make_trajectory
) -> None:
    views = warehouse.sql("SELECT view_name FROM duckdb_views() WHERE view_name LIKE 'v\\_%' ESCAPE '\\'")
    for view in views["view_name"].to_list():
        assert warehouse.sql(f"SELECT * FROM {view} LIMIT 0").columns[:2] == ["run_id", "environment"], view

    warehouse.ensure_run("in-bfcl", {"environment": {"name": "bfcl"}, "policy": {"model": "builtin:tiny"}})
    warehouse.ensure_run("in-workplace", {"environment": {"name": "workplace"}, "policy": {"model": "m"}})
    task = make_task(0)
    warehouse.write_tasks([task])
    for run in ("in-bfcl", "in-workplace", "unrecorded"):
        warehouse.write_trajectories([make_trajectory(task.task_id, 0, True, run_id=run)])
    rows = warehouse.sql("SELECT run_id, environment FROM v_success_by_round ORDER BY run_id").rows()
    assert rows == [("in-bfcl", "bfcl"), ("in-workplace", "workplace"), ("unrecorded", None)]
    assert warehouse.sql("SELECT run_id, environment, model FROM v_runs ORDER BY run_id").rows() == [
        ("in-bfcl", "bfcl", "builtin:tiny"),
        ("in-workplace", "workplace", "m"),
    ]
