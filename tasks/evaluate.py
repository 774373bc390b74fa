"""Evaluation stage: a checkpoint's greedy success on the run's held-out split and on the environment's official
categories (BFCL's multi-turn categories).

Held-out tasks come from the same explorer as the seed pool but another seed, and the
validator refuses any candidate equal to one, so the policy never trains on them. Official
categories are the environment's (`Environment.official_tasks`): for BFCL the v3 multi-turn entries
(all 200 of multi_turn_base is the paper's protocol).
Results go to the warehouse's ``evaluations`` table, one row per task, under
(run, round, split); the split of an official category is its name, so a long-context entry and
its base twin (same task_id) never share a key. The splits themselves belong to tasks/splits.py.

The round flow runs the ``evaluate`` stage; ``flows/evaluate.py`` (``coevolve evaluate``) calls
``evaluate_split_task`` once per split.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from agent.engines import context_length, open_engine, release
from coevolve.config import EnvironmentConfig, PipelineConfig
from coevolve.errors import is_retryable
from coevolve.records import Task, Trajectory
from coevolve.stages import EvaluateInput, EvaluateOutput
from envs.registry import make_environment
from tasks.common import open_warehouse
from tasks.registry import stage
from tasks.rollout import play_episodes, success_rate
from tasks.splits import (
    DEV_SPLIT,
    EXTERNAL_ROUND,
    HELDOUT_ROUND,
    HELDOUT_SPLIT,
    dev_eval_tasks,
    dev_split,
    heldout_split,
)

if TYPE_CHECKING:
    from storage.warehouse import Warehouse


def play_greedy(config: PipelineConfig, engine: Any, tasks: list[Task], round_: int, desc: str) -> list[Trajectory]:
    """One episode of every task at ``rollout.eval_temperature`` (greedy by default), in order, through ``engine``."""
    return play_episodes(
        engine,
        tasks,
        samples=1,
        temperature=config.rollout.eval_temperature,
        max_new_tokens=config.rollout.max_new_tokens,
        env_config=config.environment,
        run_id=config.run_id,
        round_=round_,
        max_context_tokens=context_length(engine),
        batch_size=config.rollout.eval_generate_batch,
        desc=desc,
        seed=config.seed,  # greedy ignores it; a sampled evaluation (eval_temperature > 0) replays
    )


def store_scores(
    config: PipelineConfig, wh: Warehouse, round_: int, split: str, trajectories: list[Trajectory]
) -> float:
    """Write one split's evaluation rows under (run, round, split); its success rate."""
    wh.write_evaluations(
        config.run_id, round_, split, [(t.task_id, t.success, t.reward, t.trajectory_id) for t in trajectories]
    )
    return success_rate(trajectories)


def evaluate_checkpoint(
    config: PipelineConfig,
    wh: Warehouse,
    checkpoint: str,
    tasks: list[Task],
    round_: int,
    split: str = HELDOUT_SPLIT,
    engine: Any | None = None,
) -> float:
    """Greedy success rate of ``checkpoint`` on ``tasks``; rows are stored under (run, round, split).

    Pass ``engine`` to reuse a loaded model across splits; an engine loaded here is released before returning.
    """
    if not tasks:
        return 0.0
    owned = engine is None
    engine = engine or open_engine(checkpoint, config)
    try:
        trajectories = play_greedy(config, engine, tasks, round_, f"evaluate {split}")
    finally:
        if owned:
            release(engine)
    return store_scores(config, wh, round_, split, trajectories)


def evaluate_splits(
    config: PipelineConfig, wh: Warehouse, checkpoint: str, splits: dict[str, list[Task]], round_: int
) -> dict[str, float]:
    """``evaluate_checkpoint`` on several splits with one model load; no load at all when every split is empty.

    Splits whose task ids are all distinct are played together, in generate calls of up to
    ``rollout.eval_generate_batch`` episodes: a decoding loop runs until its longest message ends, so fewer,
    larger calls take fewer steps. An empty split scores 0.0, as in ``evaluate_checkpoint``: a run without
    held-out or dev tasks (or a managed server per load) costs nothing here.
    """
    if not any(splits.values()):
        return dict.fromkeys(splits, 0.0)
    every = [task for tasks in splits.values() for task in tasks]
    # Released when the block ends: vLLM shut down, GPU memory and connections freed.
    with open_engine(checkpoint, config) as engine:
        if len({task.task_id for task in every}) < len(every):  # an official category's twins share task ids
            return {
                split: evaluate_checkpoint(config, wh, checkpoint, tasks, round_, split, engine=engine)
                for split, tasks in splits.items()
            }
        played = play_greedy(config, engine, every, round_, "evaluate " + ", ".join(splits))
    rates, start = {}, 0
    for split, tasks in splits.items():
        rates[split] = store_scores(config, wh, round_, split, played[start : start + len(tasks)]) if tasks else 0.0
        start += len(tasks)
    return rates


