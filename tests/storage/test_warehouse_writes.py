"""Writes are idempotent and every record reads back as it was written."""

from __future__ import annotations

from coevolve.records import Candidate, RoundSummary, Signal, Verdict
from storage.warehouse import Warehouse

RUN = "run-a"


def _counts(wh: Warehouse) -> dict[str, int]:
    tables = [
        "runs",
        "tasks",
        "pool_membership",
        "trajectories",
        "steps",
        "signals",
        "candidates",
        "evaluations",
        "rounds",
        "stage_runs",
    ]
    return {t: wh.sql(f"SELECT count(*) AS n FROM {t}")["n"][0] for t in tables}


def _write_everything(wh: Warehouse, make_task, make_trajectory) -> None:
    tasks = [make_task(i) for i in range(3)]
    trajs = [make_trajectory(t.task_id, s, s == 0) for t in tasks for s in range(2)]
    wh.ensure_run(RUN, {"rollout": {"group_size": 2}})
    wh.write_tasks(tasks)
    wh.set_pool(RUN, 0, [t.task_id for t in tasks])
    wh.write_trajectories(trajs)
    wh.write_signals([Signal(RUN, 0, "boundary", tr.trajectory_id, tr.task_id, {"rewards": [1, 0]}) for tr in trajs])
    wh.write_candidates(RUN, 0, [Candidate(tasks[0], "boundary:x", Verdict(True, "ok")), Candidate(tasks[1], None)])
    wh.write_evaluations(RUN, 0, "heldout", [(t.task_id, True, 1.0, "e") for t in tasks])
    wh.start_round(RUN, 0, "flow-1")
    wh.mark_stage(RUN, 0, "rollout", {"trajectories": 6})
    wh.finish_round(RUN, 0, RoundSummary(RUN, 0, 3, 6, 0.5, {"boundary": 6}, 1, 0, 1.0))


def test_writing_the_same_records_twice_keeps_the_same_row_counts(warehouse, make_task, make_trajectory) -> None:
    _write_everything(warehouse, make_task, make_trajectory)
    first = _counts(warehouse)
    _write_everything(warehouse, make_task, make_trajectory)
    assert _counts(warehouse) == first
    assert first == {
        "runs": 1,
        "tasks": 3,
        "pool_membership": 3,
        "trajectories": 6,
        "steps": 12,
        "signals": 6,
        "candidates": 2,
        "evaluations": 3,
        "rounds": 1,
        "stage_runs": 1,
    }


def test_a_rewritten_trajectory_replaces_the_old_one_and_its_steps(warehouse, make_task, make_trajectory) -> None:
    task = make_task(0)
    warehouse.write_trajectories([make_trajectory(task.task_id, 0, True)])
    shorter = make_trajectory(task.task_id, 0, False)
    shorter.steps = shorter.steps[:1]
    warehouse.write_trajectories([shorter])
    assert warehouse.trajectories(RUN, 0) == [shorter]
    assert warehouse.sql("SELECT count(*) AS n FROM steps")["n"][0] == 1


def test_tasks_round_trip_with_their_provenance(warehouse, make_task) -> None:
    tasks = [make_task(0), make_task(1, origin="rare", round=2)]
    warehouse.write_tasks(tasks)
    warehouse.set_pool(RUN, 2, [t.task_id for t in tasks])
    assert warehouse.pool(RUN, 2) == tasks


def test_trajectories_round_trip_with_steps_tokens_and_logprobs(warehouse, make_task, make_trajectory) -> None:
    trajs = [make_trajectory(make_task(i).task_id, s, s == 1) for i in range(2) for s in range(3)]
    warehouse.write_trajectories(trajs)
    assert warehouse.trajectories(RUN, 0) == sorted(trajs, key=lambda t: (t.task_id, t.sample))


def test_one_training_steps_trajectories_are_read_by_their_sample_range(warehouse, make_task, make_trajectory) -> None:
    trajs = [make_trajectory(make_task(i).task_id, s, s == 1) for i in range(2) for s in range(6)]
    warehouse.write_trajectories(trajs)
    second_step = [t for t in trajs if 2 <= t.sample < 4]
    assert warehouse.trajectories(RUN, 0, samples=range(2, 4)) == sorted(
        second_step, key=lambda t: (t.task_id, t.sample)
    )
    task = trajs[0].task_id
    assert [(t.task_id, t.sample) for t in warehouse.trajectories(RUN, 0, [task], range(4, 6))] == [
        (task, 4),
        (task, 5),
    ]


def test_the_pool_reads_back_in_the_order_it_was_set(warehouse, make_task) -> None:
    tasks = [make_task(i) for i in range(5)]
    warehouse.write_tasks(tasks)
    order = [tasks[3], tasks[0], tasks[4]]
    warehouse.set_pool(RUN, 1, [t.task_id for t in order])
    assert warehouse.pool(RUN, 1) == order


