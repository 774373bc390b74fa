"""One stage of a round, run where the configuration places it: inline, or on a work pool through a deployment.

``placement.<stage>`` is ``inline`` (the stage's Prefect task runs in the round's process) or a
deployment of the ``coevolve-stage`` flow below, e.g. ``coevolve-stage/rollout-gpu`` on the
``coevolve-gpu`` pool (prefect.yaml). A deployed stage is started with ``run_deployment`` and the
round waits for it (at most ``placement.stage_timeout_s``, then cancels it); a stage already
recorded as finished is not started again. Inline or deployed, the output the next stages get is
the one the stage recorded in the warehouse, so the checkpoint folders, pool snapshots and the
warehouse must be on storage every worker sees.

Also here: the run's slot, a Prefect global concurrency limit named ``coevolve-run-<run_id>`` that
only one round of a run holds at a time on any machine that talks to the same Prefect server.

Run one stage by hand: ``prefect deployment run coevolve-stage/mine-cpu -p stage=mine -p 'inputs={"round_": 0}'``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from prefect import flow

from coevolve.config import PipelineConfig
from coevolve.errors import InfrastructureError, RoundLockedError
from coevolve.settings import apply_settings
from coevolve.stages import CONTRACTS
from tasks.common import open_warehouse

# Seconds between the round's checks on a deployed stage.
POLL_INTERVAL_S = 2.0
# A killed round's slot frees itself after this many seconds without a renewal.
RUN_SLOT_LEASE_S = 60.0


def stage_task(stage: str) -> Any:
    """The Prefect task of a placeable stage (imported on use: a light worker loads only what it runs)."""
    if stage == "rollout":
        from tasks.rollout import rollout_task as task
    elif stage == "mine":
        from tasks.mine import mine_task as task
    elif stage == "synthesize":
        from tasks.synthesize import synthesize_task as task
    elif stage == "validate":
        from tasks.validate import validate_task as task
    elif stage == "update":
        from tasks.update import update_task as task
    elif stage == "evaluate":
        from tasks.evaluate import evaluate_task as task
    else:
        raise ValueError(f"Unknown stage {stage!r}; placeable stages are {', '.join(CONTRACTS)}.")
    return task


@flow(name="coevolve-stage", flow_run_name="{stage}-round-{inputs[round_]}")
def coevolve_stage(stage: str, inputs: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one stage of a round on this worker; the output is recorded in the warehouse and returned."""
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI
    input_model, output_model = CONTRACTS[stage]
    output = stage_task(stage)(cfg, **input_model.model_validate(inputs).model_dump())
    return output_model.model_validate(output).model_dump(mode="json")


def run_stage(cfg: PipelineConfig, stage: str, **inputs: Any) -> Any:
    """Run ``stage`` where ``cfg.placement`` says and return its typed output."""
    input_model, output_model = CONTRACTS[stage]
    typed = input_model(**inputs)
    target = cfg.placement.target(stage)
    if target == "inline":
        stage_task(stage)(cfg, **typed.model_dump())
        # Read back like a placed stage's: the recorded form (JSON, sorted keys) is what every later stage
        # gets, whether this stage ran inline or on a pool, now or in an earlier attempt of the round.
        return output_model.model_validate(_recorded_output(cfg, typed.round_, stage, target))
    # A stage an earlier attempt finished is read back here: re-running a round starts no job on a pool
    # (whose workers may be gone) just to return a record.
    with open_warehouse(cfg) as wh:
        recorded = wh.stage_output(cfg.run_id, typed.round_, stage)
    if recorded is not None:
        return output_model.model_validate(recorded)
    from prefect.deployments import run_deployment

    flow_run = run_deployment(
        target,
        parameters={"stage": stage, "inputs": typed.model_dump(mode="json"), "config": cfg.model_dump(mode="json")},
        timeout=cfg.placement.stage_timeout_s,
        poll_interval=POLL_INTERVAL_S,
    )
    state = flow_run.state
    if state is not None and not state.is_final():
        _cancel(flow_run.id, state)
    if state is None or not state.is_completed():
        raise InfrastructureError(
            f"Stage {stage} of round {typed.round_} ran as deployment {target} (flow run {flow_run.name}, {flow_run.id}) "
            + (
                f"and was still {state.name} after {cfg.placement.stage_timeout_s:.0f} s (placement.stage_timeout_s), so "
                "the round cancelled it (a worker that died leaves it Cancelling)"
                if state is not None and not state.is_final()
                else f"and ended {state.name if state else 'without a state'}"
            )
            + "; see that flow run's logs. Running the round again resumes after its last finished stage."
        )
    return output_model.model_validate(_recorded_output(cfg, typed.round_, stage, target))


def _recorded_output(cfg: PipelineConfig, round_: int, stage: str, target: str) -> dict[str, Any]:
    """The output the warehouse recorded for a stage that just finished."""
    with open_warehouse(cfg) as wh:
        recorded = wh.stage_output(cfg.run_id, round_, stage)
    if recorded is None:
        raise InfrastructureError(
            f"Stage {stage} of round {round_} finished ({target}), but the warehouse at {cfg.warehouse_path} holds no "
            "output for it"
            + (
                ": the worker wrote to another warehouse. Give every worker the same state_dir (or warehouse.uri) on "
                "storage they all see."
                if target != "inline"
                else "."
            )
        )
    return recorded


def _cancel(flow_run_id: Any, state: Any) -> None:
    """Stop a stage the round gave up on, so a re-run of the round never runs beside it.

    A stage still waiting for a worker is cancelled outright; a running one is set Cancelling, which
    its worker answers by ending the flow-run process (a dead worker leaves it Cancelling).
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    message = "The round stopped waiting for this stage (placement.stage_timeout_s)."
    new_state = Cancelling(message=message) if state.is_running() else Cancelled(message=message)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, new_state, force=True)


@contextlib.contextmanager
def run_slot(cfg: PipelineConfig, round_: int) -> Iterator[None]:
    """Hold the run's global concurrency slot while a round runs, on a Prefect server.

    With Prefect's temporary local API (no ``PREFECT_API_URL``) every round is on this machine and
    the file lock of `tasks.common.round_lock` is the guard; the slot adds the guard across machines.
    """
    if not os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.concurrency.sync import concurrency

    name = f"coevolve-run-{cfg.run_id}"
    _ensure_limit(name)
    waiting = cfg.placement.round_concurrency == "wait"
    try:
        slot = concurrency(
            name, occupy=1, timeout_seconds=cfg.placement.round_wait_s if waiting else 1.0, lease_duration=RUN_SLOT_LEASE_S,
            strict=True,
        )  # fmt: skip
        slot.__enter__()
    except TimeoutError as exc:
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


def _ensure_limit(name: str) -> None:
    """Create the run's limit (1 slot) on the server unless it exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

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
