"""Evaluation stage: a checkpoint's greedy success on the run's held-out synthetic tasks.

Held-out tasks come from the same explorer as the seed pool but another seed, and the
validator refuses any candidate equal to one, so the policy never trains on them.
Results go to the warehouse's ``evaluations`` table, one row per task.
"""

from __future__ import annotations

from coevolve.config import PipelineConfig
from coevolve.records import Task
from tasks.common import load_engine, max_context, open_warehouse
from tasks.rollout import play_episodes, success_rate


def evaluate_checkpoint(
    config: PipelineConfig, checkpoint: str, tasks: list[Task], round_: int, split: str = "heldout"
) -> float:
    """Greedy success rate of ``checkpoint`` on ``tasks``; rows are stored under (run, round, split)."""
    if not tasks:
        return 0.0
    engine = load_engine(checkpoint, config)
    trajectories = play_episodes(
        engine,
        tasks,
        samples=1,
        temperature=config.rollout.eval_temperature,
        max_new_tokens=config.rollout.max_new_tokens,
        env_config=config.environment,
        run_id=config.run_id,
        round_=round_,
        max_context_tokens=max_context(engine),
        desc=f"evaluate {split}",
    )
    with open_warehouse(config) as wh:
        wh.write_evaluations(
            config.run_id,
            round_,
            split,
            [(t.task_id, t.success, t.reward, t.trajectory_id) for t in trajectories],
        )
    return success_rate(trajectories)


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from coevolve.errors import is_retryable  # noqa: E402
from tasks.common import HELDOUT_ROUND, resumable  # noqa: E402


@task(name="evaluate", retries=2, retry_delay_seconds=5, retry_condition_fn=is_retryable, cache_policy=NO_CACHE)
def evaluate_task(config: PipelineConfig, round_: int, checkpoint: str) -> dict:
    """Score checkpoint ``round_ + 1`` on the held-out split."""

    def compute() -> dict:
        with open_warehouse(config) as wh:
            heldout = wh.pool(config.run_id, HELDOUT_ROUND)
        rate = evaluate_checkpoint(config, checkpoint, heldout, round_)
        get_run_logger().info("round %d: held-out success %.3f on %d tasks", round_, rate, len(heldout))
        return {"heldout_success": rate, "heldout_tasks": len(heldout)}

    return resumable(config, round_, "evaluate", compute)
