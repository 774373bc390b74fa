"""The workplace's world for task making (envs/exploration.py): seeded worlds, walks that often begin with a workflow
that needs several apps together (envs/workplace/workflows.py), and requests that refer to what earlier steps found.

The seed pool and the splits come from unguided exploration of the seeded worlds: a workflow first half of the time,
then random calls whose arguments are read from the live state. Signal-driven synthesis reuses the same walk with
``focus_tools``.
"""

from __future__ import annotations

import json
import random
from functools import cache, partial
from typing import Any

import envs.exploration as exploration
from coevolve.records import Provenance, Task, ToolCall, canonical_json
from envs.exploration import Start, Triplet
from envs.workplace.session import ENVIRONMENT_NAME, Session
from envs.workplace.templates import verbalize_turns
from envs.workplace.workflows import WORKFLOWS, fitting
from envs.workplace.world import APPS, WORLD_COUNT, generate_world

__all__ = ["ENVIRONMENT_NAME", "WorkplaceWorld", "build_tasks", "make_task", "world"]

# How often a walk begins with a workflow of several apps; with focus tools, a walk whose workflow calls one.
WORKFLOW_SHARE = 0.5


@cache
def _world_json(seed: int) -> str:
    return canonical_json(generate_world(seed))


def world(seed: int) -> dict[str, Any]:
    """A fresh copy of world ``seed``'s initial state."""
    state: dict[str, Any] = json.loads(_world_json(seed))
    return state


class WorkplaceWorld(Session):
    """A workplace state for one exploration run or abstraction, with the workflows a walk may begin with."""

    @classmethod
    def start(cls, rng: random.Random) -> Start:
        """One of the seeded worlds, with every app."""
        return world(rng.randrange(WORLD_COUNT)), list(APPS)

    def opening(self, rng: random.Random, focus: list[str], run_id: str) -> list[Triplet]:
        """``WORKFLOW_SHARE`` of the time, a workflow that fits the apps (and calls a focus tool where there are)."""
        flows = fitting(self.apps, focus)
        if flows and rng.random() < WORKFLOW_SHARE:
            return WORKFLOWS[rng.choice(flows)][0](self, rng, run_id)
        return []

    @classmethod
    def requests(cls, chunks: list[list[ToolCall]], initial_config: dict[str, Any], involved: list[str]) -> list[str]:
        return verbalize_turns(chunks, initial_config, involved)


def make_task(calls: list[ToolCall], initial_config: dict[str, Any], apps: list[str], provenance: Provenance) -> Task:
    """A single-turn task asking for ``calls`` on ``initial_config``."""
    [request] = WorkplaceWorld.requests([list(calls)], initial_config, apps)
    return Task(
        environment=ENVIRONMENT_NAME,
        initial_config=initial_config,
        involved_classes=list(apps),
        turns=[request],
        reference=[list(calls)],
        provenance=provenance,
        description=request,
    )


# ``n`` distinct tasks from unguided exploration of the seeded worlds, reproducible from ``seed``.
build_tasks = partial(exploration.build_tasks, WorkplaceWorld)
