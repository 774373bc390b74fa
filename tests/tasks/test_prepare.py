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
