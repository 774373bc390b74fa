"""Mechanism measurements of a round, read from warehouse files written in the test."""

from __future__ import annotations

import math

import pytest

from coevolve.records import Candidate, Signal, ToolCall, Verdict
from storage.mechanism import (
    accepted_by_kind,
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


def test_round_mechanism_reads_all_three_in_one_session(warehouse: Warehouse, make_task, make_trajectory):
    task = make_task(0, tools=("ls",))
    warehouse.write_tasks([task])
    warehouse.set_pool(RUN, HELDOUT, [task.task_id])
    warehouse.set_pool(RUN, 0, [task.task_id])
    warehouse.write_trajectories([make_trajectory(task.task_id, 0, True), make_trajectory(task.task_id, 1, False)])
    assert round_mechanism(warehouse, RUN, 0, 2) == {
        "informative_groups": 1.0,
        "heldout_coverage": 1.0,
        "accepted_by_kind": {},
    }
