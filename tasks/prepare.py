"""Preparation stage: what a round needs before rollout.

Round 0 builds the run's starting point: the seed pool D_0 from unguided exploration, a
held-out split of synthetic tasks the policy never trains on, and checkpoint 0 (for the
embedded default, a tiny model fine-tuned on demonstrations of the seed pool only). Later
rounds pick up the checkpoint the previous round's update wrote, after checking it against the
digest the previous round's version stage recorded, and check the pool they start from (the
warehouse's pool r and its snapshot file) against the recorded pool digest: a corrupt or missing
file stops the round with its path instead of training on it.
"""

from __future__ import annotations

from pathlib import Path

from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.records import Message, Task, digest

BUILTIN_TINY = "builtin:tiny"


def build_initial_pools(config: PipelineConfig) -> tuple[list[Task], list[Task]]:
    """The seed pool and the held-out split, disjoint, both reproducible from ``config.start_seed``."""
    from envs.explorer import build_tasks

    seed_pool = build_tasks(config.pool.seed_size, config.start_seed, origin="seed")
    heldout = build_tasks(
        config.rollout.heldout_tasks, config.start_seed + 7919, origin="heldout", exclude={t.task_id for t in seed_pool}
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
    return build_tasks(size, config.start_seed + 31337, origin="dev", exclude=exclude)


def initial_checkpoint(config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]) -> str:
    """Checkpoint 0: the builtin tiny policy (built once per seed pool and settings) or the configured model.

    The tiny policy is fine-tuned on demonstrations of the seed pool plus more tasks from the same
    unguided explorer (``policy.sft_tasks`` in all); held-out tasks are excluded by id.
    """
    if config.policy.model != BUILTIN_TINY:
        return config.policy.model
    from agent.tiny import build_tiny_policy

    task_ids, conversations = sft_demonstrations(config, seed_pool, heldout)
    key = digest(
        {
            "tasks": task_ids,
            "policy": config.policy.model_dump(),
            "environment": config.environment.model_dump(),
            "seed": config.start_seed,
        }
    )
    out_dir = config.state_dir / "models" / f"tiny-{key[:12]}"
    return str(build_tiny_policy(out_dir, conversations, config.policy, config.start_seed))


# Every run of an ablation starts from the same checkpoint 0 and must rebuild its demonstrations to
# find it (about 10 s for 4,000), so they are kept for the life of the process.
_DEMONSTRATIONS: dict[str, tuple[list[str], list[list[Message]]]] = {}


def sft_demonstrations(config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]) -> tuple[list[str], list[list[Message]]]:
    """Sorted task ids and expert conversations of the SFT set: the seed pool plus unguided tasks, no held-out one."""
    from envs.explorer import build_tasks, demonstration
    from tasks.common import make_environment

    memo_key = digest(
        {
            "seed_pool": [t.task_id for t in seed_pool],
            "heldout": sorted(t.task_id for t in heldout),
            "n": config.policy.sft_tasks,
            "seed": config.start_seed,
            "environment": config.environment.model_dump(),
        }
    )
    if memo_key not in _DEMONSTRATIONS:
        extra = build_tasks(
            max(0, config.policy.sft_tasks - len(seed_pool)),
            config.start_seed + 104729,
            origin="seed",
            exclude={t.task_id for t in seed_pool + heldout},
        )
        env = make_environment(config.environment)
        _DEMONSTRATIONS[memo_key] = (
            sorted(t.task_id for t in seed_pool + extra),
            [demonstration(task, env) for task in seed_pool + extra],
        )
    return _DEMONSTRATIONS[memo_key]


def checkpoint_is_usable(path: str) -> bool:
    """A local checkpoint needs its config and weights; a hub id cannot be checked offline."""
    local = Path(path)
    if not local.exists():
        return not path.startswith(("/", ".")) and "/" in path  # looks like a hub id
    return (local / "config.json").is_file() and any(local.glob("*.safetensors"))


