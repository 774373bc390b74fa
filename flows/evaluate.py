"""Evaluation of one checkpoint as a Prefect flow: the paper's BFCL protocol plus the run's held-out split.

Run: ``coevolve evaluate --checkpoint PATH [--categories base,miss_func] [--limit N]``.
Each official category of the environment (default: its own; BFCL's is all 200 multi_turn_base entries, as in
the paper) and the run's
held-out synthetic split is one retryable task, scored greedily (``rollout.eval_temperature``).
Rows land in the warehouse's ``evaluations`` table (split = category name or ``heldout``), the
per-split accuracy goes to MLflow as one evaluation run, and the flow returns it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from prefect import flow
from prefect.runtime import flow_run

from coevolve.config import PipelineConfig
from coevolve.optional import optional_module
from coevolve.settings import apply_settings
from tasks.common import open_warehouse
from tasks.evaluate import (
    category_name,
    default_categories,
    evaluate_split_task,
    evaluation_round,
    official_overall,
)
from tasks.splits import DEV_SPLIT, HELDOUT_SPLIT

# MLflow takes seconds to import; only logging an evaluation needs it.
if TYPE_CHECKING:
    import storage.tracking as tracking
else:
    tracking = optional_module("storage.tracking")

# What `coevolve evaluate` imports to load and play its checkpoint, while its Prefect API starts
# (flows.round.round_imports for a round's).
EVALUATE_IMPORTS = ("torch", "transformers.models.auto.modeling_auto")


def evaluation_run_name(config: PipelineConfig, checkpoint: str, round_: int) -> str:
    """MLflow run name: the run, the round the rows are stored under, and a short id of the checkpoint."""
    short = hashlib.sha256(checkpoint.encode()).hexdigest()[:8]
    return f"{config.run_id}-evaluate-r{round_:03d}-{short}"


def log_evaluation(
    config: PipelineConfig, checkpoint: str, round_: int, results: dict[str, dict[str, Any]], flow_run_id: str
) -> str:
    """Per-split accuracy and task counts as one MLflow run; returns its id."""
    tracker = tracking.Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    metrics = {f"accuracy.{split}": r["accuracy"] for split, r in results.items()}
    metrics.update({f"tasks.{split}": r["tasks"] for split, r in results.items()})
    overall = official_overall(config.environment, {split: r["accuracy"] for split, r in results.items()})
    if overall is not None:
        # The environment's official overall (tasks.evaluate.official_overall; BFCL's leaderboard multi-turn
        # overall, where unevaluated categories count 0).
        name, value = overall
        metrics[f"accuracy.{name}"] = value
    params = {
        "checkpoint": checkpoint,
        "splits": ",".join(results),
        "eval_temperature": config.rollout.eval_temperature,
        "max_new_tokens": config.rollout.max_new_tokens,
        "max_steps": config.environment.max_steps,
        "tool_list": config.environment.tool_list,
        # The environment's own settings (BFCL's prompt_style and bfcl_handler), unset ones as "".
        **{name: "" if value is None else value for name, value in config.environment.settings().model_dump().items()},
    }
    tags = {"coevolve.run_id": config.run_id, "coevolve.round": str(round_), "flow_run_id": flow_run_id}
    return tracker.log_evaluation(evaluation_run_name(config, checkpoint, round_), metrics, params, tags)


@flow(name="coevolve-evaluate")
def coevolve_evaluate(
    checkpoint: str,
    categories: list[str] | None = None,
    heldout: bool = True,
    config: dict[str, Any] | None = None,
    limit: int | None = None,
    round_: int | None = None,
    dev: bool = False,
) -> dict[str, float]:
    """Greedy accuracy of ``checkpoint`` per split: each official category, then ``heldout``.

    ``categories`` None scores the environment's default categories (BFCL: multi_turn_base).

    ``limit`` keeps the first N tasks of each split (smoke tests); ``round_`` overrides the round the
    rows are stored under (by default the round whose update wrote the checkpoint, see
    tasks.evaluate.evaluation_round); ``dev`` adds the dev split, for choosing settings.
    """
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI
    named = categories if categories is not None else list(default_categories(cfg.environment))
    splits = (
        [category_name(cfg.environment, c) for c in named]
        + ([HELDOUT_SPLIT] if heldout else [])
        + ([DEV_SPLIT] if dev else [])
    )
    if not splits:
        # Nothing to score (the ablation's official splits of an environment without an official benchmark):
        # no warehouse lookup and no empty MLflow evaluation run.
        return {}
    if round_ is None:
        with open_warehouse(cfg) as wh:
            round_ = evaluation_round(cfg, wh, checkpoint)
    results = {split: evaluate_split_task(cfg, checkpoint, split, round_, limit) for split in splits}
    log_evaluation(cfg, checkpoint, round_, results, str(flow_run.get_id() or ""))
    return {split: r["accuracy"] for split, r in results.items()}
