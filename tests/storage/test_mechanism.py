"""Mechanism measurements of a round, read from warehouse files written in the test."""

from __future__ import annotations

import math

import pytest

from coevolve.records import Candidate, Signal, ToolCall, Verdict
from storage.mechanism import (
    accepted_by_kind,
    calibration,
    difficulty_histogram,
    heldout_coverage,
    round_mechanism,
    tool_patterns,
)
from storage.warehouse import Warehouse

RUN = "run-a"
HELDOUT = -1


def test_a_reference_gives_consecutive_call_name_pairs_across_its_turns():
    reference = [[ToolCall("mkdir"), ToolCall("cd")], [ToolCall("ls")]]
    assert tool_patterns(reference) == {("mkdir", "cd"), ("cd", "ls")}


def test_a_one_call_reference_gives_its_tool_name_alone():
    assert tool_patterns([[ToolCall("ls")]]) == {("ls",)}
    assert tool_patterns([[]]) == set()


def test_informative_groups_are_those_whose_rewards_differ(warehouse: Warehouse, make_task, make_trajectory):
    t0, t1, t2 = (make_task(i).task_id for i in range(3))
    warehouse.write_trajectories(
        [
            make_trajectory(t0, 0, True),
            make_trajectory(t0, 1, False),  # informative
            make_trajectory(t1, 0, True),
            make_trajectory(t1, 1, True),  # all solved
            make_trajectory(t2, 0, False),
            make_trajectory(t2, 1, False),  # all failed
            make_trajectory(t1, 0, True, round=1),
            make_trajectory(t1, 1, False, round=1),
            make_trajectory(t0, 0, True, run_id="other"),
            make_trajectory(t0, 1, True, run_id="other"),
        ]
    )
    assert round_mechanism(warehouse, RUN, 0, 2)["informative_groups"] == pytest.approx(1 / 3)
    assert round_mechanism(warehouse, RUN, 1, 2)["informative_groups"] == 1.0
    assert round_mechanism(warehouse, "other", 0, 2)["informative_groups"] == 0.0


def test_each_training_step_s_episodes_of_a_task_are_a_group_of_their_own(
    warehouse: Warehouse, make_task, make_trajectory
):
    task = make_task(0).task_id
    # Step 0 (samples 0-1) solved the task both times, step 1 (samples 2-3) once: one informative group of two.
    outcomes = [True, True, True, False]
    warehouse.write_trajectories([make_trajectory(task, sample, ok) for sample, ok in enumerate(outcomes)])
    assert round_mechanism(warehouse, RUN, 0, 2)["informative_groups"] == 0.5


def test_a_round_without_rollouts_has_no_informative_share(warehouse: Warehouse):
    assert math.isnan(round_mechanism(warehouse, RUN, 0, 2)["informative_groups"])


def test_coverage_is_the_share_of_heldout_patterns_found_in_the_training_pool(warehouse: Warehouse, make_task):
    heldout = [
        make_task(0, tools=("mkdir", "cd", "ls")),
        make_task(1, tools=("pwd",)),
        make_task(2, tools=("ls", "rm")),
    ]
    pool0 = [make_task(10, tools=("mkdir", "cd")), make_task(11, tools=("rm", "ls"))]
    pool1 = pool0 + [make_task(12, tools=("pwd",)), make_task(13, tools=("cd", "ls", "rm"))]
    warehouse.write_tasks(heldout + pool1)
    warehouse.set_pool(RUN, HELDOUT, [t.task_id for t in heldout])
    warehouse.set_pool(RUN, 0, [t.task_id for t in pool0])
    warehouse.set_pool(RUN, 1, [t.task_id for t in pool1])
    # Held-out patterns: mkdir>cd, cd>ls, pwd, ls>rm. Pool 0 has mkdir>cd only (rm>ls is the other order).
    assert heldout_coverage(warehouse, RUN, 0) == pytest.approx(1 / 4)
    assert heldout_coverage(warehouse, RUN, 1) == 1.0


def test_coverage_is_undefined_without_a_heldout_split(warehouse: Warehouse, make_task):
    task = make_task(0)
    warehouse.write_tasks([task])
    warehouse.set_pool(RUN, 0, [task.task_id])
    assert math.isnan(heldout_coverage(warehouse, RUN, 0))


def test_accepted_candidates_count_by_the_kind_of_their_signal_and_random_without_a_stored_one(
    warehouse: Warehouse, make_task
):
    warehouse.write_signals(
        [
            Signal(RUN, 0, "boundary", "run-a/r0/t/s0", "t", {}),
            Signal(RUN, 0, "rare", "run-a/r0/t/s1", "t", {}),
        ]
    )
    warehouse.write_candidates(
        RUN,
        0,
        [
            # The task's origin does not decide the kind: the signal it answers does.
            Candidate(make_task(1, origin="rare"), "boundary:run-a/r0/t/s0", Verdict(True, "ok")),
            Candidate(make_task(2, origin="boundary"), "boundary:run-a/r0/t/s0", Verdict(True, "ok")),
            Candidate(make_task(3, origin="rare"), "rare:run-a/r0/t/s1", Verdict(False, "no reward")),
            Candidate(make_task(4, origin="rare"), "rare:run-a/r0/t/s1"),
            # The random control's targets are not stored as signals: its candidates answer none.
            Candidate(make_task(5, origin="random"), "random:0:0", Verdict(True, "ok")),
            Candidate(make_task(6, origin="random"), None, Verdict(True, "ok")),
        ],
    )
    assert accepted_by_kind(warehouse, RUN, 0) == {"boundary": 2, "random": 2}
    assert accepted_by_kind(warehouse, RUN, 1) == {}


