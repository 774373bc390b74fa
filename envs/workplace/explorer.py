"""Exploration of the workplace and abstraction of what it did into executable tasks; replay and demonstrations.

The seed pool and the splits come from unguided exploration of seeded worlds: a walk that often begins with a
workflow that needs several apps together (envs/workplace/workflows.py), then random calls whose arguments are
read from the live state. Signal-driven synthesis reuses the same walk with ``focus_tools``.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import cache
from typing import Any

from coevolve.records import Provenance, Task, ToolCall, canonical_json
from envs.base import Environment, Triplet, tasks_from_walks
from envs.workplace.explore_values import CHOOSERS
from envs.workplace.session import Session
from envs.workplace.templates import phrases, sentence, verbalize_turns
from envs.workplace.tools import is_ok, tools_of
from envs.workplace.workflows import WORKFLOWS, fitting
from envs.workplace.world import APPS, WORLD_COUNT, generate_world

# Task.environment of every workplace task, and the value of environment.name that picks this environment.
ENVIRONMENT_NAME = "workplace"
# How often a walk begins with a workflow of several apps; with focus tools, a walk whose workflow calls one.
WORKFLOW_SHARE = 0.5
FOCUS_SHARE = 0.8


@cache
def _world_json(seed: int) -> str:
    return canonical_json(generate_world(seed))


def world(seed: int) -> dict[str, Any]:
    """A fresh copy of world ``seed``'s initial state."""
    state: dict[str, Any] = json.loads(_world_json(seed))
    return state


def explore(
    initial_config: dict[str, Any],
    apps: list[str],
    rng: random.Random,
    num_steps: int,
    focus_tools: list[str] | None = None,
    run_id: str = "x",
) -> list[Triplet]:
    """A walk of ``num_steps`` calls on a fresh copy of the state: often a workflow first, then random calls.

    With ``focus_tools`` the workflow calls one of them and the random calls pick them ``FOCUS_SHARE`` of the time.
    """
    session = Session(initial_config, apps)
    tools = [tool.name for tool in tools_of(apps)]
    focus = [t for t in (focus_tools or []) if t in tools]
    triplets: list[Triplet] = []
    flows = fitting(apps, focus)
    if flows and rng.random() < WORKFLOW_SHARE:
        triplets = WORKFLOWS[rng.choice(flows)][0](session, rng, run_id)[:num_steps]
    while len(triplets) < num_steps:
        name = rng.choice(focus) if focus and rng.random() < FOCUS_SHARE else rng.choice(tools)
        try:
            arguments = CHOOSERS[name](session.state, session.context, rng)
        except (IndexError, KeyError, ValueError):  # a state with nothing to choose from: the call fails
            arguments = {}
        triplets.append(session.run(ToolCall(name, arguments), run_id))
    return triplets


def make_task(calls: list[ToolCall], initial_config: dict[str, Any], apps: list[str], provenance: Provenance) -> Task:
    """A single-turn task asking for ``calls`` on ``initial_config``."""
    request = sentence(phrases(calls, initial_config, apps))
    return Task(
        environment=ENVIRONMENT_NAME,
        initial_config=initial_config,
        involved_classes=list(apps),
        turns=[request],
        reference=[list(calls)],
        provenance=provenance,
        description=request,
    )


def abstract(
    triplets: list[Triplet],
    initial_config: dict[str, Any],
    apps: list[str],
    provenance: Provenance,
    min_steps: int = 3,
    max_steps: int = 5,
    calls_per_turn: int | None = None,
) -> Task | None:
    """A task from an exploration run, or None when fewer than ``min_steps`` calls are usable.

    Keeps the successful calls that changed the state or found something, drops repeated lookups, and cuts to at
    most ``max_steps`` calls that replay cleanly from the initial state, in order. Single-turn, or one user turn per
    ``calls_per_turn`` consecutive calls.
    """
    session = Session(initial_config, apps)
    sequence: list[ToolCall] = []
    seen_reads: set[str] = set()
    for triplet in triplets:
        if len(sequence) >= max_steps:
            break
        if not triplet.ok or not (triplet.state_changed or not triplet.observation.startswith("No ")):
            continue
        replayed = session.run(triplet.action, triplet.run_id)
        if not replayed.ok:
            continue
        if not replayed.state_changed:
            key = canonical_json([triplet.action.to_dict(), replayed.observation])
            if key in seen_reads:
                continue
            seen_reads.add(key)
        sequence.append(triplet.action)
    if len(sequence) < min_steps:
        return None
    return in_turns(make_task(sequence, initial_config, apps, provenance), calls_per_turn)


def in_turns(task: Task, calls_per_turn: int | None) -> Task:
    """The same job as user turns of at most ``calls_per_turn`` consecutive calls; None leaves it as it is.

    The turns' requests are written again from the calls (references to earlier results run across turns), so
    this is for tasks whose requests are the explorer's (an LLM-written query cannot be cut by calls).
    """
    if not calls_per_turn:
        return task
    calls = [call for turn in task.reference for call in turn]
    reference = [calls[i : i + calls_per_turn] for i in range(0, len(calls), calls_per_turn)]
    turns = verbalize_turns(reference, task.initial_config, task.involved_classes)
    return replace(task, turns=turns, reference=reference)


def replay(task: Task, env: Environment) -> tuple[bool, str, bool]:
    """Run the reference in ``env``, a fresh environment: (every call succeeded, reason, the state changed)."""
    try:
        env.reset(task)
    except Exception as exc:  # noqa: BLE001 - a synthesized state that cannot load is a rejection, not a crash
        return False, f"cannot build the environment: {exc}", False
    before = env.state()
    for turn_index, turn in enumerate(task.reference):
        for call_index, (call, result) in enumerate(zip(turn, env.execute(turn), strict=True)):
            if not is_ok(result):
                return False, f"turn {turn_index} call {call_index} {call.render()} failed: {result[:200]}", False
    return True, "all reference calls succeeded", env.state() != before


def build_tasks(
    n: int,
    seed: int,
    origin: str = "seed",
    exclude: set[str] | frozenset[str] = frozenset(),
    min_steps: int = 3,
    max_steps: int = 5,
    calls_per_turn: int | None = None,
) -> list[Task]:
    """``n`` distinct tasks from unguided exploration of the seeded worlds, reproducible from ``seed``."""

    def walk(rng: random.Random, run_id: str) -> Task | None:
        config = world(rng.randrange(WORLD_COUNT))
        triplets = explore(config, list(APPS), rng, rng.randint(max_steps, max_steps + 3), run_id=run_id)
        return abstract(triplets, config, list(APPS), Provenance(origin=origin), min_steps, max_steps, calls_per_turn)

    return tasks_from_walks(n, seed, origin, exclude, walk)
