"""Versioning stage: freeze pool r+1, register checkpoint r+1, and link both to the flow run.

The pool snapshot is an immutable Parquet file with a content digest. MLflow gets one run per
round holding the params, the metrics, pool r it trained from and pool r+1 it produced (dataset
inputs and artifacts) and the checkpoint, registered as a version of the run's own model whose
tags carry its lineage: both pool digests, the parent version and checkpoint digest, the Prefect
flow run and the trajectories it was trained on (storage/tracking.py). The warehouse's ``rounds``
row records the produced pool and the version for SQL users.

The stage also records the checkpoint's digest (the next round checks it before loading the
checkpoint), points the registry alias "best" at the version with the highest held-out success so
far, and logs the run's learning curve (PNG) to the round's MLflow run.

The summary carries the round's mechanism measurements (storage/mechanism.py): the informative GRPO
group share, the episodes and groups played and episodes per informative group, the held-out
tool-pattern coverage of pool r, accepted candidates by kind, the curriculum's calibration and pool
difficulty histogram, the update's optimizer steps, and dev success when the evaluate stage scored the
dev split; they are logged as metrics too (``mechanism_metrics``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger
from prefect.runtime import flow_run

from agent.checkpoints import TRAINER_STATE_SUBDIR, checkpoint_digest
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.optional import optional_module
from coevolve.records import RoundSummary
from coevolve.run_settings import flatten
from coevolve.signals import SIGNAL_KINDS
from coevolve.stages import VersionInput, VersionOutput
from tasks.common import open_warehouse
from tasks.registry import stage

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

torch = optional_module("torch")
# MLflow, matplotlib and the warehouse's data libraries take seconds to import; only the version stage needs them.
if TYPE_CHECKING:
    import storage.mechanism as mechanism
    import storage.pool as storage_pool
    import storage.tracking as tracking
    import tasks.ablation.plots as plots
else:
    tracking = optional_module("storage.tracking")
    plots = optional_module("tasks.ablation.plots")
    mechanism = optional_module("storage.mechanism")
    storage_pool = optional_module("storage.pool")


def build_summary(
    config: PipelineConfig,
    outputs: VersionInput,
    flow_run_id: str,
    mechanism: dict[str, Any] | None = None,
) -> RoundSummary:
    """The round's summary from its stages' outputs and its mechanism measurements.

    The measurements come from storage/mechanism.round_mechanism.
    """
    rollout, mined, validated = outputs.rollout, outputs.mine, outputs.validate_
    mechanism = mechanism or {}
    dev = outputs.evaluate.dev_success
    return RoundSummary(
        run_id=config.run_id,
        round=outputs.round_,
        pool_size=int(validated.pool_size),
        rollouts=int(rollout.trajectories),
        success_rate=float(rollout.success_rate),
        signals=dict(mined.signals),
        accepted=int(validated.accepted),
        rejected=int(validated.rejected),
        heldout_success=float(outputs.evaluate.heldout_success),
        checkpoint=str(outputs.update.checkpoint),
        flow_run_id=flow_run_id,
        informative_groups=_measured(mechanism.get("informative_groups")),
        heldout_coverage=_measured(mechanism.get("heldout_coverage")),
        accepted_by_kind={str(k): int(v) for k, v in (mechanism.get("accepted_by_kind") or {}).items()},
        dev_success=None if dev is None else float(dev),
        episodes_played=_count(mechanism.get("episodes_played")),
        groups_played=_count(mechanism.get("groups_played")),
        episodes_per_informative_group=_measured(mechanism.get("episodes_per_informative_group")),
        optimizer_steps=_count(outputs.update.stats.get("steps")),
        calibration=_measured(mechanism.get("calibration")),
        difficulty_histogram={str(k): int(v) for k, v in (mechanism.get("difficulty_histogram") or {}).items()},
    )


def _measured(value: Any) -> float | None:
    """A measurement as a float, None when there was nothing to measure (nan or missing)."""
    return None if value is None or math.isnan(float(value)) else float(value)


def _count(value: Any) -> int | None:
    """A count as an int, None when it was not recorded."""
    return None if value is None else int(value)


# The summary's mechanism fields logged as ``mechanism.<name>`` when measured.
MECHANISM_FIELDS: tuple[str, ...] = (
    "informative_groups", "heldout_coverage", "episodes_played", "groups_played", "episodes_per_informative_group",
    "optimizer_steps", "calibration",
)  # fmt: skip


def mechanism_metrics(summary: RoundSummary) -> dict[str, float]:
    """The round's mechanism measurements as MLflow metrics; nan and unscored ones are left out.

    ``mechanism.<name>`` for MECHANISM_FIELDS, ``mechanism.difficulty.<bin>`` for each bin of the pool's
    difficulty histogram, ``accepted.<kind>`` for every kind (forgetting, boundary, rare, random; 0 when
    none was accepted) and ``dev_success``.
    """
    metrics: dict[str, float] = {}
    for name in MECHANISM_FIELDS:
        value = getattr(summary, name)
        if value is not None and not math.isnan(value):
            metrics[f"mechanism.{name}"] = float(value)
    for bin_, count in summary.difficulty_histogram.items():
        metrics[f"mechanism.difficulty.{bin_}"] = float(count)
    for kind in sorted({*SIGNAL_KINDS, "random", *summary.accepted_by_kind}):
        metrics[f"accepted.{kind}"] = float(summary.accepted_by_kind.get(kind, 0))
    if summary.dev_success is not None and not math.isnan(summary.dev_success):
        metrics["dev_success"] = float(summary.dev_success)
    return metrics


def optimizer_step_metrics(update_stats: dict[str, Any]) -> list[tuple[str, float, int]]:
    """``(name, value, global_step)`` of every optimizer step the round's update recorded (its training steps'
    ``optimizer_steps_log``, tasks/training/step_metrics.py), named ``train/<key>``: MLflow charts each against the
    run's global step, across rounds."""
    steps = update_stats.get("per_step") or [update_stats]
    return [
        (f"train/{key}", float(value), int(row["global_step"]))
        for stats in steps
        for row in stats.get("optimizer_steps_log") or []
        for key, value in row.items()
        if key != "global_step"
    ]


