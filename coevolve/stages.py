"""The stages of a round and their contracts: what each takes and gives, as JSON-serializable models.

A stage is one recorded part of a round: prepare; rollout and update, once for each of the round's
training steps (``training.batches_per_round``, `STEP_STAGES`, each step's record named by
`record_name`); then mine, synthesize, validate, evaluate, version, in that order (`STAGE_NAMES`).
Each is a typed function declared once in its module under ``tasks/`` (`tasks.registry.stage`);
the registry of those functions must name exactly the stages here, in this order (flows/stage.py
builds it with `tasks.registry.stage_registry`, which checks). The warehouse's stage records
(``stage_runs``) hold each stage's output as the JSON of its output model, and a round that runs
again reads them back through the same models: outputs recorded by earlier versions may carry keys
the models no longer name, which are kept (``extra="allow"``).

Some stages may run on a work pool instead of the round's process (`PLACEABLE`, see flows/stage.py
and ``placement`` in the configuration); a placed stage takes the same input model and gives the
same output model. Input fields carry what the stage needs besides the configuration and the
warehouse session.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from coevolve.records import digest


class Contract(BaseModel):
    # Outputs recorded by earlier versions may carry extra keys; they are kept, not refused.
    model_config = ConfigDict(extra="allow", frozen=True)


# The output model of the stage an input is for.
OutputT = TypeVar("OutputT", bound=Contract)


class StageInput(Contract, Generic[OutputT]):
    """What every stage takes: the round it is a step of, and what that stage needs besides. Its type parameter
    is the stage's output model (``PrepareInput`` is a ``StageInput[PrepareOutput]``), so a call that runs a stage
    (`tasks.registry.Stage`, `flows.stage.run_stage`) is typed by what it is given."""

    round_: int


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


class PrepareInput(StageInput[PrepareOutput]):
    pass


class StepInput(StageInput[OutputT]):
    """A stage of one training step of a round: a round runs training.batches_per_round steps, 0 first."""

    step: int = 0


class RolloutOutput(Contract):
    trajectories: int
    tasks: int
    success_rate: float
    finish_reasons: dict[str, int]
    step: int = 0
    checkpoint: str | None = None  # the policy that played the step's batch; None in older records
    # Groups (tasks) the step played and those with reward variance; None in records of older versions.
    groups_played: int | None = None
    informative_groups: int | None = None
    draws: int = 1  # the batch and, with rollout.dynamic_sampling, each round of replacement tasks
    # With rollout.dynamic_sampling: the groups the update trains on (the first tasks_per_batch with reward
    # variance, in the order they were drawn); None: every group of the step with reward variance.
    train_tasks: list[str] | None = None

    @classmethod
    def of_steps(cls, steps: list[RolloutOutput]) -> RolloutOutput:
        """The round's rollout: every step's episodes together (``steps`` holds how many steps there were)."""
        played = sum(s.trajectories for s in steps)
        reasons: dict[str, int] = {}
        for s in steps:
            for reason, count in s.finish_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
        return cls.model_validate(
            {
                "trajectories": played,
                "tasks": sum(s.tasks for s in steps),
                "success_rate": sum(s.success_rate * s.trajectories for s in steps) / played if played else 0.0,
                "finish_reasons": dict(sorted(reasons.items())),
                "checkpoint": steps[0].checkpoint,
                "steps": len(steps),
                "groups_played": _total([s.groups_played for s in steps]),
                "informative_groups": _total([s.informative_groups for s in steps]),
                "draws": sum(s.draws for s in steps),
            }
        )


class RolloutInput(StepInput[RolloutOutput]):
    checkpoint: str  # the policy the previous step produced (checkpoint ``round_`` at step 0): a folder or a model id


def _total(counts: list[int | None]) -> int | None:
    """The sum of the steps' counts; None when a step's record (of an older version) lacks it."""
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


class MineOutput(Contract):
    signals: dict[str, int]  # kind -> signals mined this round
    selected: list[str]  # signal ids synthesis follows, in order


class MineInput(StageInput[MineOutput]):
    pass


class SynthesizeOutput(Contract):
    candidates: list[dict[str, Any]]  # {"task": Task.to_dict(), "signal_id": str | None}
    contexts: dict[str, Any]  # signal id -> how its candidates were made


class SynthesizeInput(StageInput[SynthesizeOutput]):
    selected: list[str]


class ValidateOutput(Contract):
    accepted: int
    rejected: int
    pool_size: int  # of pool round_ + 1
    rejections: dict[str, int]


class ValidateInput(StageInput[ValidateOutput]):
    candidates: list[dict[str, Any]]


class UpdateOutput(Contract):
    # The step's trained policy (`PipelineConfig.checkpoint_after`): checkpoint ``round_ + 1`` at the last step.
    checkpoint: str
    stats: dict[str, Any]
    trained_on: dict[str, Any]
    step: int = 0
    trained_from: str | None = None  # the checkpoint this step trained (its input); None in older records

    @classmethod
    def of_steps(cls, steps: list[UpdateOutput]) -> UpdateOutput:
        """The round's update: the last step's checkpoint, the steps' statistics summed (counts) or averaged (the
        rest), every step's own statistics under ``per_step``, and the lineage of all of them. A round of one
        step is that step's output, as a round of one batch recorded it."""
        if len(steps) == 1:
            return steps[0]
        numbers: dict[str, list[float]] = {}
        for s in steps:
            for key, value in s.stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    numbers.setdefault(key, []).append(float(value))
        stats: dict[str, Any] = {
            key: sum(values) if key in SUMMED_STATS else sum(values) / len(values) for key, values in numbers.items()
        }
        stats["skipped"] = all(s.stats.get("skipped", False) for s in steps)
        stats["per_step"] = [s.stats for s in steps]
        trained_on = {
            "run_id": steps[-1].trained_on.get("run_id"),
            "round": steps[-1].trained_on.get("round"),
            "count": sum(int(s.trained_on.get("count") or 0) for s in steps),
            "ids_digest": digest([s.trained_on.get("ids_digest") for s in steps]),
            "steps": len(steps),
        }
        return cls(
            checkpoint=steps[-1].checkpoint,
            stats=stats,
            trained_on=trained_on,
            step=steps[-1].step,
            trained_from=steps[0].trained_from,
        )


