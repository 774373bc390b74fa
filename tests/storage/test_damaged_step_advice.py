"""A damaged file of a training step's rollout names the record of that step (``rollout@K.json``), not step 0's.

A round of F steps stores every step's episodes in one partition, step k's with samples k x group_size
onwards (coevolve.stages.step_samples), each batch in files of one name. Running the round again after the
record named here is deleted plays that step's episodes again (tests/flows/test_finished_round.py follows it
in a real round and checks the rows come back); a finished round, or a step whose policy is gone, cannot,
and the advice says so and names what still works.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coevolve.errors import DataError
from coevolve.records import RoundSummary
from coevolve.stages import record_name, step_samples
from storage.tables import part_name
from storage.warehouse import Warehouse

RUN = "run-a"
GROUP_SIZE = 2
TASKS = 3
STEPS = 3


@pytest.fixture
def three_steps(tmp_path: Path, make_task, make_trajectory):
    """Round 0 of a run at its third training step: every step's rollout recorded, played by policies on disk."""
    root = tmp_path / "warehouse"
    policies = [tmp_path / "checkpoints" / f"policy-{k}" for k in range(STEPS)]
    with Warehouse(root) as wh:
        tasks = [make_task(i) for i in range(TASKS)]
        wh.write_tasks(tasks)
        wh.set_pool(RUN, 0, [t.task_id for t in tasks])
        wh.start_round(RUN, 0, "flow-run", {"rollout.group_size": GROUP_SIZE, "training.batches_per_round": STEPS})
        for step, policy in enumerate(policies):
            policy.mkdir(parents=True)
            episodes = [
                make_trajectory(t.task_id, s, s % 2 == 0) for t in tasks for s in step_samples(step, GROUP_SIZE)
            ]
            wh.write_trajectories(episodes)
            output = {"trajectories": len(episodes), "tasks": TASKS, "success_rate": 0.5, "finish_reasons": {}}
            wh.mark_stage(RUN, 0, record_name("rollout", step), {**output, "step": step, "checkpoint": str(policy)})
        files = {
            step: part_name([f"{RUN}/r0/{t.task_id}/s{s}" for t in tasks for s in step_samples(step, GROUP_SIZE)])
            for step in range(STEPS)
        }
    return root, files, policies


def batch_file(root: Path, table: str, name: str) -> Path:
    return root / "tables" / table / f"run_id={RUN}" / "round=0" / f"{name}.parquet"


def record(root: Path, stage: str) -> Path:
    return root / "catalog" / "stage_runs" / f"run_id={RUN}" / "round=0" / f"{stage}.json"


def damage(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def errors_of_every_reader(root: Path) -> list[str]:
    """The message each way of reading the round gives: the stage's read of its partition, and SQL."""
    messages = []
    with Warehouse(root, read_only=True) as wh:
        for read in (lambda: wh.trajectories(RUN, 0), lambda: wh.sql("SELECT count(*) FROM trajectories")):
            with pytest.raises(DataError) as caught:
                read()
            messages.append(str(caught.value))
    return messages


@pytest.mark.parametrize("step", [2, 1, 0])
def test_a_damaged_trajectories_file_names_the_record_of_its_own_step(three_steps, step):
    root, files, _ = three_steps
    path = batch_file(root, "trajectories", files[step])
    damage(path)
    for message in errors_of_every_reader(root):
        assert "\n" not in message and f"mv {path} {path}.damaged" in message
        assert f"delete the record of the stage that wrote it, the rollout of training step {step} " in message
        assert f"({record(root, record_name('rollout', step))})" in message
        others = [record(root, record_name("rollout", k)) for k in range(STEPS) if k != step]
        assert not any(str(other) in message for other in others)
        assert "run `coevolve round --round 0` again" in message


@pytest.mark.parametrize("table", ["steps", "tool_call_counts"])
def test_the_other_files_of_a_steps_batch_name_its_record_too(three_steps, table):
    root, files, _ = three_steps
    path = batch_file(root, table, files[2])
    damage(path)
    with Warehouse(root, read_only=True) as wh, pytest.raises(DataError) as caught:
        wh.sql(f"SELECT count(*) FROM {table}")
    assert f"({record(root, 'rollout@2')})" in str(caught.value)


def test_a_step_not_recorded_yet_is_played_again_without_deleting_anything(three_steps):
    root, files, _ = three_steps
    record(root, "rollout@2").unlink()  # the round stopped inside step 2's rollout
    damage(batch_file(root, "trajectories", files[2]))
    for message in errors_of_every_reader(root):
        assert "run `coevolve round --round 0` again: the rollout of training step 2, not recorded yet" in message
        assert "delete the record" not in message


def _left_out_and_the_rest_readable(root: Path, path: Path, message: str, gone: int) -> None:
    """Follows the advice (move the file aside) and checks every other row of the round is read as before."""
    assert "coevolve round" not in message and f"mv {path} {path}.damaged" in message
    shutil.move(path, f"{path}.damaged")
    with Warehouse(root, read_only=True) as wh:
        samples = sorted({t.sample for t in wh.trajectories(RUN, 0)})
        assert wh.sql("SELECT count(*) AS n FROM trajectories")["n"][0] == TASKS * GROUP_SIZE * (STEPS - 1)
    assert samples == [s for k in range(STEPS) if k != gone for s in step_samples(k, GROUP_SIZE)]


def test_a_finished_round_is_never_run_again_so_the_advice_is_to_restore_or_leave_the_rows_out(three_steps):
    root, files, _ = three_steps
    with Warehouse(root) as wh:
        wh.finish_round(RUN, 0, RoundSummary(RUN, 0, TASKS, 18, 0.5, {}, 0, 0, 0.0))
    path = batch_file(root, "trajectories", files[2])
    damage(path)
    messages = errors_of_every_reader(root)
    for message in messages:
        assert "round 0 is finished and never runs again" in message and "restore it from a backup" in message
    _left_out_and_the_rest_readable(root, path, messages[0], gone=2)


def test_a_step_whose_policy_is_gone_cannot_be_played_again_and_the_advice_says_so(three_steps):
    root, files, policies = three_steps
    shutil.rmtree(policies[2])  # deleted once the next step trained (training.keep_step_checkpoints off)
    path = batch_file(root, "trajectories", files[2])
    damage(path)
    messages = errors_of_every_reader(root)
    for message in messages:
        assert f"the policy that played these episodes ({policies[2]}) is gone" in message
    _left_out_and_the_rest_readable(root, path, messages[0], gone=2)
