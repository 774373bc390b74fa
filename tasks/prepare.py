"""Preparation stage: what a round needs before rollout.

Round 0 builds the run's starting point: the seed pool D_0 from unguided exploration, a
held-out split of synthetic tasks the policy never trains on, and checkpoint 0 (for the
embedded default, a tiny model fine-tuned on demonstrations of the seed pool only), and records
the digests of checkpoint 0 and of D_0's snapshot file. Every round, round 0 included, checks the
checkpoint and the pool it starts from (the warehouse's pool r and its snapshot file) against the
recorded digests: a corrupt, missing or unverifiable file stops the round with its path instead
of training on it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from agent.checkpoints import checkpoint_digest, checkpoint_folder
from agent.shipped_policy import check_shipped, copy_shipped, ship
from agent.tiny import build_digest, build_tiny_policy, is_built
from agent.warmup import warm_up
from coevolve.config import PipelineConfig
from coevolve.config.policy import WARMUP_SETTINGS, PolicyConfig
from coevolve.errors import ConfigError, PipelineError
from coevolve.optional import optional_module
from coevolve.records import Task, digest
from coevolve.stages import PrepareInput, PrepareOutput, VersionOutput
from envs.registry import environment_class
from tasks.common import open_warehouse
from tasks.evaluate import evaluate_splits
from tasks.registry import stage
from tasks.round_inputs import verify_round_inputs
from tasks.splits import (
    BUILTIN_TINY,
    DEV_SPLIT,
    HELDOUT_ROUND,
    HELDOUT_SPLIT,
    build_initial_pools,
    dev_eval_tasks,
    sft_demonstrations,
    store_dev_split,
    store_final_heldout,
)

# Pool snapshots are Parquet files written with polars: loaded when a pool is written or checked.
if TYPE_CHECKING:
    import storage.pool as storage_pool
    import storage.warehouse as storage_warehouse
else:
    storage_pool = optional_module("storage.pool")
    storage_warehouse = optional_module("storage.warehouse")

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

log = logging.getLogger(__name__)


def copied_baseline(
    wh: Warehouse, config: PipelineConfig, checkpoint_sha: str, splits: dict[str, list[Task]]
) -> dict[str, float] | None:
    """Checkpoint 0's rates per split copied from ``rollout.checkpoint0_scores_from``'s round-0 rows.

    None to score it here.

    Copies only when that run recorded the same checkpoint 0 (digest) and scored exactly these tasks on
    every split; the rows are written under this run's HELDOUT_ROUND as if scored here.
    """
    source = config.rollout.checkpoint0_scores_from
    if not source:
        return None
    prepared = wh.stage_output(source, 0, "prepare")
    if not prepared or prepared.get("checkpoint_digest") != checkpoint_sha:
        return None
    rows = {split: wh.evaluation_rows(source, HELDOUT_ROUND, split) for split, tasks in splits.items() if tasks}
    if any({r[0] for r in rows[split]} != {t.task_id for t in splits[split]} for split in rows):
        return None
    for split, split_rows in rows.items():
        wh.write_evaluations(config.run_id, HELDOUT_ROUND, split, split_rows)
    return {split: (sum(r[1] for r in rows[split]) / len(rows[split]) if split in rows else 0.0) for split in splits}


def tiny_policy(config: PipelineConfig) -> PolicyConfig:
    """The settings checkpoint 0 of the builtin tiny model is built with: the policy section, with what the
    environment sets for its own demonstrations (`EnvironmentSettings.tiny_policy`: the workplace's SFT steps).

    A policy value given for a field the environment replaces is refused (ConfigError, naming the environment's own
    setting): the build would ignore it. Its default passes, as every recorded configuration names it.
    """
    built = config.environment.settings().tiny_policy(config.policy)
    for field in sorted(config.policy.model_fields_set):
        given, used = getattr(config.policy, field), getattr(built, field)
        if given != used and given != PolicyConfig.model_fields[field].default:
            raise ConfigError(
                f"policy.{field}={given} is not used with environment.name={config.environment.name!r}, which builds "
                f"checkpoint 0 with its own environment.{field} ({used}); set environment.{field}={given} instead."
            )
    return built


def tiny_policy_inputs(config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]) -> tuple[str, list]:
    """The builtin tiny policy's run key (its folder name under state_dir/models) and demonstrations."""
    task_ids, conversations = sft_demonstrations(config, seed_pool, heldout)
    key = digest(
        {
            "tasks": task_ids,
            # The warm-up settings concern pretrained models only: the tiny build's key does not depend on them.
            "policy": config.policy.model_dump(exclude=set(WARMUP_SETTINGS)),
            "environment": config.environment.model_dump(),
            "seed": config.start_seed,
        }
    )
    return key, conversations


def initial_checkpoint(config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]) -> str:
    """Checkpoint 0: the builtin tiny policy (built once per seed pool and settings) or the configured model.

    The tiny policy is fine-tuned on ``policy.sft_tasks`` short demonstrations from another distribution
    (tasks/splits.sft_demonstrations); no task of D_0 or the held-out split is among them. When the shipped
    checkpoint 0 of the environment (`Environment.shipped_checkpoint`, agent/shipped_policy.py) is the one these
    inputs build, it is copied instead of built.
    """
    if config.policy.model != BUILTIN_TINY:
        return warmed_up_checkpoint(config, seed_pool, heldout)
    policy = tiny_policy(config)  # a policy setting the environment replaces is refused before any demonstration
    key, conversations = tiny_policy_inputs(config, seed_pool, heldout)
    out_dir = config.state_dir / "models" / f"tiny-{key[:12]}"
    # Named by the recipe's digest too, so a build of an older recipe is never taken for today's.
    recipe = build_digest(conversations, policy, config.start_seed)
    cached = config.policy_cache_dir / f"tiny-{key[:16]}-{recipe[:16]}" if config.policy_cache_dir else None
    if not is_built(out_dir, conversations, policy, config.start_seed):
        shipped = check_shipped(key, conversations, policy, config.start_seed, shipped_folder(config))
        if shipped.folder is not None:
            log.info("checkpoint 0: the shipped build %s, copied to %s", shipped.folder, out_dir)
            copy_shipped(shipped.folder, out_dir)
        elif cached is not None and is_built(cached, conversations, policy, config.start_seed):
            log.info("checkpoint 0: the build in policy_cache_dir %s, copied to %s", cached, out_dir)
            copy_shipped(cached, out_dir)
        else:
            log.info("checkpoint 0: building from the recipe into %s (%s)", out_dir, shipped.reason)
    built = build_tiny_policy(out_dir, conversations, policy, config.start_seed)
    if cached is not None and not is_built(cached, conversations, policy, config.start_seed):
        _add_to_cache(built, cached)
    return str(built)


