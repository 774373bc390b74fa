"""The starting point of a run: seed pool, held-out split, the SFT set of checkpoint 0, and the dev split."""

from coevolve.config import load_config
from tasks.prepare import build_dev_split, build_initial_pools, sft_demonstrations


def _config(tmp_path):
    return load_config(
        overrides=[f"state_dir={tmp_path}", "pool.seed_size=10", "rollout.heldout_tasks=5", "policy.sft_tasks=30"], environ={}
    )


def test_the_dev_split_shares_no_task_with_the_seed_pool_heldout_split_or_sft_set(tmp_path):
    config = _config(tmp_path)
    seed_pool, heldout = build_initial_pools(config)
    sft_ids, conversations = sft_demonstrations(config, seed_pool, heldout)
    dev = build_dev_split(config, size=40)
    assert len(dev) == 40 and len(sft_ids) == len(conversations) == 30
    assert not {t.task_id for t in dev} & (set(sft_ids) | {t.task_id for t in seed_pool + heldout})
    assert {t.provenance.origin for t in dev} == {"dev"}


def test_the_dev_split_is_reproducible_from_the_seed(tmp_path):
    config = _config(tmp_path)
    assert [t.task_id for t in build_dev_split(config, size=10)] == [t.task_id for t in build_dev_split(config, size=10)]


def test_the_sft_set_never_holds_a_heldout_task(tmp_path):
    config = _config(tmp_path)
    seed_pool, heldout = build_initial_pools(config)
    sft_ids, _ = sft_demonstrations(config, seed_pool, heldout)
    assert {t.task_id for t in seed_pool} <= set(sft_ids)
    assert not set(sft_ids) & {t.task_id for t in heldout}


def test_round_zero_stores_the_dev_split_under_its_own_pool_round(tmp_path):
    from storage.warehouse import Warehouse
    from tasks.common import DEV_ROUND, HELDOUT_ROUND
    from tasks.prepare import store_dev_split

    config = _config(tmp_path)
    stored = store_dev_split(config)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        dev = wh.pool(config.run_id, DEV_ROUND)
    assert DEV_ROUND < 0 and DEV_ROUND != HELDOUT_ROUND
    assert [t.task_id for t in dev] == [t.task_id for t in stored] == [t.task_id for t in build_dev_split(config)]


def test_validation_seals_the_stored_held_out_and_dev_splits(tmp_path):
    from tasks.common import HELDOUT_ROUND, open_warehouse
    from tasks.prepare import store_dev_split
    from tasks.validate import sealed_splits

    config = _config(tmp_path)
    _, heldout = build_initial_pools(config)
    with open_warehouse(config) as wh:
        wh.write_tasks(heldout)
        wh.set_pool(config.run_id, HELDOUT_ROUND, [t.task_id for t in heldout])
    dev = store_dev_split(config)
    assert sealed_splits(config) == (heldout, dev)


def test_a_run_prepared_without_a_stored_dev_split_gets_it_sealed(tmp_path):
    from storage.warehouse import Warehouse
    from tasks.common import DEV_ROUND
    from tasks.validate import sealed_splits

    config = _config(tmp_path)
    _, dev = sealed_splits(config)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        stored = wh.pool(config.run_id, DEV_ROUND)
    assert [t.task_id for t in dev] == [t.task_id for t in stored] == [t.task_id for t in build_dev_split(config)]
