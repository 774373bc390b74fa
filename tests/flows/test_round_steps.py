"""Rounds of F training steps, the paper's schedule in miniature: 2 rounds x 3 steps, each on a fresh batch.

Real Prefect flow runs, warehouse, MLflow store and TRL trainer, as tests/flows/test_round.py.
"""

import pytest

from agent.checkpoints import checkpoint_digest
from flows.round import coevolve_round
from storage.warehouse import Warehouse
from tasks.mine import mine_warehouse

pytestmark = pytest.mark.slow

ROUNDS, STEPS = 2, 3


@pytest.fixture(scope="module")
def two_rounds(prefect_api, tiny_config, tmp_path_factory):
    # Every step's folder kept, so each one can be digested (crash test: the default deletes them).
    training = {"batches_per_round": STEPS, "updates_per_batch": 1, "keep_step_checkpoints": True}
    config = tiny_config(tmp_path_factory.mktemp("state"), training=training)
    summaries = [coevolve_round(round_=r, config=config.model_dump(mode="json")) for r in range(ROUNDS)]
    return config, summaries


def _records(config) -> dict[tuple[int, str], dict]:
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return {(r["round"], r["stage"]): r for r in wh.catalog.records("stage_runs", config.run_id)}


def test_every_step_plays_a_batch_of_its_own(two_rounds):
    config, summaries = two_rounds
    group = config.rollout.group_size
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        played = wh.sql(
            f"SELECT round, sample // {group} AS step, count(*) AS episodes, count(DISTINCT trajectory_id) AS ids "
            "FROM trajectories WHERE run_id = 'e2e' GROUP BY ALL ORDER BY ALL"
        ).to_dicts()
    batch = config.rollout.tasks_per_batch * group
    assert [(p["round"], p["step"]) for p in played] == [(r, s) for r in range(ROUNDS) for s in range(STEPS)]
    assert all(p["episodes"] == p["ids"] == batch for p in played)
    assert [s["rollouts"] for s in summaries] == [STEPS * batch] * ROUNDS


def test_each_step_is_played_with_the_policy_the_previous_step_trained(two_rounds):
    config, _ = two_rounds
    records = _records(config)
    for round_ in range(ROUNDS):
        for step in range(1, STEPS):
            played_with = records[(round_, f"rollout@{step}")]["output"]["checkpoint"]
            trained = records[(round_, "update" if step == 1 else f"update@{step - 1}")]["output"]["checkpoint"]
            assert played_with == trained


def test_six_updates_each_train_the_previous_ones_checkpoint(two_rounds):
    config, _ = two_rounds
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        steps = wh.training_steps(config.run_id)
        checkpoint0 = wh.stage_output(config.run_id, 0, "prepare")["checkpoint"]
    assert [(s["round"], s["step"]) for s in steps] == [(r, k) for r in range(ROUNDS) for k in range(STEPS)]
    # The lineage walks step by step from checkpoint 2 back to checkpoint 0.
    walked, checkpoint = [], str(config.checkpoint_dir(ROUNDS))
    by_output = {s["checkpoint"]: s for s in steps}
    while checkpoint in by_output:
        walked.append(by_output[checkpoint])
        checkpoint = by_output[checkpoint]["trained_from"]
    assert checkpoint == checkpoint0
    assert walked == steps[::-1]
    records = _records(config)
    for s in steps:
        stats = records[(s["round"], "update" if s["step"] == 0 else f"update@{s['step']}")]["output"]["stats"]
        if not stats["skipped"]:  # a step without an informative group copies its input
            assert checkpoint_digest(s["checkpoint"]) != checkpoint_digest(s["trained_from"])


def test_the_optimizer_state_carries_across_steps_and_rounds(two_rounds):
    config, _ = two_rounds
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        steps = wh.training_steps(config.run_id)
    # The tiny policy seldom earns a reward, so a step may skip (no group with reward variance): it then
    # passes its input's state on. tests/tasks/test_update_carry.py trains real groups across steps.
    for previous, step in zip(steps, steps[1:], strict=False):
        # Every step after the first one that trained resumes the state its predecessor saved.
        assert step["optimizer_resumed_from"] == (
            f"{previous['checkpoint']}/trainer_state" if previous["global_step"] > 0 else None
        )
    assert [s["global_step"] for s in steps] == sorted(s["global_step"] for s in steps)


def test_each_step_trains_on_the_informative_groups_of_its_own_batch(two_rounds):
    config, _ = two_rounds
    group = config.rollout.group_size
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        steps = wh.training_steps(config.run_id)
        informative = wh.sql(
            "SELECT round, step, sum(n)::INTEGER AS episodes FROM ("
            f"  SELECT round, sample // {group} AS step, count(*) AS n FROM trajectories WHERE run_id = 'e2e'"
            "   GROUP BY round, step, task_id HAVING max(reward) > min(reward)"
            ") GROUP BY ALL"
        ).to_dicts()
    expected = {(row["round"], row["step"]): row["episodes"] for row in informative}
    assert [s["trained_on"]["count"] for s in steps] == [expected.get((s["round"], s["step"]), 0) for s in steps]


def test_signals_are_mined_once_a_round_from_all_of_its_steps(two_rounds):
    config, _ = two_rounds
    records = _records(config)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        for round_ in range(ROUNDS):
            mined = records[(round_, "mine")]
            assert mined["finished_at"] > records[(round_, f"update@{STEPS - 1}")]["finished_at"]
            stored = wh.sql(f"SELECT signal_id FROM signals WHERE run_id = 'e2e' AND round = {round_} ORDER BY 1")
            again = mine_warehouse(wh, config.run_id, round_, config.signals)
            assert sorted(s.signal_id for s in again) == stored["signal_id"].to_list()
    assert not any(name.startswith("mine@") for _, name in records)
