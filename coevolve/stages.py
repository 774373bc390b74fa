"""The stage contract: what each placeable stage of a round takes and gives, as JSON-serializable models.

A stage runs inline (a Prefect task in the round's own process) or on a work pool (a run of the
``coevolve-stage`` deployment the configuration names, `flows/stage.py`); both take the same input
model and give the same output model, and the warehouse records the output (``stage_runs``) either
way, so a round resumes after its last finished stage whichever machine ran it.

Input fields carry the names of the stage task's parameters after ``config``, so a stage task is
called as ``task(config, **inputs.model_dump())``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Contract(BaseModel):
    # Outputs recorded by earlier versions may carry extra keys; they are kept, not refused.
    model_config = ConfigDict(extra="allow", frozen=True)


class RolloutInput(_Contract):
    round_: int
    checkpoint: str  # checkpoint ``round_``: a folder every worker sees, or a model id


class RolloutOutput(_Contract):
    trajectories: int
    tasks: int
    success_rate: float
    finish_reasons: dict[str, int]


class MineInput(_Contract):
    round_: int


class MineOutput(_Contract):
    signals: dict[str, int]  # kind -> signals mined this round
    selected: list[str]  # signal ids synthesis follows, in order


class SynthesizeInput(_Contract):
    round_: int
    selected: list[str]


class SynthesizeOutput(_Contract):
    candidates: list[dict[str, Any]]  # {"task": Task.to_dict(), "signal_id": str | None}
    contexts: dict[str, Any]  # signal id -> how its candidates were made


class ValidateInput(_Contract):
    round_: int
    candidates: list[dict[str, Any]]


class ValidateOutput(_Contract):
    accepted: int
    rejected: int
    pool_size: int  # of pool round_ + 1
    rejections: dict[str, int]


class UpdateInput(_Contract):
    round_: int
    checkpoint: str


class UpdateOutput(_Contract):
    checkpoint: str  # checkpoint ``round_ + 1``
    stats: dict[str, Any]
    trained_on: dict[str, Any]


class EvaluateInput(_Contract):
    round_: int
    checkpoint: str


class EvaluateOutput(_Contract):
    heldout_success: float
    heldout_tasks: int


# stage -> (input model, output model)
CONTRACTS: dict[str, tuple[type[_Contract], type[_Contract]]] = {
    "rollout": (RolloutInput, RolloutOutput),
    "mine": (MineInput, MineOutput),
    "synthesize": (SynthesizeInput, SynthesizeOutput),
    "validate": (ValidateInput, ValidateOutput),
    "update": (UpdateInput, UpdateOutput),
    "evaluate": (EvaluateInput, EvaluateOutput),
}
PLACEABLE_STAGES: tuple[str, ...] = tuple(CONTRACTS)
