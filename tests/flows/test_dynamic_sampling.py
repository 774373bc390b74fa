"""Dynamic sampling in a real round: flat groups stay stored but do not count, replacements are drawn until the
step has its informative groups or has spent its budget, and the update trains the counted groups only.

The tiny test policy wins no episode, so its groups are all flat. Two episodes of the first draw are stored
before the round starts, as an interrupted attempt would have left them (the rollout plays only what is
missing): one task's group won once and lost once, the other's lost twice.
"""

import os
import shutil

import pytest

from coevolve.stages import PrepareInput, RolloutInput
from flows.round import coevolve_round
from flows.stage import run_stage
from storage.warehouse import Warehouse
from tasks.samplers import draw_key, estimates_of, pool_sampler
from tests.storage.conftest import build_trajectory

pytestmark = pytest.mark.slow

TASKS, GROUP, FACTOR = 2, 2, 2.0


@pytest.fixture(scope="module")
def round0(prefect_api, tiny_config, tmp_path_factory):
    config = tiny_config(
        tmp_path_factory.mktemp("state"),
        pool={"sampler": "learnability"},
        rollout={"tasks_per_batch": TASKS, "group_size": GROUP, "dynamic_sampling": True, "max_rollout_factor": FACTOR},
    )
    run_stage(config, PrepareInput(round_=0))
    with Warehouse(config.warehouse_path) as wh:
        pool = wh.pool(config.run_id, 0)
        rows = wh.task_difficulty(config.run_id, 0, config.pool.history_episodes, config.pool.prior_strength, 6.0)
        first = pool_sampler(config.pool).draw(pool, estimates_of(rows), TASKS, draw_key(config.seed, 0, 0, 0))
        mixed, flat = first[0].task_id, first[1].task_id
        wh.write_trajectories(
            [
                build_trajectory(mixed, 0, True, run_id=config.run_id),
                build_trajectory(mixed, 1, False, run_id=config.run_id),
            ]
            + [build_trajectory(flat, s, False, run_id=config.run_id) for s in range(GROUP)]
        )
    coevolve_round(round_=0, config=config.model_dump(mode="json"))
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rollout = wh.stage_output(config.run_id, 0, "rollout")
        update = wh.stage_output(config.run_id, 0, "update")
        played = wh.outcomes(config.run_id, 0)
    return config, mixed, flat, rollout, update, played


def _episodes(played: dict) -> set[tuple[str, int]]:
    return set(zip(played["task_id"], played["sample"], strict=True))


def test_flat_groups_are_kept_and_replacements_fill_the_budget(round0):
    config, mixed, flat, rollout, _, played = round0
    budget = int(TASKS * GROUP * FACTOR)
    assert len(played["task_id"]) == rollout["trajectories"] == budget
    assert {mixed, flat} <= set(played["task_id"])  # the flat group stays in the warehouse for the miner
    assert (rollout["groups_played"], rollout["informative_groups"]) == (budget // GROUP, 1)
    # The batch, then one replacement for the one missing group, then one more with what the budget had left.
    assert rollout["draws"] == 3


def test_the_update_trains_only_the_groups_with_reward_variance(round0):
    _, mixed, _, rollout, update, _ = round0
    assert rollout["train_tasks"] == [mixed]
    assert update["stats"]["groups"] == 1
    assert update["trained_on"]["count"] == GROUP


def test_a_step_that_lost_its_last_draw_draws_and_plays_the_same_tasks_again(round0, tmp_path):
    config, _, _, rollout, _, played = round0
    # The state a crash leaves after the second replacement draw played, before its episodes and the rollout's
    # record were written: the same state folder without the newest trajectories file and without the record.
    copy = config.with_overrides({"state_dir": str(tmp_path / "state")})
    shutil.copytree(config.state_dir, copy.state_dir)
    partition = copy.warehouse_path / "tables" / "trajectories" / f"run_id={config.run_id}" / "round=0"
    newest = max(partition.glob("*.parquet"), key=os.path.getmtime)
    newest.unlink()
    (copy.warehouse_path / "catalog" / "stage_runs" / f"run_id={config.run_id}" / "round=0" / "rollout.json").unlink()
    with Warehouse(copy.warehouse_path, read_only=True) as wh:
        assert len(wh.stored_episodes(config.run_id, 0)) < len(played["task_id"])
        checkpoint = wh.stage_output(config.run_id, 0, "prepare")["checkpoint"]
    resumed = run_stage(copy, RolloutInput(round_=0, step=0, checkpoint=checkpoint))
    assert (resumed.draws, resumed.train_tasks) == (rollout["draws"], rollout["train_tasks"])
    with Warehouse(copy.warehouse_path, read_only=True) as wh:
        assert _episodes(wh.outcomes(config.run_id, 0)) == _episodes(played)