def test_setting_a_pool_again_replaces_that_round_only(warehouse, make_task) -> None:
    tasks = [make_task(i) for i in range(3)]
    warehouse.write_tasks(tasks)
    warehouse.set_pool(RUN, 0, [tasks[0].task_id])
    warehouse.set_pool(RUN, 1, [tasks[0].task_id, tasks[1].task_id])
    warehouse.set_pool(RUN, 1, [tasks[2].task_id])
    assert warehouse.pool(RUN, 0) == [tasks[0]]
    assert warehouse.pool(RUN, 1) == [tasks[2]]


def test_trajectory_frame_has_the_mining_columns_up_to_a_round(warehouse, make_task, make_trajectory) -> None:
    tid = make_task(0).task_id
    warehouse.write_trajectories([make_trajectory(tid, 0, True, round=r) for r in range(3)])
    frame = warehouse.trajectory_frame(RUN, upto_round=1)
    assert frame.columns == [
        "trajectory_id",
        "run_id",
        "round",
        "task_id",
        "sample",
        "reward",
        "success",
        "finish_reason",
        "tool_sequence",
    ]
    assert frame["round"].to_list() == [0, 1]
    assert frame["tool_sequence"].to_list() == [["mkdir", "cd"], ["mkdir", "cd"]]
    assert warehouse.trajectory_frame(RUN).height == 3
    assert warehouse.trajectory_frame("other-run").height == 0


def test_finished_rounds_read_back_as_summaries_in_order(warehouse) -> None:
    summaries = [
        RoundSummary(
            RUN, r, 10 + r, 60, 0.25 * r, {"rare": r}, r, 1, 0.5, pool_digest=f"d{r}", durations_s={"rollout": 1.5}
        )
        for r in (1, 0)
    ]
    for s in summaries:
        warehouse.start_round(RUN, s.round, f"flow-{s.round}")
        warehouse.finish_round(RUN, s.round, s)
    warehouse.start_round(RUN, 2, "flow-2")
    assert warehouse.rounds(RUN) == sorted(summaries, key=lambda s: s.round)
    assert warehouse.round_status(RUN, 2) == "running"
    assert warehouse.sql("SELECT flow_run_id FROM rounds WHERE round = 1")["flow_run_id"][0] == "flow-1"


def test_stage_output_is_none_until_the_stage_is_marked(warehouse) -> None:
    assert warehouse.stage_output(RUN, 0, "mine") is None
    warehouse.mark_stage(RUN, 0, "mine", {"signals": 4})
    warehouse.mark_stage(RUN, 0, "mine", {"signals": 5})
    assert warehouse.stage_output(RUN, 0, "mine") == {"signals": 5}


def test_clear_round_forgets_a_stage_and_later_ones_with_their_rows(warehouse, make_task, make_trajectory) -> None:
    _write_everything(warehouse, make_task, make_trajectory)
    warehouse.mark_stage(RUN, 0, "mine", {})
    warehouse.clear_round(RUN, 0, "mine")
    counts = _counts(warehouse)
    assert (counts["signals"], counts["candidates"], counts["evaluations"]) == (0, 0, 0)
    assert (counts["trajectories"], counts["steps"]) == (6, 12)
    assert warehouse.stage_output(RUN, 0, "rollout") == {"trajectories": 6}
    assert warehouse.stage_output(RUN, 0, "mine") is None


def test_clearing_a_step_stage_forgets_the_records_of_every_training_step(warehouse) -> None:
    for name in ("rollout", "update", "rollout@1", "update@1", "rollout@2", "mine"):
        warehouse.mark_stage(RUN, 0, name, {})
    warehouse.mark_stage(RUN, 1, "rollout@1", {})
    warehouse.clear_round(RUN, 0, "update")
    left = {name: warehouse.stage_output(RUN, 0, name) for name in ("rollout", "rollout@1", "rollout@2")}
    assert left == {"rollout": {}, "rollout@1": {}, "rollout@2": {}}
    assert [warehouse.stage_output(RUN, 0, n) for n in ("update", "update@1", "mine")] == [None, None, None]
    assert warehouse.stage_output(RUN, 1, "rollout@1") == {}


def test_a_candidate_gets_its_verdict_by_being_written_again(warehouse, make_task) -> None:
    task = make_task(0, origin="boundary")
    warehouse.write_candidates(RUN, 0, [Candidate(task, "boundary:t")])
    warehouse.write_candidates(RUN, 0, [Candidate(task, "boundary:t", Verdict(False, "did not complete"))])
    rows = warehouse.sql("SELECT accepted, reason FROM candidates").rows()
    assert rows == [(False, "did not complete")]


def test_evaluation_outcomes_are_the_latest_success_per_task_of_one_split(warehouse) -> None:
    warehouse.write_evaluations(RUN, 2, "heldout", [("t1", False, 0.0, "e1"), ("t2", True, 1.0, "e2")])
    warehouse.write_evaluations(RUN, 2, "heldout", [("t1", True, 1.0, "e3")])
    warehouse.write_evaluations(RUN, 2, "multi_turn_base", [("t1", False, 0.0, "e4")])
    assert warehouse.evaluation_outcomes(RUN, 2, "heldout") == {"t1": True, "t2": True}
    assert warehouse.evaluation_outcomes(RUN, 1, "heldout") == {}
