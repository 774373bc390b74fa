"""The method's task making, written once for every environment: exploration walks, abstraction of a walk into a
task, cutting a task into user turns, and the seed pool and splits built from unguided walks.

An environment supplies a `World` (`Environment.world_type`): a private copy of one initial state that runs calls,
and a few small hooks about it: where an unguided walk starts, which tools a walk draws and how it fills in their
arguments, whether a result reports success or says something, and how a request for some calls is written.
Everything else here is the same for every environment, so the tasks of two environments are made by one rule.

A walk (``explore``) runs ``num_steps`` calls on a fresh world: the world's own opening first (the workplace begins
with a job that needs several apps; none by default), then tools drawn at random, the focus tools most of the time
when there are some, each call's arguments chosen from the world's live state. ``abstract`` keeps the walk's
successful calls that changed the state or returned something informative, drops repeated lookups, and cuts the rest
to a minimal sequence that replays cleanly from the initial state: a task whose requests the world writes.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from coevolve.records import Provenance, Task, ToolCall, canonical_json

# How often a focused walk draws one of its focus tools instead of any tool.
FOCUS_SHARE = 0.8
# Walks tried per task wanted before `build_tasks` gives up and returns fewer.
WALKS_PER_TASK = 50

# A start state: an initial configuration and the classes (BFCL's API classes, the workplace's apps) it involves.
Start = tuple[dict[str, Any], list[str]]


@dataclass(frozen=True)
class Triplet:
    """One exploration step: the call, what the environment answered, and what it did to the state."""

    action: ToolCall
    observation: str
    run_id: str
    ok: bool
    state_changed: bool


class World(ABC):
    """A private copy of one initial state that walks, abstraction and the task builders run calls on.

    Built as ``WorldType(initial_config, involved)`` (refusing a state it cannot run on); the class methods speak for
    the environment's worlds as a whole.
    """

    # Task.environment of the tasks made in these worlds: the environment's name.
    environment: ClassVar[str]

    def __init__(self, initial_config: dict[str, Any], involved: list[str]) -> None:
        self.involved = list(involved)

    @classmethod
    @abstractmethod
    def start(cls, rng: random.Random) -> Start:
        """The initial state an unguided walk starts from, drawn with ``rng``."""

    @abstractmethod
    def tools(self) -> list[str]:
        """The tools a walk may call here, in the order it draws them from."""

    @abstractmethod
    def choose(self, tool: str, rng: random.Random) -> ToolCall:
        """The call a walk makes when it draws ``tool``: arguments read from the live state (or another call that
        must come first, such as a login)."""

    @abstractmethod
    def run(self, call: ToolCall, run_id: str) -> Triplet:
        """Run ``call`` on this world's state and record it as a step of run ``run_id``."""

    @staticmethod
    @abstractmethod
    def succeeded(observation: str) -> bool:
        """Whether a call's result reports success."""

    @staticmethod
    @abstractmethod
    def informative(observation: str) -> bool:
        """Whether a successful lookup's result found something, so a task may ask for it."""

    @classmethod
    @abstractmethod
    def requests(cls, chunks: list[list[ToolCall]], initial_config: dict[str, Any], involved: list[str]) -> list[str]:
        """One user request per chunk of consecutive calls on ``initial_config`` (a chunk may refer to what the
        chunks before it found)."""

    @staticmethod
    def same_state(before: Any, after: Any) -> bool:
        """Whether two of the environment's ``state()`` snapshots are the same state; ``==`` by default."""
        return bool(before == after)

    def opening(self, rng: random.Random, focus: list[str], run_id: str) -> list[Triplet]:
        """The steps a walk begins with before its random calls (a workflow of several tools); none by default."""
        return []


