"""The run's task splits, rebuilt from the seed: the seed pool D_0, the held-out split, the dev split, the final held-out split, and checkpoint 0's demonstrations.

Every split comes from the unguided explorer (envs/explorer.py) with its own seed offset, and the
splits are disjoint by task id. D_0, dev and held-out are the target distribution: 3-5 calls spread
over user turns of at most ``pool.calls_per_turn`` calls. Checkpoint 0's demonstrations are another
distribution: single-turn tasks of ``policy.sft_min_calls`` to ``policy.sft_max_calls`` calls. The
prepare stage stores the splits; the evaluate stage rebuilds a split it needs from the same configuration.
"""

from __future__ import annotations

import random

from coevolve.config import PipelineConfig
from coevolve.records import Message, Task, digest
from tasks.common import make_environment

# envs.explorer is imported where used: it loads bfcl-eval's API classes.

BUILTIN_TINY = "builtin:tiny"


def build_initial_pools(config: PipelineConfig) -> tuple[list[Task], list[Task]]:
    """The seed pool and the held-out split, disjoint, both reproducible from ``config.start_seed``."""
    from envs.explorer import build_tasks

    per_turn = config.pool.calls_per_turn
    seed_pool = build_tasks(config.pool.seed_size, config.start_seed, origin="seed", calls_per_turn=per_turn)
    heldout = build_tasks(
        config.rollout.heldout_tasks,
        config.start_seed + 7919,
        origin="heldout",
        exclude={t.task_id for t in seed_pool},
        calls_per_turn=per_turn,
    )
    return seed_pool, heldout


def build_dev_split(config: PipelineConfig, size: int = 200) -> list[Task]:
    """Tasks for choosing settings without looking at the held-out split.

    The same unguided explorer with another seed, disjoint from the seed pool, the held-out split and
    (for the builtin policy) checkpoint 0's fine-tuning set, so a setting picked on it says nothing
    about the held-out scores the ablation reports.
    """
    from envs.explorer import build_tasks

    seed_pool, heldout = build_initial_pools(config)
    exclude = {t.task_id for t in seed_pool + heldout}
    if config.policy.model == BUILTIN_TINY:
        exclude |= set(sft_demonstrations(config, seed_pool, heldout)[0])
    return build_tasks(size, config.start_seed + 31337, origin="dev", exclude=exclude, calls_per_turn=config.pool.calls_per_turn)


def build_final_heldout(config: PipelineConfig) -> list[Task]:
    """The final held-out split: ``rollout.final_heldout_tasks`` tasks of the target distribution, for the ablation's tests.

    Its own explorer seed (``pool.seed + 65537``) and disjoint from D_0, the per-round held-out split,
    the dev split and (for the builtin policy) checkpoint 0's demonstrations, which are built first and
    not changed by it. Empty when the size is 0.
    """
    from envs.explorer import build_tasks

    size = config.rollout.final_heldout_tasks
    if size <= 0:
        return []
    seed_pool, heldout = build_initial_pools(config)
    exclude = {t.task_id for t in seed_pool + heldout + build_dev_split(config)}
    if config.policy.model == BUILTIN_TINY:
        exclude |= set(sft_demonstrations(config, seed_pool, heldout)[0])
    return build_tasks(size, config.start_seed + 65537, origin="heldout", exclude=exclude, calls_per_turn=config.pool.calls_per_turn)


# Every run of an ablation starts from the same checkpoint 0 and must rebuild its demonstrations to
# find it (about 10 s for 4,000), so they are kept for the life of the process.
_DEMONSTRATIONS: dict[str, tuple[list[str], list[list[Message]]]] = {}


def sft_demonstrations(config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]) -> tuple[list[str], list[list[Message]]]:
    """Sorted task ids and expert conversations of the SFT set: short single-turn unguided tasks, none of D_0 or held-out."""
    from envs.explorer import build_tasks, demonstration, in_turns

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
        tasks = build_tasks(
            config.policy.sft_tasks,
            config.start_seed + 104729,
            origin="sft",
            exclude={t.task_id for t in seed_pool + heldout},
            min_steps=config.policy.sft_min_calls,
            max_steps=config.policy.sft_max_calls,
        )
        # Most demonstrations ask for each call in a turn of its own, so checkpoint 0 has seen a conversation
        # go on after a turn ends, but rarely two calls in one request, which most target turns ask for.
        rng = random.Random(config.start_seed + 104729)
        tasks = [task if rng.random() < config.policy.sft_joint_calls else in_turns(task, 1) for task in tasks]
        env = make_environment(config.environment)
        _DEMONSTRATIONS[memo_key] = (sorted(t.task_id for t in tasks), [demonstration(task, env) for task in tasks])
    return _DEMONSTRATIONS[memo_key]