def warmed_up_checkpoint(config: PipelineConfig, seed_pool: list[Task], heldout: list[Task]) -> str:
    """``policy.model`` as given, or after ``policy.warmup_steps`` of SFT on the tiny policy's demonstrations.

    The warm-up is kept under state_dir/models, named by its inputs' digest (agent.warmup.warm_up), so a resumed
    round 0 finds it.
    """
    if not config.policy.warmup_steps:
        return config.policy.model
    _, conversations = sft_demonstrations(config, seed_pool, heldout)
    models_dir = config.state_dir / "models"
    return str(warm_up(config.policy.model, models_dir, conversations, config.policy, config.start_seed))


def _add_to_cache(built: Path, cached: Path) -> None:
    """Publish a build in the shared folder whole, never replacing one: runs of other processes may be copying it.

    The copy fills a staging folder of its own and is renamed into place; when another run published the same
    build first, the rename fails and its copy stays.
    """
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
        try:
            shutil.copytree(built, staging, dirs_exist_ok=True)
            staging.rename(cached)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:  # published first by another run, or a folder this run cannot write
        log.info("checkpoint 0: not added to policy_cache_dir %s (%s)", cached.parent, exc)


def shipped_folder(config: PipelineConfig) -> Path | None:
    """Where ``config``'s environment ships checkpoint 0 of its default settings; None where it ships none."""
    return environment_class(config.environment.name).shipped_checkpoint


def rebuild_shipped_policy(config: PipelineConfig, scratch: Path, folder: Path) -> dict[str, Any]:
    """Build checkpoint 0 of ``config`` from the recipe, in ``scratch``, and ship it in ``folder``.

    What ``make policy`` runs (``folder``: the environment's `shipped_checkpoint`); returns the shipped record.
    """
    if config.policy.model != BUILTIN_TINY:
        raise PipelineError(f"policy.model is {config.policy.model!r}: only {BUILTIN_TINY!r} is built and shipped.")
    policy = tiny_policy(config)  # refused before the pools and demonstrations are made
    seed_pool, heldout = build_initial_pools(config)
    key, conversations = tiny_policy_inputs(config, seed_pool, heldout)
    built = build_tiny_policy(scratch / f"tiny-{key[:12]}", conversations, policy, config.start_seed)
    return ship(built, key, folder)


# --- Prefect tasks ------------------------------------------------------------------------------


def _builds_starting_point(inputs: PrepareInput) -> bool:
    """Round 0's prepare builds and records the run's starting point; a later round's only checks its inputs."""
    return inputs.round_ == 0


def _check_starting_point(config: PipelineConfig, wh: Warehouse, inputs: PrepareInput, output: PrepareOutput) -> None:
    """Checkpoint 0 and D_0 against the digests just recorded, or recorded by an earlier attempt."""
    verify_round_inputs(config, wh, 0)