def explore(
    world: World, rng: random.Random, num_steps: int, focus_tools: list[str] | None = None, run_id: str = "x"
) -> list[Triplet]:
    """A walk of ``num_steps`` calls on ``world``: its opening, then random tools with arguments from the live state.

    With ``focus_tools`` the walk draws them ``FOCUS_SHARE`` of the time.
    """
    tools = world.tools()
    focus = [t for t in (focus_tools or []) if t in tools]
    triplets = world.opening(rng, focus, run_id)[:num_steps]
    while len(triplets) < num_steps:
        name = rng.choice(focus) if focus and rng.random() < FOCUS_SHARE else rng.choice(tools)
        triplets.append(world.run(world.choose(name, rng), run_id))
    return triplets


def abstract(
    world_type: type[World],
    triplets: list[Triplet],
    initial_config: dict[str, Any],
    involved: list[str],
    provenance: Provenance,
    min_steps: int = 3,
    max_steps: int = 5,
    calls_per_turn: int | None = None,
) -> Task | None:
    """A task from an exploration run, or None when fewer than ``min_steps`` calls are usable.

    Keeps the successful calls that changed the state or returned something informative, drops repeated lookups,
    and cuts to at most ``max_steps`` calls that replay cleanly from the initial state, in order. Single-turn, or
    one user turn per ``calls_per_turn`` consecutive calls (5 calls at 2 per turn: turns of 2, 2 and 1 calls), as
    the official multi-turn entries spread a job over several requests.
    """
    world = world_type(initial_config, involved)
    sequence: list[ToolCall] = []
    seen_reads: set[str] = set()
    for triplet in triplets:
        if len(sequence) >= max_steps:
            break
        if not triplet.ok or not (triplet.state_changed or world.informative(triplet.observation)):
            continue
        replayed = world.run(triplet.action, triplet.run_id)
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
    [request] = world_type.requests([sequence], initial_config, involved)
    task = Task(
        environment=world_type.environment,
        initial_config=initial_config,
        involved_classes=list(involved),
        turns=[request],
        reference=[sequence],
        provenance=provenance,
        description=request,
    )
    return in_turns(world_type, task, calls_per_turn)


def in_turns(world_type: type[World], task: Task, calls_per_turn: int | None) -> Task:
    """The same job as user turns of at most ``calls_per_turn`` consecutive calls; None leaves it as it is.

    The turns' requests are written again from the calls, so this is for tasks whose requests are the world's (an
    LLM-written query cannot be cut by calls).
    """
    if not calls_per_turn:
        return task
    calls = [call for turn in task.reference for call in turn]
    reference = [calls[i : i + calls_per_turn] for i in range(0, len(calls), calls_per_turn)]
    turns = world_type.requests(reference, task.initial_config, task.involved_classes)
    return replace(task, turns=turns, reference=reference)


def build_tasks(
    world_type: type[World],
    n: int,
    seed: int,
    origin: str = "seed",
    exclude: set[str] | frozenset[str] = frozenset(),
    min_steps: int = 3,
    max_steps: int = 5,
    calls_per_turn: int | None = None,
    start: Callable[[random.Random], Start] | None = None,
) -> list[Task]:
    """``n`` distinct tasks, none whose id or identity (`Task.identity`: the same exercise, however worded) is in
    ``exclude``, each abstracted from one unguided walk of ``max_steps`` to ``max_steps + 3`` calls, all drawn from
    one random stream seeded by ``seed``: the seed pool and every split. ``start`` draws a walk's initial state (the
    world type's own by default). Gives up after ``WALKS_PER_TASK`` walks a task, returning fewer."""
    draw_start = start or world_type.start
    rng = random.Random(seed)
    tasks: dict[str, Task] = {}
    attempts = 0
    while len(tasks) < n and attempts < WALKS_PER_TASK * n:
        attempts += 1
        initial_config, involved = draw_start(rng)
        world = world_type(initial_config, involved)
        run_id = f"{origin}-{seed}-{attempts}"
        triplets = explore(world, rng, rng.randint(max_steps, max_steps + 3), run_id=run_id)
        provenance = Provenance(origin=origin)
        task = abstract(
            world_type, triplets, initial_config, involved, provenance, min_steps, max_steps, calls_per_turn
        )
        if task is not None and task.task_id not in tasks and not {task.task_id, task.identity} & exclude:
            tasks[task.task_id] = task
    return list(tasks.values())
