"""Where the run's splits are stored (pools under negative rounds) and who reads them: evaluation and validation."""

from coevolve.config import load_config
from storage.warehouse import Warehouse
from tasks.common import open_warehouse
from tasks.splits import (
    DEV_ROUND,
    EXTERNAL_ROUND,
    FINAL_HELDOUT_ROUND,
    HELDOUT_ROUND,
    build_dev_split,
    build_initial_pools,
    dev_eval_tasks,
    sealed_splits,
    store_dev_split,
    store_final_heldout,
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