def official_overall(env_config: EnvironmentConfig, accuracies: Mapping[str, float]) -> tuple[str, float] | None:
    """The environment's official overall score of per-split accuracies, with its name; None where it has none.

    BFCL's is the leaderboard's multi-turn overall (``multi_turn_overall``): the unweighted mean of the
    four multi-turn categories, a category that was not evaluated counting as 0, None when none was.
    """
    env = make_environment(env_config)
    overall = env.official_overall(accuracies)
    return None if overall is None else (env.overall_name, overall)


def official_categories(env_config: EnvironmentConfig) -> tuple[str, ...]:
    """The environment's official evaluation categories, in its order; none where it has no official benchmark."""
    return make_environment(env_config).official_categories


def default_categories(env_config: EnvironmentConfig) -> tuple[str, ...]:
    """The official categories `coevolve evaluate` scores when none are named (BFCL: multi_turn_base)."""
    return make_environment(env_config).default_categories


def category_name(env_config: EnvironmentConfig, name: str) -> str:
    """The environment's official category ``name`` stands for (BFCL: ``base`` or ``multi_turn_base`` ->
    ``multi_turn_base``); an unknown name fails with the choices."""
    return make_environment(env_config).official_category(name)


def split_tasks(config: PipelineConfig, wh: Warehouse, split: str, limit: int | None = None) -> list[Task]:
    """The tasks of one split: the run's held-out split, its dev split, or every entry of an official category.

    A run without a held-out or dev split yet gets the one its round 0 would build (same seed, same tasks).
    """
    if split == DEV_SPLIT:
        tasks = dev_split(config, wh)
    elif split == HELDOUT_SPLIT:
        tasks = heldout_split(config, wh)
    else:
        env = make_environment(config.environment)
        tasks = env.official_tasks(env.official_category(split))
    return tasks[:limit] if limit is not None else tasks


def evaluation_round(config: PipelineConfig, wh: Warehouse, checkpoint: str) -> int:
    """The round a checkpoint's evaluation rows belong to, as the round flow stores them.

    Round r's update writes checkpoint r+1 and its held-out rows go under round r; checkpoint 0
    (round 0's prepare) goes under HELDOUT_ROUND; any other checkpoint under EXTERNAL_ROUND.
    """

    def same(path: str | None) -> bool:
        return path is not None and path != "" and Path(path).resolve() == Path(checkpoint).resolve()

    for summary in wh.rounds(config.run_id):
        if same(summary.checkpoint):
            return summary.round
    prepared = wh.stage_output(config.run_id, 0, "prepare") or {}
    return HELDOUT_ROUND if same(prepared.get("checkpoint")) else EXTERNAL_ROUND


# --- Prefect tasks ------------------------------------------------------------------------------


@stage("evaluate", retries=2, retry_delay_seconds=5)
def evaluate_stage(config: PipelineConfig, wh: Warehouse, inputs: EvaluateInput) -> EvaluateOutput:
    """Score checkpoint ``round_ + 1`` on the held-out split, and on the first ``rollout.dev_eval_tasks`` dev tasks.

    Dev rows are stored under the round with split DEV_SPLIT; the output then also holds ``dev_success``.
    """
    round_ = inputs.round_
    heldout = wh.pool(config.run_id, HELDOUT_ROUND)
    dev = dev_eval_tasks(config, wh)
    rates = evaluate_splits(config, wh, inputs.checkpoint, {HELDOUT_SPLIT: heldout, DEV_SPLIT: dev}, round_)
    get_run_logger().info("round %d: held-out success %.3f on %d tasks", round_, rates[HELDOUT_SPLIT], len(heldout))
    if not dev:
        return EvaluateOutput(heldout_success=rates[HELDOUT_SPLIT], heldout_tasks=len(heldout))
    get_run_logger().info("round %d: dev success %.3f on %d tasks", round_, rates[DEV_SPLIT], len(dev))
    return EvaluateOutput(
        heldout_success=rates[HELDOUT_SPLIT],
        heldout_tasks=len(heldout),
        dev_success=rates[DEV_SPLIT],
        dev_tasks=len(dev),
    )


@task(name="evaluate-split", retries=2, retry_delay_seconds=5, retry_condition_fn=is_retryable, cache_policy=NO_CACHE)
def evaluate_split_task(
    config: PipelineConfig, checkpoint: str, split: str, round_: int, limit: int | None = None
) -> dict:
    """Score ``checkpoint`` greedily on one split (``heldout``, ``dev`` or an official category) and store the rows."""
    with open_warehouse(config) as wh:
        tasks = split_tasks(config, wh, split, limit)
        rate = evaluate_checkpoint(config, wh, checkpoint, tasks, round_, split)
    get_run_logger().info("%s: accuracy %.3f on %d tasks", split, rate, len(tasks))
    return {"split": split, "accuracy": rate, "tasks": len(tasks)}
