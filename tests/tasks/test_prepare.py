"""The starting point of a run: seed pool, held-out split, the SFT set of checkpoint 0, and the dev split."""

from pathlib import Path

import pytest

from coevolve.config import load_config
from envs.calls import parse_tool_calls
from storage.pool import pool_digest
from tasks.common import open_warehouse
from tasks.prepare import copied_baseline
from tasks.splits import HELDOUT_ROUND, build_dev_split, build_final_heldout, build_initial_pools, sft_demonstrations


def _config(tmp_path):
    return load_config(
        overrides=[f"state_dir={tmp_path}", "pool.seed_size=10", "rollout.heldout_tasks=5", "policy.sft_tasks=30"],
        environ={},
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
    first = [t.task_id for t in build_dev_split(config, size=10)]
    assert len(first) == 10 and [t.task_id for t in build_dev_split(config, size=10)] == first
    # The seed decides it: another seed draws another split.
    reseeded = config.model_copy(update={"pool": config.pool.model_copy(update={"seed": config.start_seed + 1})})
    assert not set(first) & {t.task_id for t in build_dev_split(reseeded, size=10)}


def test_the_sft_set_holds_no_task_of_the_seed_pool_or_the_heldout_split(tmp_path):
    config = _config(tmp_path)
    seed_pool, heldout = build_initial_pools(config)
    sft_ids, _ = sft_demonstrations(config, seed_pool, heldout)
    assert not set(sft_ids) & {t.task_id for t in seed_pool + heldout}


def test_checkpoint_zero_learns_from_short_tasks_and_the_target_spreads_a_longer_job_over_turns(tmp_path):
    config = _config(tmp_path)
    seed_pool, heldout = build_initial_pools(config)
    _, conversations = sft_demonstrations(config, seed_pool, heldout)
    user_turns = [sum(1 for m in conversation if m.role == "user") for conversation in conversations]
    assert set(user_turns) == {1, 2}  # every second two-call demonstration puts each call in its own turn
    for conversation in conversations:
        calls = sum(
            len(parse_tool_calls(m.content)[0]) for m in conversation if m.role == "assistant" and m.content != "done"
        )
        assert 1 <= calls <= config.policy.sft_max_calls
    for task in seed_pool + heldout + build_dev_split(config, size=10):
        calls = [len(turn) for turn in task.reference]
        assert 3 <= sum(calls) <= 5 and len(calls) >= 2 and max(calls) <= config.pool.calls_per_turn
        assert len(task.turns) == len(task.reference)


def test_single_turn_targets_when_calls_per_turn_is_none(tmp_path):
    config = _config(tmp_path).with_overrides({"pool": {"calls_per_turn": None}})
    seed_pool, _ = build_initial_pools(config)
    assert {len(t.turns) for t in seed_pool} == {1}


# The default run's held-out split, defined before any ablation arm ran (docs/evaluation.md).
# A change to the explorer, the templates or the split's seed changes this digest: the held-out
# figures of earlier releases then no longer compare, and the README must say so.
FROZEN_HELDOUT_DIGEST = "928b54d8e11999cf173004ecefc43d69930d86ddce7fb1b976c62ae2ece9b566"


def test_the_default_heldout_split_is_frozen(tmp_path):
    config = load_config(overrides=[f"state_dir={tmp_path}"], environ={})
    _, heldout = build_initial_pools(config)
    assert len(heldout) == 100 and pool_digest(heldout) == FROZEN_HELDOUT_DIGEST


# The ablation's final held-out split (configs/ablation.yaml: 500 tasks), defined before any arm ran
# (docs/experiments.md). A change to the explorer, the templates, the split's seed or what
# it excludes changes this digest: earlier ablation reports then no longer compare, and the README must say so.
FROZEN_FINAL_HELDOUT_DIGEST = "5d09ccbe3042779bc39a8b5cf2898a11129410c2ac4ceb0eab2120037b00d61f"


@pytest.mark.slow
def test_the_ablations_final_heldout_split_is_frozen_and_disjoint_from_every_other_split(tmp_path):

    config = load_config(
        Path(__file__).parents[2] / "configs" / "ablation.yaml", overrides=[f"state_dir={tmp_path}"], environ={}
    )
    final = build_final_heldout(config)
    assert len(final) == config.rollout.final_heldout_tasks == 500 and pool_digest(final) == FROZEN_FINAL_HELDOUT_DIGEST
    seed_pool, heldout = build_initial_pools(config)
    others = {t.task_id for t in seed_pool + heldout + build_dev_split(config)} | set(
        sft_demonstrations(config, seed_pool, heldout)[0]
    )
    assert not {t.task_id for t in final} & others
    for task in final:
        calls = [len(turn) for turn in task.reference]
        assert 3 <= sum(calls) <= 5 and max(calls) <= config.pool.calls_per_turn


def test_without_a_size_there_is_no_final_heldout_split(tmp_path):
    assert build_final_heldout(_config(tmp_path)) == []


def test_checkpoint_0s_scores_are_copied_only_from_a_run_with_the_same_checkpoint_and_tasks(tmp_path):
    config = _config(tmp_path).with_overrides({"rollout": {"checkpoint0_scores_from": "first"}})
    _, heldout = build_initial_pools(config)
    rows = [(t.task_id, i % 2 == 0, float(i % 2 == 0), f"traj-{i}") for i, t in enumerate(heldout)]
    with open_warehouse(config) as wh:
        wh.mark_stage("first", 0, "prepare", {"checkpoint_digest": "abc"})
        wh.write_evaluations("first", HELDOUT_ROUND, "heldout", rows)
        assert copied_baseline(wh, config, "other digest", {"heldout": heldout}) is None
        assert copied_baseline(wh, config, "abc", {"heldout": heldout[:-1]}) is None  # other tasks
        assert wh.evaluation_outcomes(config.run_id, HELDOUT_ROUND, "heldout") == {}
        rates = copied_baseline(wh, config, "abc", {"heldout": heldout, "dev": []})
        copied = wh.evaluation_rows(config.run_id, HELDOUT_ROUND, "heldout")
    assert rates == {"heldout": 3 / 5, "dev": 0.0}
    assert sorted(copied) == sorted(rows)
