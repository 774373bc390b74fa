"""Versioning stage: freeze pool r+1, register checkpoint r+1, and link both to the flow run.

The pool snapshot is an immutable Parquet file with a content digest. MLflow gets one run per
round holding the params, the metrics, the pool (dataset input and artifact) and the
checkpoint, registered as a model version whose tags name the pool digest and the Prefect flow
run; the warehouse's ``rounds`` row records the same links for SQL users.

The stage also records the checkpoint's digest (the next round checks it before loading the
checkpoint), points the registry alias "best" at the version with the highest held-out success so
far, and logs the run's learning curve (PNG) to the round's MLflow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coevolve.config import PipelineConfig
from coevolve.records import RoundSummary


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config to MLflow params: ``{"rollout": {"group_size": 6}}`` -> ``{"rollout.group_size": 6}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def build_summary(config: PipelineConfig, round_: int, outputs: dict[str, dict[str, Any]], flow_run_id: str) -> RoundSummary:
    rollout, mined, validated = outputs["rollout"], outputs["mine"], outputs["validate"]
    return RoundSummary(
        run_id=config.run_id,
        round=round_,
        pool_size=int(validated["pool_size"]),
        rollouts=int(rollout["trajectories"]),
        success_rate=float(rollout["success_rate"]),
        signals=dict(mined["signals"]),
        accepted=int(validated["accepted"]),
        rejected=int(validated["rejected"]),
        heldout_success=float(outputs["evaluate"]["heldout_success"]),
        checkpoint=str(outputs["update"]["checkpoint"]),
        flow_run_id=flow_run_id,
    )


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

from coevolve.errors import is_retryable  # noqa: E402
from tasks.common import open_warehouse, resumable  # noqa: E402


@task(name="version", retries=2, retry_delay_seconds=5, retry_condition_fn=is_retryable, cache_policy=NO_CACHE)
def version_task(config: PipelineConfig, round_: int, outputs: dict[str, dict[str, Any]]) -> dict:
    """Snapshot pool r+1, log the round to MLflow, and close the round in the warehouse."""
    from storage.pool import write_pool_snapshot
    from storage.tracking import Tracker
    from tasks.common import checkpoint_digest
    from tasks.plots import learning_curve

    def compute() -> dict:
        flow_run_id = str(flow_run.get_id() or "")
        summary = build_summary(config, round_, outputs, flow_run_id)
        with open_warehouse(config) as wh:
            pool = wh.pool(config.run_id, round_ + 1)
        pool_path = config.pool_path(round_ + 1)
        summary.pool_digest = write_pool_snapshot(pool, pool_path)
        weights_digest = checkpoint_digest(summary.checkpoint)
        tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
        metrics = {
            "pool_size": summary.pool_size,
            "rollouts": summary.rollouts,
            "success_rate": summary.success_rate,
            "accepted": summary.accepted,
            "rejected": summary.rejected,
            "heldout_success": summary.heldout_success,
            **{f"signals.{k}": v for k, v in summary.signals.items()},
            **{f"update.{k}": v for k, v in outputs["update"].get("stats", {}).items() if isinstance(v, (int, float))},
        }
        info = tracker.log_round(
            run_name=f"{config.run_id}-round-{round_:03d}",
            params=flatten(config.model_dump(mode="json")),
            metrics=metrics,
            pool_path=pool_path,
            pool_digest=summary.pool_digest,
            checkpoint_dir=Path(summary.checkpoint),
            registered_model=config.tracking.registered_model,
            flow_run_id=flow_run_id,
            tags={"coevolve.run_id": config.run_id, "coevolve.round": str(round_), "checkpoint_digest": weights_digest},
        )
        summary.model_version = str(info["model_version"])
        best = tracker.update_best(config.tracking.registered_model)
        with open_warehouse(config) as wh:
            earlier = [s for s in wh.rounds(config.run_id) if s.round < round_]
        figure = learning_curve(earlier + [summary], config.run_dir() / "figures" / f"learning-curve-{round_:03d}.png")
        tracker.attach_artifact(info["mlflow_run_id"], figure)
        # Closing the round comes last: a crash before it re-runs this stage, and every call above is idempotent.
        with open_warehouse(config) as wh:
            wh.finish_round(config.run_id, round_, summary)
        get_run_logger().info("round %d: model version %s (best %s), pool digest %s", round_, summary.model_version, best, summary.pool_digest[:12])
        return {**summary.to_dict(), "mlflow_run_id": info["mlflow_run_id"], "checkpoint_digest": weights_digest, "best_version": best}

    return resumable(config, round_, "version", compute)
