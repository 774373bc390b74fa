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
    dev_split,
    heldout_split,
    sealed_splits,
    sft_demonstrations,
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


# --- each split is its own explorer walk, named by its origin, and leaves out the splits built before it ---------


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One run with a final held-out split, and the splits built before its dev split, built once for the tests below.

    Its seed is not 0: random.Random(-n) draws what random.Random(n) does, so at seed 0 an offset subtracted
    would walk the same tasks as the offset added.
    """
    config = load_config(
        data={
            "state_dir": str(tmp_path_factory.mktemp("small_run")),
            "pool": {"seed": 3, "seed_size": 10},
            "policy": {"sft_tasks": 30},
            "rollout": {"heldout_tasks": 5, "final_heldout_tasks": 5},
        },
        environ={},
    )
    seed_pool, heldout = build_initial_pools(config)
    sft_ids, _ = sft_demonstrations(config, seed_pool, heldout)
    return config, seed_pool, heldout, sft_ids


def _walk(config, size, offset, origin, exclude):
    """What the environment's unguided explorer builds from ``start_seed + offset``, leaving out ``exclude``."""
    env = make_environment(config.environment)
    return env.build_tasks(
        size, config.start_seed + offset, origin=origin, exclude=exclude, calls_per_turn=config.pool.calls_per_turn
    )


def _ids_and_origins(tasks):
    return [(t.task_id, t.provenance.origin) for t in tasks]


def test_the_seed_pool_is_walked_from_the_run_seed_as_seed_tasks(small_run):
    config = small_run[0]
    seed_pool, _ = build_initial_pools(config)
    assert _ids_and_origins(seed_pool) == _ids_and_origins(_walk(config, 10, 0, "seed", frozenset()))
    assert {t.provenance.origin for t in seed_pool} == {"seed"}


def test_the_held_out_split_is_walked_from_seed_plus_7919_as_heldout_tasks(small_run):
    config = small_run[0]
    seed_pool, heldout = build_initial_pools(config)
    assert _ids_and_origins(heldout) == _ids_and_origins(_walk(config, 5, 7919, "heldout", taken(seed_pool)))
    assert {t.provenance.origin for t in heldout} == {"heldout"}


def test_the_dev_split_is_walked_from_seed_plus_31337_as_dev_tasks_in_turns_of_the_pools_calls(small_run):
    config, seed_pool, heldout, sft_ids = small_run
    dev = build_dev_split(config)
    expected = _walk(config, 200, 31337, "dev", taken(seed_pool, heldout) | set(sft_ids))
    assert len(dev) == 200 and _ids_and_origins(dev) == _ids_and_origins(expected)
    assert {t.provenance.origin for t in dev} == {"dev"}
    assert max(len(turn) for t in dev for turn in t.reference) == config.pool.calls_per_turn == 2


def test_the_final_held_out_split_is_the_explorers_walk_from_seed_plus_65537_of_heldout_tasks(small_run):
    config, seed_pool, heldout, sft_ids = small_run
    dev, final = build_dev_split(config), build_final_heldout(config)
    expected = _walk(config, 5, 65537, "heldout", taken(seed_pool, heldout, dev) | set(sft_ids))
    assert len(final) == 5 and _ids_and_origins(final) == _ids_and_origins(expected)
    assert {t.provenance.origin for t in final} == {"heldout"}
    assert max(len(turn) for t in final for turn in t.reference) == config.pool.calls_per_turn == 2


def test_no_final_held_out_split_is_built_or_stored_when_its_size_is_zero(tmp_path):
    config = _config(tmp_path, final_heldout_tasks=0)
    assert build_final_heldout(config) == []
    with open_warehouse(config) as wh:
        assert store_final_heldout(config, wh) == []
        assert wh.pool(config.run_id, FINAL_HELDOUT_ROUND) == []


def test_a_final_held_out_split_of_one_task_holds_the_first_task_of_its_walk(small_run):
    config, seed_pool, heldout, sft_ids = small_run
    one = config.model_copy(update={"rollout": config.rollout.model_copy(update={"final_heldout_tasks": 1})})
    [task] = build_final_heldout(one)
    expected = _walk(config, 1, 65537, "heldout", taken(seed_pool, heldout, build_dev_split(config)) | set(sft_ids))
    assert _ids_and_origins([task]) == _ids_and_origins(expected)


