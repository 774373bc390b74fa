"""One stage of a round, run where the configuration places it: inline, or on a work pool through a deployment.

The round's stages are registered here, from the modules that declare them (tasks/registry.py), and
checked against coevolve/stages.py. ``placement.<stage>`` puts a placeable stage (coevolve.stages.PLACEABLE)
``inline`` (its Prefect task runs in the round's process) or on a deployment of the ``coevolve-stage``
flow below, e.g. ``coevolve-stage/rollout-gpu`` on the ``coevolve-gpu`` pool (prefect.yaml). A deployed
stage is started with ``run_deployment`` and the round waits for it (at most
``placement.stage_timeout_s``, then cancels it); a stage already recorded as finished is not started
again. Inline or deployed, the output the next stages get is the one the stage recorded in the
warehouse, so the checkpoint folders, pool snapshots and the warehouse must be on storage every
worker sees.

Also here: the run's slot, a Prefect global concurrency limit named ``coevolve-run-<run_id>`` that
only one round of a run holds at a time on any machine that talks to the same Prefect server.

Run one stage by hand: ``prefect deployment run coevolve-stage/mine-cpu -p stage=mine -p 'inputs={"round_": 0}'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import httpx
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import FlowRun, State
from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Cancelled, Cancelling

from coevolve.config import PipelineConfig
from coevolve.errors import InfrastructureError, RoundLockedError
from coevolve.settings import apply_settings
from coevolve.stages import PLACEABLE, Contract, OutputT, StageInput, record_name, step_of
from flows import local_api
from tasks.common import open_warehouse
from tasks.evaluate import evaluate_stage
from tasks.mine import mine_stage
from tasks.prepare import prepare_stage
from tasks.registry import Stage, stage_registry
from tasks.rollout import rollout_stage
from tasks.synthesize import synthesize_stage
from tasks.update import update_stage
from tasks.validate import validate_stage
from tasks.version import version_stage

# Seconds between the round's checks on a deployed stage.
POLL_INTERVAL_S = 2.0
# A killed round's slot frees itself after this many seconds without a renewal.
RUN_SLOT_LEASE_S = 60.0
# How long a 'fail' round waits for the server's answer about the run's slot; a taken slot is refused at once.
FAIL_FAST_TIMEOUT_S = 60.0

# The round's stages by name, in the order a round runs them.
STAGES: dict[str, Stage] = stage_registry(
    prepare_stage,
    rollout_stage,
    update_stage,
    mine_stage,
    synthesize_stage,
    validate_stage,
    evaluate_stage,
    version_stage,
)
# A stage is found by its input model: the round flow hands over typed inputs, never a stage's name.
_BY_INPUT: dict[type[Contract], Stage[Any, Any]] = {s.inputs: s for s in STAGES.values()}


def placement_target(cfg: PipelineConfig, stage: Stage) -> str:
    """'inline' or the deployment ``placement`` names for ``stage``; stages that cannot be placed run inline."""
    return cfg.placement.target(stage.name) if stage.name in PLACEABLE else "inline"


def stage_run_name() -> str:
    """A deployed stage's flow-run name: its record's name and round, e.g. ``update@3-round-2``."""
    parameters = current_flow_run.parameters
    inputs = parameters.get("inputs") or {}
    return f"{record_name(str(parameters.get('stage')), int(inputs.get('step') or 0))}-round-{inputs.get('round_')}"


@flow(name="coevolve-stage", flow_run_name=stage_run_name)
def coevolve_stage(stage: str, inputs: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one stage of a round on this worker; the output is recorded in the warehouse and returned."""
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI
    if stage not in STAGES:
        raise ValueError(f"Unknown stage {stage!r}; the stages are {', '.join(STAGES)}.")
    registered = STAGES[stage]
    return registered(cfg, registered.inputs.model_validate(inputs)).model_dump(mode="json")


