r"""The built-in ablation: does signal-guided co-evolution beat a static pool and random synthesis?

Every arm is offered the same rounds, group size and update steps, from the same seed pool and checkpoint 0
(``pool.seed``); the random arm explores as many targets as the signal arms select (equal task volume). An
update skips a step whose groups all have equal rewards, so arms end with different optimizer-step counts: the
report prints them and tests the arms again at equal steps. Each (arm, seed) pair is its own run in the
warehouse, so everything is queryable afterwards; the report compares arms paired by seed and task. The arms
and their overrides are registered in tasks/ablation/arms.py (``ARMS``).

The ``+learnability`` arms (``static+learnability``, ``random+learnability``, ``full+learnability``)
are their base arm with the curriculum on: the batch is drawn by estimated learnability
(``pool.sampler: learnability``) and groups whose rewards are all equal are replaced by new tasks until
the step has ``rollout.tasks_per_batch`` informative groups (``rollout.dynamic_sampling``). Its episode
budget is a base arm's: such an arm's batch is the base batch divided by ``CURRICULUM_ROLLOUT_FACTOR``
(``curriculum_batch``), so the most episodes it may play per step, tasks_per_batch x group_size x
max_rollout_factor, is what a base arm plays (configs/ablation.yaml: 4 x 6 x 2 = 8 x 6 = 48 a step), and it is
offered as many optimizer steps per round. The report prints each arm's episodes played and optimizer steps,
so a reader sees what each arm spent. A curriculum arm plays another rollout in round 0 than its base arm, so it
computes its own round 0 instead of copying it. Run ids spell ``+`` as ``_`` (tasks/ablation/arms.arm_run_label):
run ids, MLflow metric names and model names take letters, digits, ``_``, ``.`` and ``-`` only.

With ``rollout.final_heldout_tasks`` > 0 (configs/ablation.yaml: 500), checkpoint 0 is scored on the
final held-out split once per ablation (rows under run ``<name>-checkpoint-0``) and every run's final
checkpoint once, after its last round; the per-round evaluation keeps the 100-task split, so the
larger split costs two evaluations per run's worth of time instead of one per round.

Every arm of a seed plays the same round-0 rollout, update and evaluation: they read checkpoint 0, D_0,
the held-out and dev splits and the loop seed, never the settings arms change (``ARM_SECTIONS``). So
the first arm of a seed computes them, and every later arm of that seed copies their rows, checkpoint 1
and stage records (``copy_round0``, flows/ablation_round0.py), each record naming the run it was copied
from (``copied_from``; MLflow tag ``trajectories.copied_from`` on checkpoint 1's version). Mining, synthesis
and validation, which arms do change, and the version stage run in every arm, so pool 1 is the arm's own.

Different seeds share nothing after checkpoint 0, so their chains of arms run at the same time, each in
a process of Prefect's ProcessPoolTaskRunner (``ablation_workers``, ``--workers``): a round's torch work
uses one thread, so one chain keeps one core busy. Checkpoint 0 is built and scored before they start.

Run::

    coevolve ablation --config configs/ablation.yaml [--arms static,random,full] [--seeds 1,2,3,4,5] \
        [--rounds 5] [--workers 2]
"""

from __future__ import annotations

import copy
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import TerminationSignal
from prefect.task_runners import ProcessPoolTaskRunner

from coevolve.config import PipelineConfig
from coevolve.errors import ConfigError, DataError
from coevolve.records import Task, canonical_json
from coevolve.settings import apply_settings
from coevolve.stages import PrepareInput
from flows.ablation_round0 import copy_round0
from flows.evaluate import coevolve_evaluate
from flows.round import coevolve_round
from flows.stage import run_slot, run_stage
from storage.state_version import check_state
from storage.tracking import Tracker
from tasks.ablation.arms import ARMS, arm_run_label
from tasks.ablation.report import FINAL_SPLIT
from tasks.ablation.report_task import report_task
from tasks.common import open_warehouse, round_lock
from tasks.evaluate import category_name, default_categories, evaluate_checkpoint, evaluation_round, split_tasks
from tasks.prepare import finished_round_result
from tasks.splits import FINAL_HELDOUT_ROUND, HELDOUT_ROUND

