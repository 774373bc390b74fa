"""The stages of a round and their contracts: what each takes and gives, as JSON-serializable models.

A stage is one recorded step of a round: prepare, rollout, mine, synthesize, validate, update,
evaluate, version, in that order (`STAGE_NAMES`). Each is a typed function declared once in its
module under ``tasks/`` (`tasks.registry.stage`); the registry of those functions must name exactly
the stages here, in this order (flows/stage.py builds it with `tasks.registry.stage_registry`, which
checks). The warehouse's stage records (``stage_runs``) hold each stage's output as the JSON of its
output model, and a round that runs again reads them back through the same models: outputs recorded
by earlier versions may carry keys the models no longer name, which are kept (``extra="allow"``).

Some stages may run on a work pool instead of the round's process (`PLACEABLE`, see flows/stage.py
and ``placement`` in the configuration); a placed stage takes the same input model and gives the
same output model. Input fields carry what the stage needs besides the configuration and the
warehouse session.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Contract(BaseModel):
    # Outputs recorded by earlier versions may carry extra keys; they are kept, not refused.
    model_config = ConfigDict(extra="allow", frozen=True)


class StageInput(Contract):
    """What every stage takes: the round it is a step of, and what that stage needs besides."""

    round_: int


class PrepareInput(StageInput):
    pass


class PrepareOutput(Contract):
    """Round 0 records the run's starting point; a later round only gets its checked checkpoint (not recorded)."""

    checkpoint: str  # checkpoint ``round_``, checked against its recorded digest
    checkpoint_digest: str | None = None
    pool_digest: str | None = None
    pool_size: int | None = None
    heldout: int | None = None
    baseline_heldout_success: float | None = None
    baseline_dev_success: float | None = None
    checkpoint0_scored_by: str | None = None
    final_heldout: int | None = None
    final_heldout_digest: str | None = None


class StepInput(StageInput):
    """A stage of one training step of a round: a round runs training.batches_per_round steps, 0 first."""

    step: int = 0


class RolloutInput(StepInput):
    checkpoint: str  # the policy the previous step produced (checkpoint ``round_`` at step 0): a folder or a model id


class RolloutOutput(Contract):
    trajectories: int
    tasks: int
    success_rate: float
    finish_reasons: dict[str, int]


class MineInput(StageInput):
    pass


class MineOutput(Contract):
    signals: dict[str, int]  # kind -> signals mined this round
    selected: list[str]  # signal ids synthesis follows, in order


class SynthesizeInput(StageInput):
    selected: list[str]


class SynthesizeOutput(Contract):
    candidates: list[dict[str, Any]]  # {"task": Task.to_dict(), "signal_id": str | None}
    contexts: dict[str, Any]  # signal id -> how its candidates were made


class ValidateInput(StageInput):
    candidates: list[dict[str, Any]]


class ValidateOutput(Contract):
    accepted: int
    rejected: int
    pool_size: int  # of pool round_ + 1
    rejections: dict[str, int]


class UpdateInput(StepInput):
    checkpoint: str  # the policy step ``step``'s batch was played with


class UpdateOutput(Contract):
    checkpoint: (
        str  # the step's trained policy (`PipelineConfig.checkpoint_after`): checkpoint ``round_ + 1`` at the last step
    )
    stats: dict[str, Any]
    trained_on: dict[str, Any]


class EvaluateInput(StageInput):
    checkpoint: str


class EvaluateOutput(Contract):
    heldout_success: float
    heldout_tasks: int
    # Set only when the round scored the dev split (rollout.dev_eval_tasks > 0).
    dev_success: float | None = None
    dev_tasks: int | None = None


class VersionInput(StageInput):
    """The outputs of the round's earlier stages that its summary and lineage are made from."""

    model_config = ConfigDict(populate_by_name=True)

    rollout: RolloutOutput
    mine: MineOutput
    validate_: ValidateOutput = Field(alias="validate")  # ``validate`` is a BaseModel method
    update: UpdateOutput
    evaluate: EvaluateOutput


class VersionOutput(Contract):
    """The round's summary (coevolve.records.RoundSummary's fields) and what the version stage registered."""

    checkpoint: str
    checkpoint_digest: str | None = None
    pool_digest: str | None = None
    model_version: str | None = None
    mlflow_run_id: str | None = None
    best_version: Any = None


# stage -> (input model, output model), in the order a round runs them.
CONTRACTS: dict[str, tuple[type[StageInput], type[Contract]]] = {
    "prepare": (PrepareInput, PrepareOutput),
    "rollout": (RolloutInput, RolloutOutput),
    "mine": (MineInput, MineOutput),
    "synthesize": (SynthesizeInput, SynthesizeOutput),
    "validate": (ValidateInput, ValidateOutput),
    "update": (UpdateInput, UpdateOutput),
    "evaluate": (EvaluateInput, EvaluateOutput),
    "version": (VersionInput, VersionOutput),
}
STAGE_NAMES: tuple[str, ...] = tuple(CONTRACTS)
# The stages ``placement`` may put on a work pool; prepare and version always run in the round's process.
PLACEABLE: tuple[str, ...] = ("rollout", "mine", "synthesize", "validate", "update", "evaluate")
# The stages a round may forget and run again, in the order it clears them (Warehouse.clear_round):
# prepare records the run's starting point, which no round clears.
CLEARING_ORDER: tuple[str, ...] = STAGE_NAMES[1:]