def run_stage(cfg: PipelineConfig, inputs: StageInput[OutputT]) -> OutputT:
    """Run the stage ``inputs`` are for, where ``cfg.placement`` says, and return its typed (recorded) output."""
    stage: Stage[StageInput[OutputT], OutputT] = _BY_INPUT[type(inputs)]
    round_, record = inputs.round_, record_name(stage.name, step_of(inputs))
    target = placement_target(cfg, stage)
    if target == "inline":
        return stage(cfg, inputs)
    # A stage an earlier attempt finished is read back here: re-running a round starts no job on a pool
    # (whose workers may be gone) just to return a record.
    with open_warehouse(cfg) as wh:
        recorded = wh.stage_output(cfg.run_id, round_, record)
    if recorded is not None:
        return stage.outputs.model_validate(recorded)
    # The round runs stages from synchronous code, where run_deployment runs its synchronous
    # implementation and returns the flow run (a coroutine only when called inside an event loop).
    flow_run = cast(
        FlowRun,
        run_deployment(
            target,
            parameters={
                "stage": stage.name,
                "inputs": inputs.model_dump(mode="json"),
                "config": cfg.model_dump(mode="json"),
            },
            timeout=cfg.placement.stage_timeout_s,
            poll_interval=POLL_INTERVAL_S,
        ),
    )
    state = flow_run.state
    if state is not None and not state.is_final():
        _cancel(flow_run.id, state)
    if state is None or not state.is_completed():
        raise InfrastructureError(
            f"Stage {record} of round {round_} ran as deployment {target} "
            f"(flow run {flow_run.name}, {flow_run.id}) "
            + (
                f"and was still {state.name} after {cfg.placement.stage_timeout_s:.0f} s "
                "(placement.stage_timeout_s), so the round cancelled it (a worker that died leaves it Cancelling)"
                if state is not None and not state.is_final()
                else f"and ended {state.name if state else 'without a state'}"
            )
            + "; see that flow run's logs. Running the round again resumes after its last finished stage."
        )
    return stage.outputs.model_validate(_recorded_output(cfg, round_, record, target))


def _recorded_output(cfg: PipelineConfig, round_: int, stage: str, target: str) -> dict[str, Any]:
    """The output the warehouse recorded for a deployed stage that just finished."""
    with open_warehouse(cfg) as wh:
        recorded = wh.stage_output(cfg.run_id, round_, stage)
    if recorded is None:
        raise InfrastructureError(
            f"Stage {stage} of round {round_} finished ({target}), but the warehouse at {cfg.warehouse_path} holds no "
            "output for it: the worker wrote to another warehouse. Give every worker the same state_dir (or "
            "warehouse.uri) on storage they all see."
        )
    return recorded


def _cancel(flow_run_id: Any, state: Any) -> None:
    """Stop a stage the round gave up on, so a re-run of the round never runs beside it.

    A stage still waiting for a worker is cancelled outright; a running one is set Cancelling, which
    its worker answers by ending the flow-run process (a dead worker leaves it Cancelling).
    """
    message = "The round stopped waiting for this stage (placement.stage_timeout_s)."
    new_state: State[Any] = Cancelling(message=message) if state.is_running() else Cancelled(message=message)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, new_state, force=True)


@contextlib.contextmanager
def run_slot(cfg: PipelineConfig, round_: int) -> Iterator[None]:
    """Hold the run's global concurrency slot while a round runs, on a Prefect server.

    On a command's temporary API (flows/local_api.py) every round is on this machine and the file lock of
    `tasks.common.round_lock` is the guard; the slot adds the guard across machines. (A slot there would also
    outlive a command killed with -9 in the home's database, and hold up the command run again after it.)
    """
    if local_api.on_temporary_api():
        yield
        return
    name = f"coevolve-run-{cfg.run_id}"
    _ensure_limit(name)
    waiting = cfg.placement.round_concurrency == "wait"
    try:
        slot = concurrency(
            name,
            occupy=1,
            # 'fail' asks once (no retry after the server's 423 Locked) and gives a slow server the same time
            # as a waiting round would: a timeout of a second took a free slot for a taken one on a loaded server.
            timeout_seconds=cfg.placement.round_wait_s if waiting else FAIL_FAST_TIMEOUT_S,
            max_retries=None if waiting else 0,
            lease_duration=RUN_SLOT_LEASE_S,
            strict=True,
        )
        slot.__enter__()
    except (TimeoutError, ConcurrencySlotAcquisitionError) as exc:
        if isinstance(exc, ConcurrencySlotAcquisitionError) and not _slot_taken(exc):
            raise
        raise RoundLockedError(
            f"Run {cfg.run_id!r} is already running a round on another machine (global concurrency limit {name!r}); "
            + ("waited " + f"{cfg.placement.round_wait_s:.0f} s. " if waiting else "")
            + f"Round {round_} did not start; run it again when that round has finished "
            "(placement.round_concurrency=wait makes it wait instead)."
        ) from exc
    try:
        yield
    finally:
        slot.__exit__(None, None, None)


def _slot_taken(exc: ConcurrencySlotAcquisitionError) -> bool:
    """Whether the server refused the slot because it is held (423 Locked), not for another reason."""
    cause = exc.__cause__
    return isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code == httpx.codes.LOCKED


def _ensure_limit(name: str) -> None:
    """Create the run's limit (1 slot) on the server unless it exists."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
            return
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass  # another round created it at the same moment
