"""One co-evolution round as a Prefect flow: rollout, mine, synthesize, validate, update, evaluate, version.

Run one round: ``coevolve round --round 0`` (or ``prefect deployment run coevolve-round/per-round``).
Each stage is a retryable Prefect task that records its output in the warehouse, so running a
failed round again resumes after the last finished stage. The round record says "running" (with the
settings that decide its results) from its start until the version stage is recorded, then
"finished": every commit comes after the one it depends on, so a crash anywhere resumes.
``placement`` in the configuration puts rollout, mine, synthesize, validate, update and evaluate
inline or on a work pool (flows/stage.py); their inputs and outputs are the typed models of
coevolve/stages.py either way.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from coevolve.config import PipelineConfig
from coevolve.settings import apply_settings
from coevolve.stages import (
    EvaluateInput,
    MineInput,
    PrepareInput,
    RolloutInput,
    SynthesizeInput,
    UpdateInput,
    ValidateInput,
    VersionInput,
)
from flows.stage import run_slot, run_stage
from tasks.common import open_warehouse, round_lock
from tasks.version import finish_round, round_settings


@flow(name="coevolve-round", flow_run_name="round-{round_}")
def coevolve_round(round_: int = 0, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run round ``round_`` of the run described by ``config`` (a PipelineConfig as a dict)."""
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI
    with run_slot(cfg, round_), round_lock(cfg, round_):
        # Running from here (started_at kept when the round resumes); a resume with other settings stops here.
        # A round whose previous one has not finished gets no record: prepare refuses it, naming that round.
        with open_warehouse(cfg) as wh:
            if round_ == 0 or wh.stage_output(cfg.run_id, round_ - 1, "version") is not None:
                wh.start_round(cfg.run_id, round_, str(flow_run.get_id() or ""), round_settings(cfg))
        prepared = run_stage(cfg, PrepareInput(round_=round_))
        rollout = run_stage(cfg, RolloutInput(round_=round_, checkpoint=prepared.checkpoint))
        mined = run_stage(cfg, MineInput(round_=round_))
        synthesized = run_stage(cfg, SynthesizeInput(round_=round_, selected=mined.selected))
        validated = run_stage(cfg, ValidateInput(round_=round_, candidates=synthesized.candidates))
        updated = run_stage(cfg, UpdateInput(round_=round_, checkpoint=prepared.checkpoint))
        evaluated = run_stage(cfg, EvaluateInput(round_=round_, checkpoint=updated.checkpoint))
        versioned = run_stage(
            cfg,
            VersionInput(
                round_=round_, rollout=rollout, mine=mined, validate_=validated, update=updated, evaluate=evaluated
            ),
        )
        # After the version stage's record: a crash in between re-runs this step only (see finish_round).
        finish_round(cfg, round_, versioned)
    return {**versioned.model_dump(mode="json"), "baseline_heldout_success": prepared.baseline_heldout_success}
