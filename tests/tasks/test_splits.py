"""Where the run's splits are stored (pools under negative rounds) and who reads them: evaluation and validation;
and that no two splits share a task."""

import dataclasses
import itertools

import pytest

from coevolve.config import EnvironmentConfig, load_config
from envs.registry import make_environment
from storage.warehouse import Warehouse
from tasks.common import open_warehouse
from tasks.splits import (
    DEV_ROUND,
    EXTERNAL_ROUND,
    FINAL_HELDOUT_ROUND,
    HELDOUT_ROUND,
    build_dev_split,
    build_final_heldout,
    build_initial_pools,
    dev_eval_tasks,
    heldout_split,
    sealed_splits,
    store_dev_split,
    store_final_heldout,
    taken,
)


def _config(tmp_path, **rollout):
    return load_config(
        data={
            "state_dir": str(tmp_path),
            "pool": {"seed_size": 10},
            "policy": {"sft_tasks": 30},
            "rollout": {"heldout_tasks": 5, **rollout},
        },
        environ={},
    )


def _store_heldout(config):
    _, heldout = build_initial_pools(config)
    with open_warehouse(config) as wh:
        wh.write_tasks(heldout)
        wh.set_pool(config.run_id, HELDOUT_ROUND, [t.task_id for t in heldout])
    return heldout


def test_every_split_has_its_own_negative_round():
    rounds = [HELDOUT_ROUND, EXTERNAL_ROUND, DEV_ROUND, FINAL_HELDOUT_ROUND]
    assert len(set(rounds)) == 4 and max(rounds) < 0


def test_round_zero_stores_the_dev_split_under_its_own_pool_round(tmp_path):
    config = _config(tmp_path)
    with open_warehouse(config) as wh:
        stored = store_dev_split(config, wh)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        dev = wh.pool(config.run_id, DEV_ROUND)
    assert [t.task_id for t in dev] == [t.task_id for t in stored] == [t.task_id for t in build_dev_split(config)]


def test_validation_seals_the_stored_held_out_and_dev_splits(tmp_path):
    config = _config(tmp_path)
    heldout = _store_heldout(config)
    with open_warehouse(config) as wh:
        dev = store_dev_split(config, wh)
        assert sealed_splits(config, wh) == (heldout, dev)


def test_a_run_prepared_without_a_stored_dev_split_gets_it_sealed(tmp_path):
    config = _config(tmp_path)
    with open_warehouse(config) as wh:
        _, dev = sealed_splits(config, wh)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        stored = wh.pool(config.run_id, DEV_ROUND)
    assert [t.task_id for t in dev] == [t.task_id for t in stored] == [t.task_id for t in build_dev_split(config)]


def test_validation_also_seals_the_final_heldout_split(tmp_path):
    config = _config(tmp_path, final_heldout_tasks=7)
    heldout = _store_heldout(config)
    with open_warehouse(config) as wh:
        dev = store_dev_split(config, wh)
        final = store_final_heldout(config, wh)
        assert len(final) == 7 and sealed_splits(config, wh) == (heldout + final, dev)


def test_no_dev_tasks_are_scored_unless_asked_for(tmp_path):
    config = _config(tmp_path)
    assert config.rollout.dev_eval_tasks == 0
    with open_warehouse(config) as wh:
        assert dev_eval_tasks(config, wh) == []


def test_dev_evaluation_takes_the_first_tasks_of_the_stored_dev_split(tmp_path):
    config = _config(tmp_path, dev_eval_tasks=3)
    with open_warehouse(config) as wh:
        first = dev_eval_tasks(config, wh)  # not stored yet: built and stored where validation reads it
        stored = wh.pool(config.run_id, DEV_ROUND)
        again = dev_eval_tasks(config, wh)
    assert [t.task_id for t in first] == [t.task_id for t in build_dev_split(config)[:3]]
    assert [t.task_id for t in stored[:3]] == [t.task_id for t in first] == [t.task_id for t in again]


