"""The checkpoint and pool a round starts from, checked against their recorded digests.

The prepare stage runs these checks, and the commands run them before Prefect starts (flows/preflight.py), so
this module imports no Prefect.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.checkpoints import verify_checkpoint
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.optional import optional_module

# Pool snapshots are Parquet files written with polars: loaded when a pool is checked.
if TYPE_CHECKING:
    import storage.pool as storage_pool
else:
    storage_pool = optional_module("storage.pool")

if TYPE_CHECKING:
    from storage.warehouse import Warehouse


def mlflow_copy(config: PipelineConfig, versioned: dict[str, Any], relative: str) -> Path | None:
    """The file or folder ``relative`` among the artifacts of the MLflow run a version record names (round r-1's
    run holds checkpoint r under checkpoint/ and pool r under pool/), when it is on this machine; else None."""
    run = versioned.get("mlflow_run_id")
    if not run or config.tracking.mlflow_uri is not None:  # another store keeps its artifacts where it was told
        return None
    path = config.artifacts_dir / str(run) / "artifacts" / relative
    return path if path.exists() else None


def _restore_advice(config: PipelineConfig, versioned: dict[str, Any], relative: str, target: Path) -> str:
    """How to bring round r's input back from the MLflow copy its round r-1 registered."""
    copy = mlflow_copy(config, versioned, relative)
    version = versioned.get("model_version") or "current"
    if copy is not None and copy.is_dir():
        return f"Restore it from MLflow's copy (model version {version}): cp -r {copy}/. {target}/"
    if copy is not None:
        return f"Restore it from MLflow's copy (model version {version}): cp {copy} {target}"
    return (
        f"`coevolve lineage {version}` prints where MLflow keeps its copy (checkpoint copy, run artifacts' "
        f"{relative.split('/')[0]}/); copy it back to {target}."
    )


def verify_pool(
    config: PipelineConfig, wh: Warehouse, round_: int, expected: str | None, restore: str | None = None
) -> None:
    """Pool ``round_``'s snapshot file and the warehouse's membership must both match the recorded digest.

    ``restore``: how to bring back a snapshot that cannot be read or no longer matches (its MLflow copy)."""
    path = config.pool_path(round_)
    if not expected:
        raise DataError(
            f"Pool {round_} of run {config.run_id!r} ({path}) has no recorded digest, so it cannot be verified."
        )
    try:
        storage_pool.read_pool_snapshot(path, expected_digest=expected)
    except DataError as exc:
        if restore is None:
            raise
        raise DataError(f"{exc} {restore}") from None
    actual = storage_pool.pool_digest(wh.pool(config.run_id, round_))
    if actual != expected:
        raise DataError(
            f"Pool {round_} of run {config.run_id!r} in the warehouse {config.warehouse_path} has digest "
            f"{actual[:16]}, but its snapshot {path} was recorded as {expected[:16]}: "
            "the warehouse's pool membership or tasks changed after it was recorded."
        )


def verify_round_inputs(config: PipelineConfig, wh: Warehouse, round_: int) -> str:
    """The checkpoint and pool round ``round_`` starts from, checked against their recorded digests.

    Round 0 starts from checkpoint 0 and D_0 (digests recorded by the prepare stage); round r > 0 from
    what round r-1's version stage recorded (its last training step's checkpoint). Returns the
    checkpoint. Raises DataError naming the file when the previous round did not finish, or when a
    checkpoint or pool is missing, has no recorded digest, or no longer matches it.
    """
    if round_ == 0:
        prepared = wh.stage_output(config.run_id, 0, "prepare")
        updated = versioned = prepared
    else:
        # The version record names checkpoint r: the one round r-1's last training step wrote.
        versioned = wh.stage_output(config.run_id, round_ - 1, "version")
        updated = versioned
    if updated is None or versioned is None:
        missing = "prepare stage of round 0" if round_ == 0 else f"round {round_ - 1}"
        raise DataError(f"The {missing} of run {config.run_id!r} has not finished; run it before round {round_}.")
    checkpoint = str(updated["checkpoint"])
    what = f"Checkpoint {round_} of run {config.run_id!r}"
    # Round r's inputs are round r-1's outputs, which its version stage registered in MLflow with copies; round 0's
    # (checkpoint 0, D_0) are the prepare stage's, with none.
    restore_checkpoint = restore_pool = None
    if round_ > 0:
        restore_checkpoint = _restore_advice(config, versioned, "checkpoint", Path(checkpoint))
        pool_file = config.pool_path(round_)
        restore_pool = _restore_advice(config, versioned, f"pool/{pool_file.name}", pool_file)
    verify_checkpoint(
        checkpoint, versioned.get("checkpoint_digest"), what, local_only=round_ > 0, restore=restore_checkpoint
    )
    verify_pool(config, wh, round_, versioned.get("pool_digest"), restore=restore_pool)
    return checkpoint