def test_round_mechanism_reads_every_measurement_in_one_session(warehouse: Warehouse, make_task, make_trajectory):
    task = make_task(0, tools=("ls",))
    warehouse.write_tasks([task])
    warehouse.set_pool(RUN, HELDOUT, [task.task_id])
    warehouse.set_pool(RUN, 0, [task.task_id])
    warehouse.write_trajectories([make_trajectory(task.task_id, 0, True), make_trajectory(task.task_id, 1, False)])
    measured = round_mechanism(warehouse, RUN, 0, 2)
    assert math.isnan(measured.pop("calibration"))  # the round has no task_difficulty rows
    assert measured == {
        "informative_groups": 1.0,
        "episodes_played": 2,
        "groups_played": 1,
        "episodes_per_informative_group": 2.0,
        "heldout_coverage": 1.0,
        "accepted_by_kind": {},
        "difficulty_histogram": {},
    }


# --- what a round played, and the curriculum's estimates ---------------------------------------------


def test_episodes_per_informative_group_divide_the_round_s_episodes_by_its_informative_groups(
    warehouse: Warehouse, make_task, make_trajectory
):
    t0, t1 = make_task(0).task_id, make_task(1).task_id
    # Groups of 2: t0 step 0 (informative), t0 step 1 (all failed), t1 step 0 (all solved).
    outcomes = {(t0, 0): True, (t0, 1): False, (t0, 2): False, (t0, 3): False, (t1, 0): True, (t1, 1): True}
    warehouse.write_trajectories([make_trajectory(t, sample, ok) for (t, sample), ok in outcomes.items()])
    measured = round_mechanism(warehouse, RUN, 0, 2)
    assert (measured["episodes_played"], measured["groups_played"]) == (6, 3)
    assert measured["episodes_per_informative_group"] == 6.0


def test_a_round_without_informative_groups_has_no_episodes_per_informative_group(
    warehouse: Warehouse, make_task, make_trajectory
):
    task = make_task(0).task_id
    warehouse.write_trajectories([make_trajectory(task, 0, True), make_trajectory(task, 1, True)])
    measured = round_mechanism(warehouse, RUN, 0, 2)
    assert measured["episodes_played"] == 2 and math.isnan(measured["episodes_per_informative_group"])


@pytest.fixture
def estimated_round(warehouse: Warehouse, make_task, make_trajectory) -> Warehouse:
    """Three pool tasks of three kinds (tools); round 0 solved t0 twice and failed t1 twice, so round 1's estimates
    (prior mean: the pool's 0.5, strength 2) are 0.75, 0.25 and 0.5 (t2, never played); round 1 then solved t0 once
    in 4 and t1 never in 2."""
    tasks = [make_task(i, tools=(f"tool{i}",)) for i in range(3)]
    t0, t1, _ = (t.task_id for t in tasks)
    warehouse.write_tasks(tasks)
    for round_ in (0, 1):
        warehouse.set_pool(RUN, round_, [t.task_id for t in tasks])
    warehouse.write_trajectories([make_trajectory(t, s, t == t0) for t in (t0, t1) for s in (0, 1)])
    estimates = warehouse.task_difficulty(RUN, 1, history_episodes=24, prior_strength=2.0, kind_strength=6.0)
    assert sorted(estimates.column("estimate").to_pylist()) == [0.25, 0.5, 0.75]
    warehouse.write_trajectories(
        [make_trajectory(t0, s, s == 0, round=1) for s in range(4)]
        + [make_trajectory(t1, s, False, round=1) for s in range(2)]
    )
    return warehouse


def test_calibration_is_the_episode_weighted_error_of_the_estimates_on_the_round_s_played_tasks(estimated_round):
    # t0: |0.75 - 1/4| over 4 episodes, t1: |0.25 - 0| over 2; t2 was not played and does not count.
    assert calibration(estimated_round, RUN, 1) == pytest.approx((4 * 0.5 + 2 * 0.25) / 6)


def test_the_difficulty_histogram_counts_pool_tasks_by_estimate_in_five_bins(estimated_round):
    assert difficulty_histogram(estimated_round, RUN, 1) == {
        "0.0-0.2": 0,
        "0.2-0.4": 1,
        "0.4-0.6": 1,
        "0.6-0.8": 1,
        "0.8-1.0": 0,
    }


def test_a_round_without_estimates_has_no_calibration_and_an_empty_histogram(estimated_round):
    assert math.isnan(calibration(estimated_round, RUN, 0)) and difficulty_histogram(estimated_round, RUN, 0) == {}
