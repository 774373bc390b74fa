"""One co-evolution round as a Prefect flow: rollout, mine, synthesize, validate, update, evaluate, version.

Run one round: ``coevolve round --round 0`` (or ``prefect deployment run coevolve-round/per-round``).
Each stage is a retryable Prefect task that records its output in the warehouse, so running a
failed round again resumes after the last finished stage.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from coevolve.config import PipelineConfig
from tasks.common import round_lock
from tasks.evaluate import evaluate_task
from tasks.mine import mine_task
from tasks.prepare import prepare_task
from tasks.rollout import rollout_task
from tasks.synthesize import synthesize_task
from tasks.update import update_task
from tasks.validate import validate_task
from tasks.version import version_task


@flow(name="coevolve-round", flow_run_name="round-{round_}")
def coevolve_round(round_: int = 0, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run round ``round_`` of the run described by ``config`` (a PipelineConfig as a dict)."""
    cfg = PipelineConfig.model_validate(config or {})
    with round_lock(cfg, round_):
        prepared = prepare_task(cfg, round_)
        rollout = rollout_task(cfg, round_, prepared["checkpoint"])
        mined = mine_task(cfg, round_)
        candidates = synthesize_task(cfg, round_, mined["selected"])
        validated = validate_task(cfg, round_, candidates)
        updated = update_task(cfg, round_, prepared["checkpoint"])
        evaluated = evaluate_task(cfg, round_, updated["checkpoint"])
        outputs = {"rollout": rollout, "mine": mined, "validate": validated, "update": updated, "evaluate": evaluated}
        summary = version_task(cfg, round_, outputs)
    return {**summary, "baseline_heldout_success": prepared.get("baseline_heldout_success")}