class UpdateInput(StepInput[UpdateOutput]):
    checkpoint: str  # the policy step ``step``'s batch was played with
    # The groups to train on (`RolloutOutput.train_tasks`); None: every group of the step with reward variance.
    tasks: list[str] | None = None


class EvaluateOutput(Contract):
    heldout_success: float
    heldout_tasks: int
    # Set only when the round scored the dev split (rollout.dev_eval_tasks > 0).
    dev_success: float | None = None
    dev_tasks: int | None = None


class EvaluateInput(StageInput[EvaluateOutput]):
    checkpoint: str


class VersionOutput(Contract):
    """The round's summary (coevolve.records.RoundSummary's fields) and what the version stage registered."""

    checkpoint: str
    checkpoint_digest: str | None = None
    pool_digest: str | None = None
    model_version: str | None = None
    mlflow_run_id: str | None = None
    best_version: Any = None


class VersionInput(StageInput[VersionOutput]):
    """The outputs of the round's earlier stages that its summary and lineage are made from."""

    model_config = ConfigDict(populate_by_name=True)

    rollout: RolloutOutput
    mine: MineOutput
    validate_: ValidateOutput = Field(alias="validate")  # ``validate`` is a BaseModel method
    update: UpdateOutput
    evaluate: EvaluateOutput


# Update statistics a round adds up over its steps; the others are averaged.
SUMMED_STATS = frozenset(
    {"steps", "groups", "segment_groups", "trajectories", "groups_flat", "groups_malformed", "duration_s"}
)


def record_name(stage: str, step: int = 0) -> str:
    """The name a stage's record goes by in its round: the stage's, with ``@<step>`` for a training step after the
    first (``rollout``, ``update``, ``rollout@1``, ``update@1``, ...), so a round of one step records what it always
    did."""
    return stage if not step else f"{stage}@{step}"


def step_samples(step: int, group_size: int) -> range:
    """The sample numbers of training step ``step``'s episodes of a task: step k plays k x group_size onwards.

    A round stores every step's episodes in its own partition, so this range is what tells them apart.
    """
    return range(step * group_size, (step + 1) * group_size)


def step_of(inputs: StageInput) -> int:
    """The training step a stage's inputs belong to (0 for the stages a round runs once)."""
    return inputs.step if isinstance(inputs, StepInput) else 0


# stage -> (input model, output model), in the order a round runs them: prepare, then rollout and
# update once per training step (training.batches_per_round), then the stages that feed the pool.
CONTRACTS: dict[str, tuple[type[StageInput[Any]], type[Contract]]] = {
    "prepare": (PrepareInput, PrepareOutput),
    "rollout": (RolloutInput, RolloutOutput),
    "update": (UpdateInput, UpdateOutput),
    "mine": (MineInput, MineOutput),
    "synthesize": (SynthesizeInput, SynthesizeOutput),
    "validate": (ValidateInput, ValidateOutput),
    "evaluate": (EvaluateInput, EvaluateOutput),
    "version": (VersionInput, VersionOutput),
}
STAGE_NAMES: tuple[str, ...] = tuple(CONTRACTS)
# The stages ``placement`` may put on a work pool; prepare and version always run in the round's process.
PLACEABLE: tuple[str, ...] = ("rollout", "update", "mine", "synthesize", "validate", "evaluate")
# The stages a round runs once per training step.
STEP_STAGES: tuple[str, ...] = ("rollout", "update")
# The stages a round may forget and run again, in the order it clears them (Warehouse.clear_round):
# prepare records the run's starting point, which no round clears.
CLEARING_ORDER: tuple[str, ...] = STAGE_NAMES[1:]