@stage("prepare", retries=1, recorded=_builds_starting_point, check=_check_starting_point)
def prepare_stage(config: PipelineConfig, wh: Warehouse, inputs: PrepareInput) -> PrepareOutput:
    """Round 0: seed pool, held-out split, checkpoint 0. Later rounds: the previous round's checkpoint, checked."""
    if inputs.round_ > 0:
        return PrepareOutput(checkpoint=verify_round_inputs(config, wh, inputs.round_))
    logger = get_run_logger()
    seed_pool, heldout = build_initial_pools(config)
    wh.ensure_run(config.run_id, config.model_dump(mode="json"))
    wh.write_tasks(seed_pool + heldout)
    wh.set_pool(config.run_id, 0, [t.task_id for t in seed_pool])
    wh.set_pool(config.run_id, HELDOUT_ROUND, [t.task_id for t in heldout])
    logger.info("seed pool %d tasks, held-out split %d tasks", len(seed_pool), len(heldout))
    checkpoint = initial_checkpoint(config, seed_pool, heldout)
    # After checkpoint 0: the builtin policy's SFT set, which the dev split avoids, is built by then.
    dev = store_dev_split(config, wh)
    logger.info("dev split %d tasks", len(dev))
    final = store_final_heldout(config, wh)
    if final:
        logger.info("final held-out split %d tasks", len(final))
    # Checkpoint 0 and D_0 are digested like every later checkpoint and pool, so lineage starts
    # from recorded files and a resumed round 0 checks them before using them.
    checkpoint_sha = checkpoint_digest(checkpoint_folder(checkpoint))
    pool_sha = storage_pool.write_pool_snapshot(seed_pool, config.pool_path(0))
    # Checkpoint 0 on the first rollout.dev_eval_tasks dev tasks (rows under HELDOUT_ROUND, split "dev"),
    # the dev curve's start.
    scored = dev_eval_tasks(config, wh)
    splits = {HELDOUT_SPLIT: heldout, DEV_SPLIT: scored}
    rates = copied_baseline(wh, config, checkpoint_sha, splits)
    scored_by = config.rollout.checkpoint0_scores_from if rates is not None else config.run_id
    if rates is None:
        rates = evaluate_splits(config, wh, checkpoint, splits, HELDOUT_ROUND)
    else:
        logger.info("checkpoint 0's scores copied from run %s (same checkpoint digest, same tasks)", scored_by)
    baseline, dev_baseline = rates[HELDOUT_SPLIT], (rates[DEV_SPLIT] if scored else None)
    logger.info("checkpoint 0 at %s: held-out success %.3f", checkpoint, baseline)
    if scored:
        logger.info("checkpoint 0: dev success %.3f on %d tasks", dev_baseline, len(scored))
    return PrepareOutput(
        checkpoint=checkpoint, checkpoint_digest=checkpoint_sha, pool_digest=pool_sha, pool_size=len(seed_pool),
        heldout=len(heldout), baseline_heldout_success=baseline, baseline_dev_success=dev_baseline,
        checkpoint0_scored_by=scored_by, final_heldout=len(final),
        final_heldout_digest=storage_pool.pool_digest(final) if final else None,
    )  # fmt: skip


def finished_round_result(config: PipelineConfig, round_: int) -> dict[str, Any] | None:
    """What the round flow returns for round ``round_`` once it is finished, read from its records; None before.

    A finished round is never opened again (`Warehouse.finished_round`): a resumed ablation, a deployment run
    or `coevolve round` asking for it gets what it recorded, even under a configuration with more training
    steps than it ran, which would otherwise play and train steps into a round recorded as finished.
    """
    # Read-only, before the run's slot is held: rounds started at once on a new run must not both create the
    # warehouse (each would find the other's first files), and a reader never blocks a writer.
    root, options = config.warehouse_path, config.warehouse.storage_options
    if not storage_warehouse.Warehouse.made_at(root, options):
        return None
    with storage_warehouse.Warehouse(root, read_only=True, storage_options=options) as wh:
        record = wh.finished_round(config.run_id, round_)
        if record is None:
            return None
        versioned = wh.stage_output(config.run_id, round_, "version")
        prepared = wh.stage_output(config.run_id, 0, "prepare") if round_ == 0 else None
    # The version record follows the summary's fields with what it registered (finish_round copies them).
    result = VersionOutput.model_validate(versioned if versioned is not None else record["summary"])
    return {
        **result.model_dump(mode="json"),
        "baseline_heldout_success": (prepared or {}).get("baseline_heldout_success"),
    }


def first_unfinished_round(finished: list[int]) -> int:
    """Rounds run in order, so the next one is right after the last finished round."""
    return max(finished) + 1 if finished else 0


@task(name="next-round", cache_policy=NO_CACHE)
def next_round_task(config: PipelineConfig) -> int:
    """The round an evolution should run next: 0 for a new run."""
    with open_warehouse(config) as wh:
        finished = [s.round for s in wh.rounds(config.run_id)]
    return first_unfinished_round(finished)