# What a stage's record says it cost (tasks/stage_cost.py) that is logged as a metric.
COST_METRICS: tuple[str, ...] = (
    "seconds", "tokens_generated", "tokens_per_s", "episodes", "optimizer_steps", "peak_rss_mib", "peak_gpu_mib",
)  # fmt: skip


def stage_cost_metrics(costs: dict[str, dict[str, Any]]) -> list[tuple[str, float, int]]:
    """``(cost.<stage>.<figure>, value, training step)`` of the round's recorded stages: a training step's rollout
    and update at that step (``rollout@2`` at step 2), the other stages at step 0."""
    metrics = []
    for record, cost in sorted(costs.items()):
        stage, _, step = record.partition("@")
        for figure in COST_METRICS:
            value = cost.get(figure)
            if isinstance(value, (int, float)):
                metrics.append((f"cost.{stage}.{figure}", float(value), int(step or 0)))
    return metrics


def machine_params() -> dict[str, str]:
    """What the numbers depend on besides the configuration: torch, its CPU kernels and the pins set."""
    return {
        "machine.torch": torch.version.__version__,  # the lazy module answers no dunder names
        "machine.cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine.cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        **{f"machine.{k}": os.environ.get(k, "") for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")},
    }


def parent_record(warehouse: Any, run_id: str, round_: int) -> dict[str, str]:
    """What checkpoint r+1 descends from: checkpoint r and pool r, as the earlier stages recorded them.

    Round 0's parent is checkpoint 0 and D_0 (the prepare stage's record); round r's is round r-1's
    version. DataError when that record is missing or lacks a digest: lineage is never guessed.
    """
    if round_ == 0:
        record, stage = warehouse.stage_output(run_id, 0, "prepare"), "prepare stage of round 0"
    else:
        record, stage = warehouse.stage_output(run_id, round_ - 1, "version"), f"version stage of round {round_ - 1}"
    if record is None or not record.get("checkpoint_digest") or not record.get("pool_digest"):
        raise DataError(
            f"The {stage} of run {run_id!r} recorded no checkpoint and pool digests; "
            f"lineage of round {round_} cannot be written."
        )
    return {
        "version": str(record.get("model_version") or "") if round_ > 0 else "",
        "checkpoint": str(record["checkpoint"]),
        "checkpoint_digest": str(record["checkpoint_digest"]),
        "pool_digest": str(record["pool_digest"]),
    }


