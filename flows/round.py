"""One co-evolution round as a Prefect flow: F training steps (rollout, update), then mine, synthesize, validate,
evaluate, version.

A round runs ``training.batches_per_round`` (F) training steps: step k draws a fresh batch from the
round's pool, plays it with the policy step k-1 produced (checkpoint ``round_`` at step 0) and trains
on it, so every step is on fresh rollouts of the current policy, and the optimizer state carries from
step to step (``training.carry_optimizer``). After the F steps the signals are mined from all of the
round's trajectories, and synthesis and validation make pool ``round_ + 1``; the last step's policy
is checkpoint ``round_ + 1``, which evaluation scores and the version stage registers.

Run one round: ``coevolve round --round 0`` (or ``prefect deployment run coevolve-round/per-round``).
Each stage is a retryable Prefect task that records its output in the warehouse, so running a
failed round again resumes after the last finished stage. The round record says "running" (with the
settings that decide its results) from its start until the version stage is recorded, then
"finished": every commit comes after the one it depends on, so a crash anywhere resumes. A finished round
is never opened again: asked for again, the flow returns what it recorded (tasks/prepare.finished_round_result).
``placement`` in the configuration puts rollout, update, mine, synthesize, validate and evaluate
inline or on a work pool (flows/stage.py); their inputs and outputs are the typed models of
coevolve/stages.py either way.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from coevolve.config import PipelineConfig
from coevolve.run_settings import round_settings
from coevolve.settings import apply_settings
from coevolve.stages import (
    EvaluateInput,
    MineInput,
    PrepareInput,
    RolloutInput,
    RolloutOutput,
    SynthesizeInput,
    UpdateInput,
    UpdateOutput,
    ValidateInput,
    VersionInput,
)
from flows.stage import run_slot, run_stage
from storage.relocation import follow_moved_records
from storage.state_version import check_state
from storage.store_check import check_round_stores
from tasks.common import open_warehouse, round_lock
from tasks.prepare import finished_round_result
from tasks.update import release_step_checkpoint
from tasks.version import finish_round


def round_imports(cfg: PipelineConfig) -> list[str]:
    """The heavy libraries a round imports in its own process, for a command to import while its Prefect API starts
    (coevolve.optional.preload): MLflow and its SQL store, which the round checks first (a server's store is reached
    over HTTP); torch, which the version stage uses; and transformers' auto classes, which load the policy when
    rollout or evaluate runs inline. Anything else is imported on first use."""
    names = ["mlflow", "torch"]
    if cfg.mlflow_tracking_uri.startswith("sqlite:"):
        names.append("mlflow.store.tracking.sqlalchemy_store")
    if "inline" in (cfg.placement.rollout, cfg.placement.evaluate):
        names.append("transformers.models.auto.modeling_auto")
    return names


@flow(name="coevolve-round", flow_run_name="round-{round_}")
def coevolve_round(round_: int = 0, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run round ``round_`` of the run described by ``config`` (a PipelineConfig as a dict)."""
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI
    check_state(cfg)  # a state folder of another schedule or record version: refused before anything is written
    if (recorded := finished_round_result(cfg, round_)) is not None:
        # A finished round is never opened again: its records are its result. Said in the flow run's log, where a
        # deployment run's worker and UI show it, since the run ends Completed either way.
        get_run_logger().info(
            f"round {round_} of run {cfg.run_id!r} was already finished; nothing was run, its recorded results are "
            f"returned (coevolve status --set state_dir={cfg.state_dir} shows them)"
        )
        return recorded
    with run_slot(cfg, round_), round_lock(cfg, round_):
        # Running from here (started_at kept when the round resumes); a resume with other settings stops here.
        # A round whose previous one has not finished gets no record: prepare refuses it, naming that round.
        with open_warehouse(cfg) as wh:
            # Every store the round writes or reads back, checked now: a damaged one is found before hours of compute.
            check_round_stores(cfg, wh)
            # A state folder copied or restored elsewhere: its records name its own files before anything reads them.
            follow_moved_records(wh.catalog, cfg.state_dir)
            if round_ == 0 or wh.stage_output(cfg.run_id, round_ - 1, "version") is not None:
                wh.start_round(cfg.run_id, round_, str(flow_run.get_id() or ""), round_settings(cfg))
        prepared = run_stage(cfg, PrepareInput(round_=round_))
        checkpoint = prepared.checkpoint
        rollouts: list[RolloutOutput] = []
        updates: list[UpdateOutput] = []
        for step in range(cfg.training.batches_per_round):
            rollouts.append(run_stage(cfg, RolloutInput(round_=round_, step=step, checkpoint=checkpoint)))
            updates.append(
                run_stage(
                    cfg,
                    UpdateInput(round_=round_, step=step, checkpoint=checkpoint, tasks=rollouts[-1].train_tasks),
                )
            )
            if step > 0:
                release_step_checkpoint(cfg, round_, step - 1)  # step - 1's folder: read by nothing from here on
            checkpoint = updates[-1].checkpoint
        rollout, updated = RolloutOutput.of_steps(rollouts), UpdateOutput.of_steps(updates)
        mined = run_stage(cfg, MineInput(round_=round_))
        synthesized = run_stage(cfg, SynthesizeInput(round_=round_, selected=mined.selected))
        validated = run_stage(cfg, ValidateInput(round_=round_, candidates=synthesized.candidates))
        evaluated = run_stage(cfg, EvaluateInput(round_=round_, checkpoint=checkpoint))
        versioned = run_stage(
            cfg,
            VersionInput(
                round_=round_, rollout=rollout, mine=mined, validate_=validated, update=updated, evaluate=evaluated
            ),
        )
        # After the version stage's record: a crash in between re-runs this step only (see finish_round).
        finish_round(cfg, round_, versioned)
    return {**versioned.model_dump(mode="json"), "baseline_heldout_success": prepared.baseline_heldout_success}