# Seconds a seed's process has to end after SIGTERM before it is killed: enough to record its Prefect task run as
# crashed, too short for the seed the pool queued next, which the process starts once its own seed has stopped, to
# finish a round (what the seeds record survives a kill, as any round's does).
SEED_STOP_GRACE_S = 2.0


def curriculum_batch(tasks_per_batch: int, max_rollout_factor: float) -> int:
    """The batch of a dynamic-sampling arm with the episode budget of a base arm's ``tasks_per_batch``.

    Its step plays at most batch x group_size x max_rollout_factor episodes; a base arm's plays
    tasks_per_batch x group_size. Rounded down (at least 1), so a curriculum arm never plays more.
    """
    return max(1, int(tasks_per_batch // max_rollout_factor))


def arm_config(
    base: PipelineConfig, arm: str, seed: int, name: str, checkpoint0_scores_from: str | None = None
) -> PipelineConfig:
    """The configuration of one (arm, seed) run: the arm's overrides, its own run id and loop seed.

    ``checkpoint0_scores_from``: the run whose scores of the shared checkpoint 0 this run copies.
    """
    if arm not in ARMS:
        raise ValueError(f"unknown ablation arm {arm!r}; choose from {', '.join(ARMS)}")
    overrides = copy.deepcopy(ARMS[arm])
    rollout = overrides.get("rollout", {})
    if rollout.get("dynamic_sampling"):
        rollout["tasks_per_batch"] = curriculum_batch(base.rollout.tasks_per_batch, rollout["max_rollout_factor"])
    overrides.update({"run_id": f"{name}-{arm_run_label(arm)}-s{seed}", "seed": seed})
    overrides.setdefault("pool", {})["seed"] = base.start_seed
    if checkpoint0_scores_from:
        overrides.setdefault("rollout", {})["checkpoint0_scores_from"] = checkpoint0_scores_from
    return base.with_overrides(overrides)


def arm_configs(
    base: PipelineConfig, arms: list[str], seeds: list[int], name: str
) -> list[tuple[str, int, PipelineConfig]]:
    """Every (arm, seed) run's configuration, checked to be distinct runs before any of them starts.

    Raises ConfigError naming the arms when two runs resolve to one run id (they would share a pool
    and recorded stages, and the report would compare a run with itself), or when two arms of one seed
    resolve to the same settings (e.g. ``signals.enabled`` already leaves out what a leave-one-out arm
    removes), which would make the comparison empty.
    """
    # Every run shares checkpoint 0 (pool.seed) and its evaluation settings: the first run scores it, the others copy.
    first = f"{name}-{arm_run_label(arms[0])}-s{seeds[0]}" if arms and seeds else None
    runs = [
        (arm, seed, arm_config(base, arm, seed, name, None if (arm, seed) == (arms[0], seeds[0]) else first))
        for seed in seeds
        for arm in arms
    ]
    by_run_id: dict[str, list[str]] = {}
    by_settings: dict[tuple[int, str], list[str]] = {}
    for arm, seed, cfg in runs:
        by_run_id.setdefault(cfg.run_id, []).append(f"{arm} (seed {seed})")
        settings = cfg.model_dump(mode="json", exclude={"run_id": True, "rollout": {"checkpoint0_scores_from": True}})
        by_settings.setdefault((seed, canonical_json(settings)), []).append(arm)
    for run_id, names in by_run_id.items():
        if len(names) > 1:
            raise ConfigError(
                f"Ablation runs {', '.join(names)} all resolve to run id {run_id!r}; give each arm and seed its own."
            )
    for (seed, _), names in by_settings.items():
        if len(names) > 1:
            raise ConfigError(
                f"Ablation arms {', '.join(names)} resolve to the same settings for seed {seed}, so comparing them "
                "measures nothing; check the base configuration's synthesis.mode and signals.enabled, or drop one arm."
            )
    return runs


def checkpoint0_run_id(name: str) -> str:
    """The run id under which an ablation stores checkpoint 0's scores on the final held-out split.

    One per ablation.
    """
    return f"{name}-checkpoint-0"


def score_once(config: PipelineConfig, checkpoint: str, tasks: list[Task], round_: int) -> dict[str, bool]:
    """``checkpoint``'s outcomes on the final held-out split under (config.run_id, round_).

    Scored only if not stored yet.
    """
    with open_warehouse(config) as wh:
        stored = wh.evaluation_outcomes(config.run_id, round_, FINAL_SPLIT)
    if len(stored) < len(tasks):
        with open_warehouse(config) as wh:
            evaluate_checkpoint(config, wh, checkpoint, tasks, round_, FINAL_SPLIT)
            stored = wh.evaluation_outcomes(config.run_id, round_, FINAL_SPLIT)
    return stored


def official_scores(config: PipelineConfig, checkpoint: str, limit: int | None) -> dict[str, float]:
    """A run's final checkpoint's accuracy on each official split of its environment (BFCL: multi_turn_base).

    Read back where an earlier attempt stored every task of each split (a resumed ablation walks its finished
    runs again), played with ``coevolve_evaluate`` otherwise: a resume neither plays them again nor logs another
    MLflow evaluation run.
    """
    splits = [category_name(config.environment, c) for c in default_categories(config.environment)]
    with open_warehouse(config) as wh:
        round_ = evaluation_round(config, wh, checkpoint)
        stored = {split: wh.evaluation_outcomes(config.run_id, round_, split) for split in splits}
        complete = all(len(stored[split]) == len(split_tasks(config, wh, split, limit)) for split in splits)
    if complete:
        return {split: sum(scored.values()) / len(scored) if scored else 0.0 for split, scored in stored.items()}
    return coevolve_evaluate(
        checkpoint=checkpoint,
        categories=None,  # the environment's default official splits (BFCL: multi_turn_base; none elsewhere)
        heldout=False,
        config=config.model_dump(mode="json"),
        limit=limit,
        round_=round_,
    )


def final_heldout_of(config: PipelineConfig) -> tuple[list[Task], dict]:
    """A run's stored final held-out split and its round-0 prepare output.

    The output holds checkpoint 0, its digest and the split's digest.
    """
    with open_warehouse(config) as wh:
        return wh.pool(config.run_id, FINAL_HELDOUT_ROUND), wh.stage_output(config.run_id, 0, "prepare") or {}


def score_final_heldout(
    base: PipelineConfig, name: str, cfg: PipelineConfig, summaries: list[dict], baseline: dict
) -> dict[str, Any]:
    """Score one run's final checkpoint on the final held-out split, and checkpoint 0 the first time only.

    ``baseline`` holds the split's digest, checkpoint 0's digest and its outcomes (score_checkpoint0 fills
    it before the seeds' chains start; an empty one is filled by the first run), so an ablation scores its
    shared checkpoint 0 once. Every run must hold the same split and
    start from the same checkpoint 0: both come from ``pool.seed``, which every arm shares.
    """
    tasks, prepared = final_heldout_of(cfg)
    if not tasks:
        return {}
    shared = {
        "split_digest": prepared.get("final_heldout_digest"),
        "checkpoint_digest": prepared.get("checkpoint_digest"),
    }
    for key, value in shared.items():
        if baseline.setdefault(key, value) != value:
            raise DataError(
                f"Run {cfg.run_id!r} has {key.replace('_', ' ')} {str(value)[:16]}, "
                f"not {str(baseline[key])[:16]} like the ablation's other runs: "
                "its arms must share pool.seed and the policy settings. Give them the same, or a new name."
            )
    if "outcomes" not in baseline:
        ckpt0_config = base.with_overrides({"run_id": checkpoint0_run_id(name)})
        baseline["outcomes"] = score_once(ckpt0_config, prepared["checkpoint"], tasks, HELDOUT_ROUND)
    final = score_once(cfg, summaries[-1]["checkpoint"], tasks, summaries[-1]["round"])
    return {
        "final_heldout_outcomes": final,
        "final_baseline_outcomes": baseline["outcomes"],
        "final_heldout_size": len(tasks),
        "final_heldout_digest": shared["split_digest"],
    }


def score_checkpoint0(base: PipelineConfig, name: str, first: PipelineConfig) -> dict[str, Any]:
    """Prepare the ablation's first run (checkpoint 0, the splits) and score checkpoint 0 on the final held-out split.

    Done once, before any seed's chain starts, so the chains, which run at the same time, copy checkpoint
    0's held-out and dev scores from the first run (``checkpoint0_scores_from``) and share one baseline.
    """
    with run_slot(first, 0), round_lock(first, 0):
        run_stage(first, PrepareInput(round_=0))  # recorded, so the run's round 0 resumes after it
    tasks, prepared = final_heldout_of(first)
    if not tasks:
        return {}
    ckpt0_config = base.with_overrides({"run_id": checkpoint0_run_id(name)})
    return {
        "split_digest": prepared.get("final_heldout_digest"),
        "checkpoint_digest": prepared.get("checkpoint_digest"),
        "outcomes": score_once(ckpt0_config, prepared["checkpoint"], tasks, HELDOUT_ROUND),
    }


def round_result(config: PipelineConfig, round_: int) -> dict[str, Any]:
    """What ``coevolve_round`` returns for the run's round ``round_``: a finished round's recorded result read directly,
    any other round run as a subflow. A resumed ablation walks every finished run again, and a subflow run for each
    of their rounds would cost it about a second a round."""
    recorded = finished_round_result(config, round_)
    return recorded if recorded is not None else coevolve_round(round_=round_, config=config.model_dump(mode="json"))


@task(name="ablation-seed", cache_policy=NO_CACHE)
def seed_chain(
    base_config: dict[str, Any],
    runs: list[tuple[str, int, dict[str, Any]]],
    rounds: int,
    official_limit: int | None,
    name: str,
    baseline: dict[str, Any],
) -> list[dict[str, Any]]:
    """Every arm of one seed, in order: the first computes round 0, the later ones copy it (copy_round0).

    Runs in a process of its own (the ablation's ProcessPoolTaskRunner); rounds and evaluations are
    subflows of this task run, so they show up under it in Prefect.
    """
    base = PipelineConfig.model_validate(base_config)
    apply_settings(base)  # a fresh process: torch threads and the rest as the CLI sets them
    results: list[dict[str, Any]] = []
    source: PipelineConfig | None = None
    for arm, seed, cfg_data in runs:
        cfg = PipelineConfig.model_validate(cfg_data)
        if source is not None and rounds > 0:
            with run_slot(cfg, 0), round_lock(cfg, 0):
                run_stage(cfg, PrepareInput(round_=0))  # recorded, so the round resumes after it
                copied = copy_round0(source, cfg)
            shared = f"copied from {copied}" if copied else "computed here"
            get_run_logger().info("%s: round 0's rollout, update and evaluation %s", cfg.run_id, shared)
        source = source or cfg
        check_state(cfg)  # a state folder of another schedule or record version: refused before its records are read
        summaries = [round_result(cfg, r) for r in range(rounds)]
        official = official_scores(cfg, summaries[-1]["checkpoint"], official_limit)
        final = score_final_heldout(base, name, cfg, summaries, baseline)
        results.append(
            {"arm": arm, "seed": seed, "run_id": cfg.run_id, "rounds": summaries, "official": official, **final}
        )
    return results


@flow(name="coevolve-ablation")
def coevolve_ablation(
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    rounds: int | None = None,
    official_limit: int | None = 50,
    name: str = "ablation",
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every arm for every seed, ``rounds`` rounds each (default: the configuration's ``ablation_rounds``), score
    the final checkpoints, and write the report.

    Checkpoint 0 is built and scored first; then each seed's arms run as one chain (seed_chain), up to
    ``ablation_workers`` seeds at the same time in their own processes. Each seed's runs are the same
    whatever the number of workers, so the report is too.
    """
    base = PipelineConfig.model_validate(config or {})
    apply_settings(base)  # a worker started anywhere runs like the CLI
    arms = list(arms or ARMS)
    seeds = list(seeds or [1, 2, 3, 4, 5])
    rounds = base.ablation_rounds if rounds is None else rounds
    runs = arm_configs(base, arms, seeds, name)
    baseline = score_checkpoint0(base, name, runs[0][2]) if runs and rounds > 0 else {}
    # MLflow creates (migrates) a new SQLite store on first use; two chains doing that at once collide
    # ("table _alembic_tmp_experiments already exists"), so the store is created here, before they start.
    Tracker(base.mlflow_tracking_uri, base.tracking.experiment, base.artifacts_dir)
    chains = {seed: [(arm, s, cfg.model_dump(mode="json")) for arm, s, cfg in runs if s == seed] for seed in seeds}
    with ProcessPoolTaskRunner(max_workers=min(base.ablation_workers, len(seeds))) as runner:
        try:
            futures = [
                runner.submit(seed_chain, {"base_config": base.model_dump(mode="json"), "runs": chain,
                                           "rounds": rounds, "official_limit": official_limit, "name": name,
                                           "baseline": baseline})
                for chain in chains.values()
            ]  # fmt: skip
            results = [row for future in futures for row in future.result()]
        except (KeyboardInterrupt, TerminationSignal):
            stop_seed_processes(runner)
            raise
    return report_task(base, name, results)


# Where Prefect's process pool keeps the queue its processes' log messages travel by (a private attribute of
# prefect.task_runners.ProcessPoolTaskRunner; tests/flows/test_ablation_flow.py fails if Prefect renames it).
MESSAGE_QUEUE_ATTRIBUTE = "_subprocess_message_queue"
# And where it keeps its concurrent.futures.ProcessPoolExecutor, whose ``_processes`` are the seeds' processes.
EXECUTOR_ATTRIBUTE = "_executor"


def stop_seed_processes(runner: ProcessPoolTaskRunner) -> None:
    """End the processes playing seeds, on Ctrl-C or SIGTERM.

    Leaving the pool otherwise waits for every seed it holds to finish, and starts the one it had already queued
    (Python's process pool hands a worker its next call before the current one ends): an interrupted ablation
    ran on for minutes. What the seeds recorded stays; the same command resumes their runs where they stopped.
    """
    # Only the pool's own processes: any other child of this process (a server a caller started) is not a seed.
    executor = getattr(runner, EXECUTOR_ATTRIBUTE, None)
    seeds = list((getattr(executor, "_processes", None) or {}).values())
    for process in seeds:
        process.terminate()
    for process in seeds:
        process.join(timeout=SEED_STOP_GRACE_S)
        if process.is_alive():
            # A SIGTERM that arrives while a process is still being started can be lost; SIGKILL cannot, but it
            # lands asynchronously, so wait for it before the caller relies on the seed being gone.
            process.kill()
            process.join()
    # A process ended while it held the lock of the queue its Prefect logs travel by leaves that lock taken, and the
    # message that stops the pool's forwarding thread would wait for it at this process's exit, for ever.
    messages = getattr(runner, MESSAGE_QUEUE_ATTRIBUTE, None)
    if messages is not None:
        messages.cancel_join_thread()