def lineage_tags(
    run_id: str, round_: int, checkpoint_digest: str, parent: dict[str, str], trained_on: dict[str, Any]
) -> dict[str, str]:
    """The tags naming what a round's checkpoint was made from (storage.tracking.LINEAGE_TAGS)."""
    return {
        "coevolve.run_id": run_id,
        "coevolve.round": str(round_),
        "checkpoint_digest": checkpoint_digest,
        "parent_version": parent["version"],
        "parent_checkpoint": parent["checkpoint"],
        "parent_checkpoint_digest": parent["checkpoint_digest"],
        **{f"trajectories.{k}": "" if v is None else str(v) for k, v in trained_on.items()},
    }


# --- Prefect task -------------------------------------------------------------------------------


@stage("version", retries=2, retry_delay_seconds=5)
def version_stage(config: PipelineConfig, wh: Warehouse, inputs: VersionInput) -> VersionOutput:
    """Snapshot pool r+1, log the round to MLflow, and close the round in the warehouse."""
    round_, updated = inputs.round_, inputs.update
    flow_run_id = str(flow_run.get_id() or "")
    summary = build_summary(
        config, inputs, flow_run_id, mechanism.round_mechanism(wh, config.run_id, round_, config.rollout.group_size)
    )
    pool = wh.pool(config.run_id, round_ + 1)
    pool_path = config.pool_path(round_ + 1)
    summary.pool_digest = storage_pool.write_pool_snapshot(pool, pool_path)
    weights_digest = checkpoint_digest(summary.checkpoint)
    parent = parent_record(wh, config.run_id, round_)
    tracker = tracking.Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    # The parent's version as this store knows it: "" when it was registered in a store since moved aside, so the
    # new version's lineage ends at its parent checkpoint instead of naming a version the store does not hold.
    parent["version"] = tracker.registered_parent(
        config.registered_model_name, parent["version"], parent["checkpoint_digest"]
    )
    metrics = {
        "pool_size": summary.pool_size,
        "rollouts": summary.rollouts,
        "success_rate": summary.success_rate,
        "accepted": summary.accepted,
        "rejected": summary.rejected,
        "heldout_success": summary.heldout_success,
        **{f"signals.{k}": v for k, v in summary.signals.items()},
        **mechanism_metrics(summary),
        **{f"update.{k}": v for k, v in updated.stats.items() if isinstance(v, (int, float))},
    }
    info = tracker.log_round(
        run_name=f"{config.run_id}-round-{round_:03d}",
        params={**flatten(config.model_dump(mode="json")), **machine_params()},
        metrics=metrics,
        pool_path=pool_path,
        pool_digest=summary.pool_digest,
        checkpoint_dir=Path(summary.checkpoint),
        registered_model=config.registered_model_name,
        flow_run_id=flow_run_id,
        tags=lineage_tags(config.run_id, round_, weights_digest, parent, updated.trained_on),
        training_pool_path=config.pool_path(round_),
        training_pool_digest=parent["pool_digest"],
        # 'uri': the version points at the checkpoint on shared storage instead of a copy in artifacts.
        checkpoint_exclude=(TRAINER_STATE_SUBDIR,),
        checkpoint_uri=Path(summary.checkpoint).resolve().as_uri()
        if config.tracking.register_checkpoints == "uri"
        else None,
        step_metrics=optimizer_step_metrics(updated.stats) + stage_cost_metrics(wh.stage_costs(config.run_id, round_)),
    )
    summary.model_version = str(info["model_version"])
    best = tracker.update_best(config.registered_model_name)
    earlier = [s for s in wh.rounds(config.run_id) if s.round < round_]
    figure = plots.learning_curve(
        earlier + [summary], config.run_dir() / "figures" / f"learning-curve-{round_:03d}.png"
    )
    tracker.attach_artifact(info["mlflow_run_id"], figure)
    get_run_logger().info(
        "round %d: model version %s (best %s), pool digest %s",
        round_,
        summary.model_version,
        best,
        summary.pool_digest[:12],
    )
    return VersionOutput(
        **summary.to_dict(), mlflow_run_id=info["mlflow_run_id"], checkpoint_digest=weights_digest, best_version=best
    )


def finish_round(config: PipelineConfig, round_: int, output: VersionOutput) -> None:
    """Mark the round finished from the version stage's recorded output: the round's last commit.

    It follows the version stage's record, so a crash between the two leaves a round that is not
    finished and whose stages are all recorded; running it again (or `coevolve evolve`) only writes this.
    """
    fields = {f.name for f in dataclasses.fields(RoundSummary)}
    summary = RoundSummary(**{k: v for k, v in output.model_dump(mode="json").items() if k in fields})
    with open_warehouse(config) as wh:
        wh.finish_round(config.run_id, round_, summary)