# --- disjoint by construction: no task, however worded, in two of D_0, held-out, dev, final held-out ---------


@pytest.mark.parametrize("environment", ["bfcl", "workplace"])
def test_the_splits_of_every_builtin_environment_share_no_task_by_id_or_identity(tmp_path, environment):
    config = load_config(
        data={
            "state_dir": str(tmp_path),
            "environment": {"name": environment},
            "pool": {"seed_size": 30},
            "policy": {"sft_tasks": 30},
            "rollout": {"heldout_tasks": 20, "final_heldout_tasks": 20},
        },
        environ={},
    )
    seed_pool, heldout = build_initial_pools(config)
    dev, final = build_dev_split(config), build_final_heldout(config)
    splits = {"D_0": seed_pool, "heldout": heldout, "dev": dev, "final": final}
    assert {name: len(tasks) for name, tasks in splits.items()} == {"D_0": 30, "heldout": 20, "dev": 200, "final": 20}
    for (first, a), (second, b) in itertools.combinations(splits.items(), 2):
        assert not {t.task_id for t in a} & {t.task_id for t in b}, (first, second)
        assert not {t.identity for t in a} & {t.identity for t in b}, (first, second)


@pytest.mark.parametrize("environment", ["bfcl", "workplace"])
def test_a_split_leaves_out_a_task_of_an_earlier_one_even_reworded(environment):
    """`taken` holds identities too: a walk that gives an earlier split's exercise in other words is not kept."""
    env = make_environment(EnvironmentConfig(name=environment))
    first = env.build_tasks(6, seed=5, origin="seed")
    reworded = [dataclasses.replace(t, turns=[f"In other words: {turn}" for turn in t.turns]) for t in first[:3]]
    assert not {t.task_id for t in reworded} & {t.task_id for t in first}
    again = env.build_tasks(6, seed=5, origin="seed", exclude=taken(reworded))
    assert not {t.identity for t in again} & {t.identity for t in reworded}
    assert [t.task_id for t in again[:3]] == [t.task_id for t in first[3:]]


def test_no_dev_task_asked_for_builds_and_stores_no_dev_split(tmp_path):
    config = _config(tmp_path)
    with open_warehouse(config) as wh:
        assert dev_eval_tasks(config, wh) == []
        assert wh.pool(config.run_id, DEV_ROUND) == []


def test_one_dev_task_asked_for_is_the_first_of_the_dev_split(tmp_path):
    config = _config(tmp_path, dev_eval_tasks=1)
    with open_warehouse(config) as wh:
        [first] = dev_eval_tasks(config, wh)
    assert first.task_id == build_dev_split(config)[0].task_id


def test_a_run_without_a_stored_held_out_split_gets_the_one_round_zero_builds_and_stores_it(tmp_path):
    config = _config(tmp_path)
    with open_warehouse(config) as wh:
        heldout = heldout_split(config, wh)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        stored = wh.pool(config.run_id, HELDOUT_ROUND)
    built = [t.task_id for t in build_initial_pools(config)[1]]
    assert len(built) == 5 and [t.task_id for t in heldout] == [t.task_id for t in stored] == built


def test_a_stored_held_out_split_is_read_as_stored_not_rebuilt_nor_mixed_with_other_pools(tmp_path):
    """The run's held-out pool holds two tasks; another run's held-out pool and this run's dev pool hold the rest."""
    config = _config(tmp_path)
    heldout = build_initial_pools(config)[1]
    first_two, rest = [t.task_id for t in heldout[:2]], [t.task_id for t in heldout[2:]]
    with open_warehouse(config) as wh:
        wh.write_tasks(heldout)
        wh.set_pool(config.run_id, HELDOUT_ROUND, first_two)
        wh.set_pool("another-run", HELDOUT_ROUND, rest)
        wh.set_pool(config.run_id, DEV_ROUND, rest)
        assert [t.task_id for t in heldout_split(config, wh)] == first_two
