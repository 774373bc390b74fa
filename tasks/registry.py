"""The registry of stage functions: each stage of a round declared once, with `stage`.

A stage is a typed function ``(config, warehouse session, inputs) -> outputs`` whose models are the
stage's contract in coevolve/stages.py. `stage` registers it and makes its Prefect task, which adds:

- retries of retryable failures (`coevolve.errors.is_retryable`), and no result caching;
- resume: a stage the warehouse recorded as finished returns that record instead of running again,
  so a round that failed midway resumes where it stopped without duplicating rows;
- the stage record: the output is recorded last (``Warehouse.mark_stage``), so a stage that wrote
  several tables counts as finished only once every write is done, and one that stopped midway runs
  again, replacing what it wrote (rows are keyed or in files named after what they hold);
- one warehouse session, opened for the stage and handed to it and to every helper it calls;
- what the run cost (seconds, peak memory: tasks/stage_cost.py), kept in the stage record beside the output.

Every later stage gets the recorded form of an output (JSON, read back through the output model),
whether the stage ran now, in an earlier attempt or on another worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from coevolve.config import PipelineConfig
from coevolve.errors import is_retryable
from coevolve.stages import CONTRACTS, STAGE_NAMES, Contract, StageInput, record_name, step_of
from tasks.common import open_warehouse
from tasks.stage_cost import measured

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

# A stage's input model and output model (the input is a StageInput[its output], coevolve/stages.py).
InputT = TypeVar("InputT", bound=StageInput[Any])
OutputT = TypeVar("OutputT", bound=Contract)
StageFunction = Callable[[PipelineConfig, "Warehouse", InputT], OutputT]
# (config, warehouse, inputs, output) -> None: a check run after the output is recorded or read back.
StageCheck = Callable[[PipelineConfig, "Warehouse", Any, Any], None]


def _always(inputs: Any) -> bool:
    return True


@dataclass(frozen=True)
class Stage(Generic[InputT, OutputT]):
    """One registered stage: its typed function, its contract and its Prefect task."""

    name: str
    function: StageFunction[InputT, OutputT]
    inputs: type[InputT]
    outputs: type[OutputT]
    task: Any  # prefect.Task taking (config, inputs) and returning the output model
    recorded: Callable[[Any], bool]

    def __call__(self, config: PipelineConfig, inputs: InputT) -> OutputT:
        """Run the stage's Prefect task in this process and return its (recorded) output."""
        if not isinstance(inputs, self.inputs):
            raise TypeError(f"Stage {self.name} takes {self.inputs.__name__}, not {type(inputs).__name__}.")
        output: OutputT = self.task(config, inputs)
        return output


def stage(
    name: str,
    *,
    retries: int,
    retry_delay_seconds: float = 0,
    recorded: Callable[[Any], bool] = _always,
    check: StageCheck | None = None,
) -> Callable[[StageFunction[InputT, OutputT]], Stage[InputT, OutputT]]:
    """Declare the stage ``name`` of coevolve/stages.py: ``@stage("mine", retries=2)`` on its function.

    ``recorded(inputs)`` says whether this call keeps a stage record (and so resumes from one); ``check``
    runs on every call after the output is recorded or read back, in the same warehouse session.
    """
    if name not in CONTRACTS:
        raise ValueError(f"Unknown stage {name!r}; the stages are {', '.join(STAGE_NAMES)} (coevolve/stages.py).")

    def declare(function: StageFunction[InputT, OutputT]) -> Stage[InputT, OutputT]:
        # The contract's models, typed by the function they are declared on (a test checks they agree).
        input_model = cast(type[InputT], CONTRACTS[name][0])
        output_model = cast(type[OutputT], CONTRACTS[name][1])

        def run(config: PipelineConfig, inputs: InputT) -> OutputT:
            round_, record = inputs.round_, record_name(name, step_of(inputs))
            keep = recorded(inputs)
            with open_warehouse(config) as wh:
                done = wh.stage_output(config.run_id, round_, record) if keep else None
                if done is not None:
                    get_run_logger().info("round %d: %s already finished; its recorded output is used", round_, record)
                else:
                    with measured() as cost:
                        output = function(config, wh, inputs)
                    if not keep:
                        return output
                    # exclude_unset: an optional field the stage did not set stays out of the record, as before.
                    # The cost goes beside the output (v_stage_cost), never into what a resumed round reads back.
                    wh.mark_stage(
                        config.run_id, round_, record, output.model_dump(mode="json", exclude_unset=True), cost=cost
                    )
                    done = wh.stage_output(config.run_id, round_, record)
                typed = output_model.model_validate(done)
                if check is not None:
                    check(config, wh, inputs, typed)
            return typed

        run.__name__ = run.__qualname__ = f"{name}_stage"
        run.__doc__ = function.__doc__
        run.__module__ = function.__module__
        prefect_task = task(
            name=name, retries=retries, retry_delay_seconds=retry_delay_seconds, retry_condition_fn=is_retryable,
            cache_policy=NO_CACHE,
        )(run)  # fmt: skip
        return Stage(name, function, input_model, output_model, prefect_task, recorded)

    return declare


def stage_registry(*stages: Stage) -> dict[str, Stage]:
    """The registry of the round's stages by name, in round order.

    ValueError unless they are exactly coevolve/stages.py's.
    """
    names = tuple(s.name for s in stages)
    if names != STAGE_NAMES:
        raise ValueError(
            f"The stage registry {', '.join(names)} does not match coevolve/stages.py ({', '.join(STAGE_NAMES)}); "
            "declare each stage once with tasks.registry.stage and list it, in round order, in flows/stage.py."
        )
    return {s.name: s for s in stages}