def verify_round_inputs(config: PipelineConfig, round_: int) -> str:
    """For round r > 0: the checkpoint and pool that round r-1 recorded, checked against their digests.

    Returns the checkpoint path. Raises DataError naming the file when round r-1 did not finish,
    when the checkpoint is missing or its digest changed, or when pool r (the snapshot file or the
    warehouse's membership) no longer matches the recorded pool digest.
    """
    from storage.pool import pool_digest, read_pool_snapshot
    from tasks.common import checkpoint_digest, open_warehouse

    previous = round_ - 1
    with open_warehouse(config) as wh:
        updated = wh.stage_output(config.run_id, previous, "update")
        versioned = wh.stage_output(config.run_id, previous, "version")
        pool = wh.pool(config.run_id, round_)
    if updated is None or versioned is None:
        raise DataError(f"Round {previous} of run {config.run_id!r} has not finished; run it before round {round_}.")
    checkpoint = str(updated["checkpoint"])
    if not checkpoint_is_usable(checkpoint):
        raise DataError(f"Checkpoint {checkpoint} of round {round_} is missing or incomplete (no config.json or weights).")
    expected = versioned.get("checkpoint_digest")
    if expected and Path(checkpoint).is_dir():
        actual = checkpoint_digest(checkpoint)
        if actual != expected:
            raise DataError(
                f"Checkpoint {checkpoint} of round {round_} has digest {actual[:16]}, but round {previous} recorded "
                f"{expected[:16]}: the files changed after they were versioned. Restore them from MLflow "
                f"(model {config.tracking.registered_model!r} version {versioned.get('model_version')})."
            )
    expected_pool = versioned.get("pool_digest")
    if expected_pool:
        read_pool_snapshot(config.pool_path(round_), expected_digest=expected_pool)
        actual_pool = pool_digest(pool)
        if actual_pool != expected_pool:
            raise DataError(
                f"Pool {round_} of run {config.run_id!r} in the warehouse {config.warehouse_path} has digest "
                f"{actual_pool[:16]}, but its snapshot {config.pool_path(round_)} was recorded as {expected_pool[:16]}: "
                "the warehouse's pool membership or tasks changed after the round was versioned."
            )
    return checkpoint


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from coevolve.errors import is_retryable  # noqa: E402
from tasks.common import HELDOUT_ROUND, open_warehouse, resumable  # noqa: E402


@task(name="prepare", retries=1, retry_condition_fn=is_retryable, cache_policy=NO_CACHE)
def prepare_task(config: PipelineConfig, round_: int) -> dict:
    """Round 0: seed pool, held-out split, checkpoint 0. Later rounds: the previous round's checkpoint."""
    logger = get_run_logger()
    if round_ > 0:
        return {"checkpoint": verify_round_inputs(config, round_)}

    def compute() -> dict:
        from tasks.evaluate import evaluate_checkpoint

        seed_pool, heldout = build_initial_pools(config)
        with open_warehouse(config) as wh:
            wh.ensure_run(config.run_id, config.model_dump(mode="json"))
            wh.write_tasks(seed_pool + heldout)
            wh.set_pool(config.run_id, 0, [t.task_id for t in seed_pool])
            wh.set_pool(config.run_id, HELDOUT_ROUND, [t.task_id for t in heldout])
        logger.info("seed pool %d tasks, held-out split %d tasks", len(seed_pool), len(heldout))
        checkpoint = initial_checkpoint(config, seed_pool, heldout)
        baseline = evaluate_checkpoint(config, checkpoint, heldout, round_=HELDOUT_ROUND)
        logger.info("checkpoint 0 at %s: held-out success %.3f", checkpoint, baseline)
        return {"checkpoint": checkpoint, "pool_size": len(seed_pool), "heldout": len(heldout), "baseline_heldout_success": baseline}

    return resumable(config, round_, "prepare", compute)


def first_unfinished_round(finished: list[int]) -> int:
    """Rounds run in order, so the next one is right after the last finished round."""
    return max(finished) + 1 if finished else 0


@task(name="next-round", cache_policy=NO_CACHE)
def next_round_task(config: PipelineConfig) -> int:
    """The round an evolution should run next: 0 for a new run."""
    with open_warehouse(config) as wh:
        finished = [s.round for s in wh.rounds(config.run_id)]
    return first_unfinished_round(finished)
