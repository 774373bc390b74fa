"""Small Task / Trajectory records built in code, and a fresh warehouse per test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coevolve.records import Provenance, Step, Task, ToolCall, Trajectory
from storage.warehouse import Warehouse
from tests.storage.old_warehouse import write_old_warehouse

# MLflow reads this when it is first imported, which a test module here may do before storage.tracking.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

RUN = "run-a"


def build_task(i: int, origin: str = "seed", round: int = 0, tools: tuple[str, ...] = ("mkdir", "cd", "ls")) -> Task:
    return Task(
        environment="bfcl",
        initial_config={"GorillaFileSystem": {"root": {"workspace": {"type": "directory", "contents": {}}}}},
        involved_classes=["GorillaFileSystem"],
        turns=[f"Create folder d{i}, enter it and list it."],
        reference=[[ToolCall(name, {"dir_name": f"d{i}"} if name == "mkdir" else {}) for name in tools]],
        provenance=Provenance(
            origin=origin,
            round=round,
            parent_trajectory_id=None if origin == "seed" else "p/r0/t/s0",
            signal_id=None if origin == "seed" else f"{origin}:p/r0/t/s0",
        ),
        description=f"task {i}",
    )


def build_trajectory(
    task_id: str,
    sample: int,
    success: bool,
    round: int = 0,
    run_id: str = RUN,
    tools: tuple[str, ...] = ("mkdir", "cd"),
    observations: tuple[str, ...] | None = None,
) -> Trajectory:
    observations = observations if observations is not None else tuple("ok" for _ in tools)
    steps = [
        Step(
            turn=0,
            index=0,
            model_text=" ".join(f"{t}()" for t in tools),
            calls=[ToolCall(t, {"x": 1}) for t in tools],
            observations=list(observations),
            completion_tokens=7,
        ),
        Step(turn=0, index=1, model_text="done", error="no tool call" if not success else None, completion_tokens=2),
    ]
    return Trajectory(
        run_id=run_id,
        round=round,
        task_id=task_id,
        sample=sample,
        steps=steps,
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5, 6, 7],
        completion_mask=[1, 1, 0, 1],
        logprobs=[-0.25, -1.5, 0.0, -0.125],
        reward=1.0 if success else 0.0,
        success=success,
        finish_reason="done",
        duration_s=0.5,
    )


@pytest.fixture
def make_task() -> Callable[..., Task]:
    return build_task


@pytest.fixture
def make_trajectory() -> Callable[..., Trajectory]:
    return build_trajectory


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Warehouse]:
    with Warehouse(tmp_path / "warehouse") as wh:
        yield wh


@pytest.fixture
def old_warehouse(tmp_path: Path) -> dict[str, object]:
    """A single-file warehouse of a few rows of every table (tests/storage/old_warehouse.py), and its records."""
    return write_old_warehouse(tmp_path, build_task, build_trajectory)
