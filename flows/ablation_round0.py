"""An ablation's shared round 0: every later arm of a seed copies the first arm's rollout, update and evaluation.

Every arm of a seed reads the same checkpoint 0, D_0, splits and loop seed in round 0's rollout, update
and evaluation, never the settings arms change (``ARM_SECTIONS``); ``round0_key`` digests what they do
read, and ``copy_round0`` copies the rows, checkpoint 1 and stage records when the keys match
(flows/ablation.py runs the arms).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect.runtime import flow_run

from agent.checkpoints import checkpoint_digest, save_atomically
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.records import digest
from coevolve.run_settings import round_settings
from storage.pool import pool_digest
from tasks.common import open_warehouse
from tasks.rollout import round_statistics
from tasks.splits import DEV_ROUND, DEV_SPLIT, HELDOUT_ROUND, HELDOUT_SPLIT
from tasks.training.grpo_groups import trained_on

if TYPE_CHECKING:
    from storage.warehouse import Warehouse


# Sections only mining, synthesis and validation read (ARMS overrides two of them): round 0's rollout,
# update and evaluation never do, so runs that differ only here share them.
ARM_SECTIONS: tuple[str, ...] = ("signals", "synthesis", "validation")
# Round 0's stages whose results every arm of a seed shares, in the order they are copied and committed.
SHARED_ROUND0_STAGES: tuple[str, ...] = ("rollout", "update", "evaluate")


def round0_key(config: PipelineConfig) -> str | None:
    """Digest of what decides round 0's rollout, update and evaluation of a run.

    None before its prepare stage is recorded.

    Every setting except the run id and ARM_SECTIONS, with checkpoint 0's and D_0's recorded digests
    and the held-out and dev splits' digests: two runs with the same key compute the same round 0 there.
    """
    settings = config.model_dump(
        mode="json",
        exclude={"run_id": True, "rollout": {"checkpoint0_scores_from": True}, **dict.fromkeys(ARM_SECTIONS, True)},
    )
    with open_warehouse(config) as wh:
        prepared = wh.stage_output(config.run_id, 0, "prepare")
        if prepared is None:
            return None
        splits = {
            name: pool_digest(wh.pool(config.run_id, r)) for name, r in (("heldout", HELDOUT_ROUND), ("dev", DEV_ROUND))
        }
    return digest(
        {"settings": settings, "checkpoint0": prepared["checkpoint_digest"], "pool0": prepared["pool_digest"], **splits}
    )


def _copy_checkpoint(source: str, target: str, expected: str) -> None:
    """Copy a checkpoint folder and publish it whole at ``target``.

    DataError if the copy's digest is not ``expected``.
    """

    def copy_verified(staging: Path) -> None:
        shutil.copytree(source, staging)
        if checkpoint_digest(staging) != expected:
            shutil.rmtree(staging, ignore_errors=True)
            raise DataError(
                f"Checkpoint {source} no longer matches its recorded digest {expected[:16]}; re-run round 0 of its run."
            )

    save_atomically(Path(target), copy_verified)


def copy_round0(source: PipelineConfig, target: PipelineConfig) -> str | None:
    """Give ``target`` round 0's rollout, update and evaluation of ``source`` (another arm, same seed).

    Returns the source's run id, or None.

    The rollout's copy includes round 0's task statistics (``task_difficulty``), computed for the target.
    Copies only when the source's round 0 finished and both runs have the same ``round0_key``; None
    (nothing copied, the round computes them) otherwise, or when ``target`` already computed its own
    rollout. Each stage's rows are written first and its stage record last, the record being the
    stage's commit: an interrupted copy leaves the stage unrecorded and is redone (rows replaced by
    key or file name) the next time. Trajectories and evaluation rows are stored under the target's
    run id, so mining and every query read them as the target's own.

    Rounds of several training steps (``training.batches_per_round`` > 1) are not copied: the copy
    holds one step's records and checkpoint, so each arm computes such a round 0 itself.
    """
    if target.training.batches_per_round > 1:
        return None
    with open_warehouse(target) as wh:
        done = {stage: wh.stage_output(target.run_id, 0, stage) for stage in SHARED_ROUND0_STAGES}
        finished = wh.round_status(source.run_id, 0) == "finished"
    if any(out is not None and "copied_from" not in out for out in done.values()):
        return None  # this run computed (part of) its own round 0; the round finishes it
    rollout = done["rollout"]
    if rollout is not None and all(out is not None for out in done.values()):
        return str(rollout["copied_from"])
    key = round0_key(target)
    if not finished or key is None or key != round0_key(source):
        return None
    with open_warehouse(target) as wh:
        # Running with its settings first, like every round (Warehouse.start_round), then each stage's rows and record.
        source_out = _stage_outputs(wh, source.run_id, (*SHARED_ROUND0_STAGES, "version"))
        wh.start_round(target.run_id, 0, str(flow_run.get_id() or ""), round_settings(target))
        lineage = {"copied_from": source.run_id, "round0_key": key}
        if done["rollout"] is None:
            wh.clear_round(target.run_id, 0, "rollout")  # a copy or rollout stopped midway leaves no rows of its own
            # The statistics the rollout drew from: the same rows as the source's (same pool and pool settings),
            # stored under the target, so its round-0 calibration is measured like the source's.
            round_statistics(target, wh, 0)
            episodes = [dataclasses.replace(t, run_id=target.run_id) for t in wh.trajectories(source.run_id, 0)]
            wh.write_trajectories(episodes)
            wh.mark_stage(target.run_id, 0, "rollout", {**source_out["rollout"], **lineage})
        if done["update"] is None:
            checkpoint = str(target.checkpoint_dir(1))
            _copy_checkpoint(source_out["update"]["checkpoint"], checkpoint, source_out["version"]["checkpoint_digest"])
            groups = trained_on(wh.trajectories(target.run_id, 0), target.rollout.group_size)
            update_out = {
                **source_out["update"],
                "checkpoint": checkpoint,
                "trained_on": {**groups, "copied_from": source.run_id},
                **lineage,
            }
            wh.mark_stage(target.run_id, 0, "update", update_out)
        if done["evaluate"] is None:
            for split in (HELDOUT_SPLIT, DEV_SPLIT):
                rows = [
                    (task_id, success, reward, _own_id(trajectory_id, source.run_id, target.run_id))
                    for task_id, success, reward, trajectory_id in wh.evaluation_rows(source.run_id, 0, split)
                ]
                wh.write_evaluations(target.run_id, 0, split, rows)
            wh.mark_stage(target.run_id, 0, "evaluate", {**source_out["evaluate"], **lineage})
    return source.run_id


def _stage_outputs(wh: Warehouse, run_id: str, stages: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The round-0 outputs of ``stages`` of a run whose round 0 finished; DataError if one is not recorded."""
    outputs: dict[str, dict[str, Any]] = {}
    for stage in stages:
        output = wh.stage_output(run_id, 0, stage)
        if output is None:
            raise DataError(
                f"Run {run_id!r} finished round 0 without a record of its {stage} stage; re-run that run's round 0."
            )
        outputs[stage] = output
    return outputs


def _own_id(trajectory_id: str, source: str, target: str) -> str:
    """An episode id of ``source`` as ``target`` would have named the same episode (ids start with the run id)."""
    return target + trajectory_id[len(source) :] if trajectory_id.startswith(f"{source}/") else trajectory_id