# Python's random.Random(seed) draws the same stream for -seed as for seed, so a run seed s with
# |s + a| == |s + b| makes the split walked from offset a repeat the one walked from offset b: there the walk
# meets the earlier split's tasks and only the exclusion keeps them out. The offsets: held-out 7919, dev 31337,
# final held-out 65537, demonstrations 104729 (the seed pool's 0 aliases none of dev's or final's).


def _aliased_config(tmp_path, seed, **policy):
    """A small run on ``seed``; with ``policy`` its demonstrations are walked like the splits (3-5 calls, one turn)."""
    return load_config(
        data={
            "state_dir": str(tmp_path),
            "pool": {"seed": seed, "seed_size": 10, **({"calls_per_turn": None} if policy else {})},
            "policy": {"sft_tasks": 30, **policy},
            "rollout": {"heldout_tasks": 10, "final_heldout_tasks": 10},
        },
        environ={},
    )


_DEMONSTRATIONS_LIKE_SPLITS = {"sft_min_calls": 3, "sft_max_calls": 5, "sft_joint_calls": 1.0}


def test_a_dev_split_whose_walk_repeats_the_held_out_split_leaves_out_its_tasks(tmp_path):
    config = _aliased_config(tmp_path, seed=-(31337 + 7919) // 2)
    seed_pool, heldout = build_initial_pools(config)
    assert taken(heldout) <= taken(_walk(config, 10, 31337, "dev", frozenset()))  # the walk repeats it
    dev = build_dev_split(config, size=10)
    assert len(dev) == 10 and not taken(dev) & taken(seed_pool, heldout)


def test_a_dev_split_whose_walk_repeats_the_demonstrations_leaves_them_out(tmp_path):
    config = _aliased_config(tmp_path, -(104729 + 31337) // 2, **_DEMONSTRATIONS_LIKE_SPLITS)
    sft_ids, _ = sft_demonstrations(config, *build_initial_pools(config))
    walked = {t.task_id for t in _walk(config, 10, 31337, "dev", frozenset())}
    assert len(walked & set(sft_ids)) == 10  # the walk repeats them
    dev = build_dev_split(config, size=10)
    assert len(dev) == 10 and not {t.task_id for t in dev} & set(sft_ids)


def test_a_final_held_out_split_whose_walk_repeats_the_held_out_split_leaves_out_its_tasks(tmp_path):
    config = _aliased_config(tmp_path, -(65537 + 7919) // 2)
    seed_pool, heldout = build_initial_pools(config)
    assert taken(heldout) <= taken(_walk(config, 10, 65537, "heldout", frozenset()))
    final = build_final_heldout(config)
    assert len(final) == 10 and not taken(final) & taken(seed_pool, heldout, build_dev_split(config))


def test_a_final_held_out_split_whose_walk_repeats_the_dev_split_leaves_out_its_tasks(tmp_path):
    config = _aliased_config(tmp_path, -(65537 + 31337) // 2)
    dev = build_dev_split(config)
    assert taken(dev[:10]) <= taken(_walk(config, 10, 65537, "heldout", frozenset()))
    final = build_final_heldout(config)
    assert len(final) == 10 and not taken(final) & taken(*build_initial_pools(config), dev)


def test_a_final_held_out_split_whose_walk_repeats_the_demonstrations_leaves_them_out(tmp_path):
    config = _aliased_config(tmp_path, -(104729 + 65537) // 2, **_DEMONSTRATIONS_LIKE_SPLITS)
    sft_ids, _ = sft_demonstrations(config, *build_initial_pools(config))
    walked = {t.task_id for t in _walk(config, 10, 65537, "heldout", frozenset())}
    assert len(walked & set(sft_ids)) == 10
    final = build_final_heldout(config)
    assert len(final) == 10 and not {t.task_id for t in final} & set(sft_ids)


# --- two runs in one warehouse: each reads its own stored splits ---------------------------------------------


def test_each_run_of_a_warehouse_reads_its_own_stored_dev_split(tmp_path):
    """The stored pools are a few tasks each, not the 200 a rebuilt dev split holds."""
    first, second = (_config(tmp_path).model_copy(update={"run_id": run}) for run in ("first", "second"))
    dev = build_dev_split(first)
    with open_warehouse(first) as wh:
        wh.write_tasks(dev)
        wh.set_pool("first", DEV_ROUND, [t.task_id for t in dev[:2]])
        wh.set_pool("second", DEV_ROUND, [t.task_id for t in dev[2:5]])
        assert [t.task_id for t in dev_split(first, wh)] == [t.task_id for t in dev[:2]]
        assert [t.task_id for t in dev_split(second, wh)] == [t.task_id for t in dev[2:5]]


def test_each_run_of_a_warehouse_seals_its_own_stored_held_out_and_final_held_out_splits(tmp_path):
    first, second = (_config(tmp_path).model_copy(update={"run_id": run}) for run in ("first", "second"))
    dev = build_dev_split(first)
    ids = [t.task_id for t in dev]
    pools = {
        ("first", HELDOUT_ROUND): ids[:2],
        ("first", FINAL_HELDOUT_ROUND): ids[2:4],
        ("first", DEV_ROUND): ids[4:6],
        ("second", HELDOUT_ROUND): ids[6:9],
        ("second", FINAL_HELDOUT_ROUND): ids[9:12],
        ("second", DEV_ROUND): ids[12:15],
    }
    with open_warehouse(first) as wh:
        wh.write_tasks(dev)
        for (run, round_), members in pools.items():
            wh.set_pool(run, round_, members)
        for config, run in ((first, "first"), (second, "second")):
            heldout, sealed_dev = sealed_splits(config, wh)
            assert [t.task_id for t in heldout] == pools[run, HELDOUT_ROUND] + pools[run, FINAL_HELDOUT_ROUND]
            assert [t.task_id for t in sealed_dev] == pools[run, DEV_ROUND]


# --- checkpoint 0's demonstrations --------------------------------------------------------------------------


def test_the_demonstrations_are_the_explorers_walk_from_seed_plus_104729_of_short_tasks(tmp_path):
    """With every demonstration asking for its calls in one request, none is re-cut into turns of one call (seed 3,
    as seed 0 would walk the same tasks from the offset subtracted)."""
    config = load_config(
        data={
            "state_dir": str(tmp_path),
            "pool": {"seed": 3, "seed_size": 10},
            "policy": {"sft_tasks": 30, "sft_joint_calls": 1.0},
            "rollout": {"heldout_tasks": 5},
        },
        environ={},
    )
    seed_pool, heldout = build_initial_pools(config)
    sft_ids, conversations = sft_demonstrations(config, seed_pool, heldout)
    walked = make_environment(config.environment).build_tasks(
        30, config.start_seed + 104729, origin="sft", exclude=taken(seed_pool, heldout), min_steps=1, max_steps=2
    )
    assert (config.policy.sft_min_calls, config.policy.sft_max_calls) == (1, 2)
    assert sft_ids == sorted(t.task_id for t in walked) and len(conversations) == 30


def test_each_configuration_in_one_process_gets_its_own_demonstrations(tmp_path):
    sizes = {}
    for sft_tasks in (30, 12):
        config = load_config(
            data={"state_dir": str(tmp_path), "pool": {"seed_size": 10}, "policy": {"sft_tasks": sft_tasks}},
            environ={},
        )
        sft_ids, conversations = sft_demonstrations(config, *build_initial_pools(config))
        sizes[sft_tasks] = (len(sft_ids), len(conversations))
    assert sizes == {30: (30, 30), 12: (12, 12)}


def test_a_share_of_target_jobs_replaces_as_many_short_demonstrations(tmp_path):
    """Workplace's sft_target_share 0.5 of 30: 15 short tasks, and 15 jobs walked from seed + 130363 like the splits."""
    config = load_config(
        data={
            "state_dir": str(tmp_path),
            "environment": {"name": "workplace", "sft_target_share": 0.5},
            "pool": {"seed": 3, "seed_size": 10},
            "policy": {"sft_tasks": 30},
            "rollout": {"heldout_tasks": 5},
        },
        environ={},
    )
    seed_pool, heldout = build_initial_pools(config)
    sft_ids, conversations = sft_demonstrations(config, seed_pool, heldout)
    jobs = _walk(config, 15, 130363, "sft", taken(seed_pool, heldout))
    assert len(sft_ids) == len(set(sft_ids)) == len(conversations) == 30
    assert {t.task_id for t in jobs} <= set(sft_ids)


def test_demonstrations_whose_walk_repeats_the_held_out_split_leave_out_its_tasks(tmp_path):
    config = _aliased_config(tmp_path, -(104729 + 7919) // 2, **_DEMONSTRATIONS_LIKE_SPLITS)
    seed_pool, heldout = build_initial_pools(config)
    walked = make_environment(config.environment).build_tasks(10, config.start_seed + 104729, origin="sft")
    assert taken(heldout) <= taken(walked)  # the walk repeats it
    sft_ids, _ = sft_demonstrations(config, seed_pool, heldout)
    assert len(sft_ids) == 30 and not set(sft_ids) & taken(seed_pool, heldout)
