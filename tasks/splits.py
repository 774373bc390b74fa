"""The run's task splits, rebuilt from the seed.

They are the seed pool D_0, the held-out split, the dev split, the final held-out split, and checkpoint 0's
demonstrations.

Every split comes from the environment's unguided exploration (`Environment.build_tasks`, envs/exploration.py)
with its own seed offset, and the splits share no task: each is built excluding the ids and the identities
(`Task.identity`: the same exercise, however worded) of the splits built before it (`taken`). D_0, dev and
held-out are the target distribution: 3-5 calls spread over user turns of at most ``pool.calls_per_turn``
calls. Checkpoint 0's demonstrations are another distribution: single-turn tasks of ``policy.sft_min_calls``
to ``policy.sft_max_calls`` calls, played in the environment (`Environment.demonstration`), and where the
environment's settings ask for them (`EnvironmentSettings.target_demonstrations`: the workplace's, whose requests
chain over turns), a share of jobs of the target's shape, none of D_0 or the held-out split. The prepare
stage stores the splits; the evaluate stage rebuilds a split it needs from the same configuration.

This module owns the splits: how each is built, where it is stored (a pool under a negative round,
which no training round ever draws) and the names its evaluation rows carry.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from coevolve.config import PipelineConfig
from coevolve.records import Message, Task, digest
from envs.registry import make_environment

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

BUILTIN_TINY = "builtin:tiny"

# Pool rounds of the splits, and evaluation rounds of what no training round produced: all negative.
# The held-out split; checkpoint 0's evaluation rows (round 0's prepare) are stored under it too.
HELDOUT_ROUND = -1
# Evaluation rows of a checkpoint that no round of the run produced (a hub model, a checkpoint
# from elsewhere): they share this round, so the newest such evaluation replaces the previous one.
EXTERNAL_ROUND = -2
# The dev split, for choosing settings without looking at the held-out split.
DEV_ROUND = -3
# The final held-out split: refused by validation; the ablation scores checkpoint 0 and final checkpoints on it.
FINAL_HELDOUT_ROUND = -4

# The split names evaluation rows carry (an official BFCL category's rows carry the category's name).
HELDOUT_SPLIT = "heldout"
DEV_SPLIT = "dev"


def taken(*splits: list[Task]) -> set[str]:
    """What a split built after ``splits`` must not repeat: their tasks' ids and identities."""
    return {key for split in splits for task in split for key in (task.task_id, task.identity)}


def build_initial_pools(config: PipelineConfig) -> tuple[list[Task], list[Task]]:
    """The seed pool and the held-out split, disjoint, both reproducible from ``config.start_seed``."""
    per_turn = config.pool.calls_per_turn
    env = make_environment(config.environment)
    seed_pool = env.build_tasks(config.pool.seed_size, config.start_seed, origin="seed", calls_per_turn=per_turn)
    heldout = env.build_tasks(
        config.rollout.heldout_tasks,
        config.start_seed + 7919,
        origin="heldout",
        exclude=taken(seed_pool),
        calls_per_turn=per_turn,
    )
    return seed_pool, heldout


def build_dev_split(config: PipelineConfig, size: int = 200) -> list[Task]:
    """Tasks for choosing settings without looking at the held-out split.

    The same unguided explorer with another seed, disjoint from the seed pool, the held-out split and
    (for the builtin policy) checkpoint 0's fine-tuning set, so a setting picked on it says nothing
    about the held-out scores the ablation reports.
    """
    seed_pool, heldout = build_initial_pools(config)
    exclude = taken(seed_pool, heldout)
    if config.policy.model == BUILTIN_TINY:
        exclude |= set(sft_demonstrations(config, seed_pool, heldout)[0])
    return make_environment(config.environment).build_tasks(
        size, config.start_seed + 31337, origin="dev", exclude=exclude, calls_per_turn=config.pool.calls_per_turn
    )


def build_final_heldout(config: PipelineConfig) -> list[Task]:
    """The final held-out split: ``rollout.final_heldout_tasks`` tasks of the target distribution.

    The ablation's tests use it.

    Its own explorer seed (``pool.seed + 65537``) and disjoint from D_0, the per-round held-out split,
    the dev split and (for the builtin policy) checkpoint 0's demonstrations, which are built first and
    not changed by it. Empty when the size is 0.
    """
    size = config.rollout.final_heldout_tasks
    if size <= 0:
        return []
    seed_pool, heldout = build_initial_pools(config)
    exclude = taken(seed_pool, heldout, build_dev_split(config))
    if config.policy.model == BUILTIN_TINY:
        exclude |= set(sft_demonstrations(config, seed_pool, heldout)[0])
    return make_environment(config.environment).build_tasks(
        size, config.start_seed + 65537, origin="heldout", exclude=exclude, calls_per_turn=config.pool.calls_per_turn
    )


# Every run of an ablation starts from the same checkpoint 0 and must rebuild its demonstrations to
# find it (about 10 s for 4,000), so they are kept for the life of the process.
_DEMONSTRATIONS: dict[str, tuple[list[str], list[list[Message]]]] = {}


def sft_demonstrations(
    config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]
) -> tuple[list[str], list[list[Message]]]:
    """Sorted task ids and expert conversations of the SFT set.

    Short single-turn unguided tasks, none of D_0 or held-out, and the share of jobs of the target's shape the
    environment's settings ask for (`EnvironmentSettings.target_demonstrations`).
    """
    memo_key = digest(
        {
            "seed_pool": [t.task_id for t in seed_pool],
            "heldout": sorted(t.task_id for t in heldout),
            "n": config.policy.sft_tasks,
            "seed": config.start_seed,
            "environment": config.environment.model_dump(),
            "calls": [config.policy.sft_min_calls, config.policy.sft_max_calls, config.policy.sft_joint_calls],
        }
    )
    if memo_key not in _DEMONSTRATIONS:
        env = make_environment(config.environment)
        jobs = round(config.policy.sft_tasks * config.environment.settings().target_demonstrations())
        tasks = env.build_tasks(
            config.policy.sft_tasks - jobs,
            config.start_seed + 104729,
            origin="sft",
            exclude=taken(seed_pool, heldout),
            min_steps=config.policy.sft_min_calls,
            max_steps=config.policy.sft_max_calls,
        )
        # Most demonstrations ask for each call in a turn of its own, so checkpoint 0 has seen a conversation
        # go on after a turn ends, but rarely two calls in one request, which most target turns ask for.
        rng = random.Random(config.start_seed + 104729)
        tasks = [task if rng.random() < config.policy.sft_joint_calls else env.in_turns(task, 1) for task in tasks]
        if jobs:
            # Jobs of the target's shape where the environment asks for them, from their own explorer seed.
            tasks += env.build_tasks(
                jobs,
                config.start_seed + 130363,
                origin="sft",
                exclude=taken(seed_pool, heldout, tasks),
                calls_per_turn=config.pool.calls_per_turn,
            )
        _DEMONSTRATIONS[memo_key] = (sorted(t.task_id for t in tasks), [env.demonstration(task) for task in tasks])
    return _DEMONSTRATIONS[memo_key]


def store_dev_split(config: PipelineConfig, wh: Warehouse) -> list[Task]:
    """Build the dev split and store it under DEV_ROUND, where validation reads it to refuse its tasks."""
    dev = build_dev_split(config)
    wh.write_tasks(dev)
    wh.set_pool(config.run_id, DEV_ROUND, [t.task_id for t in dev])
    return dev


def dev_split(config: PipelineConfig, wh: Warehouse) -> list[Task]:
    """The run's dev split as stored under DEV_ROUND; a run prepared before it was stored gets it built and stored.

    The split is rebuilt from the seed, so a late store holds the same tasks round 0 would have.
    """
    return wh.pool(config.run_id, DEV_ROUND) or store_dev_split(config, wh)


def dev_eval_tasks(config: PipelineConfig, wh: Warehouse) -> list[Task]:
    """The first ``rollout.dev_eval_tasks`` tasks of the dev split, none when it is 0."""
    limit = config.rollout.dev_eval_tasks
    return dev_split(config, wh)[:limit] if limit > 0 else []


def store_final_heldout(config: PipelineConfig, wh: Warehouse) -> list[Task]:
    """Build the final held-out split and store it under FINAL_HELDOUT_ROUND.

    Empty when ``rollout.final_heldout_tasks`` is 0.

    Stored at round 0, before any round trains, so validation refuses its tasks from the first round on.
    """
    final = build_final_heldout(config)
    if final:
        wh.write_tasks(final)
        wh.set_pool(config.run_id, FINAL_HELDOUT_ROUND, [t.task_id for t in final])
    return final


def heldout_split(config: PipelineConfig, wh: Warehouse) -> list[Task]:
    """The run's held-out split as stored under HELDOUT_ROUND.

    A run without one gets the one its round 0 would build.
    """
    tasks = wh.pool(config.run_id, HELDOUT_ROUND)
    if not tasks:
        tasks = build_initial_pools(config)[1]
        wh.write_tasks(tasks)
        wh.set_pool(config.run_id, HELDOUT_ROUND, [t.task_id for t in tasks])
    return tasks


def sealed_splits(config: PipelineConfig, wh: Warehouse) -> tuple[list[Task], list[Task]]:
    """The run's held-out splits (per-round and final) and its dev split, which no candidate may repeat."""
    heldout = wh.pool(config.run_id, HELDOUT_ROUND) + wh.pool(config.run_id, FINAL_HELDOUT_ROUND)
    return heldout, dev_split(config, wh)
