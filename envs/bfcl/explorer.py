"""Exploration of the BFCL environment and abstraction of what it did into executable tasks; replay and demonstrations.

The seed pool comes from unguided exploration (random walks over the tools, arguments filled from
the live state); signal-driven synthesis reuses the same walk with ``focus_tools``. Official entries
contribute only their initial states: their questions and answers are never read here.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import lru_cache
from typing import Any

import envs.bfcl.api as bfcl_api
from coevolve.records import Provenance, Task, ToolCall, canonical_json
from envs.base import Environment, Triplet, tasks_from_walks
from envs.bfcl.api import ENVIRONMENT_NAME
from envs.bfcl.explore_values import NEEDS_LOGIN, argument_value, login_call
from envs.bfcl.official import CATEGORIES
from envs.bfcl.templates import verbalize, verbalize_sequence

__all__ = [
    "DEFAULT_CLASSES",
    "Triplet",
    "abstract",
    "build_tasks",
    "environment_states",
    "explore",
    "replay",
    "verbalize",
]

# Classes whose tasks a small policy can learn: short literal arguments, no tokens or card numbers.
DEFAULT_CLASSES: tuple[str, ...] = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI")
_EMPTY_RESULTS = {"", "None", "{}", "[]"}


def is_ok(observation: str) -> bool:
    """Whether a result reports success: no execution error, no error key, no refused login."""
    if observation.startswith("Error") or observation.startswith("[{'error'"):
        return False
    if observation.startswith("{"):
        try:
            result = json.loads(observation)
        except json.JSONDecodeError:
            return True
        if isinstance(result, dict):
            if "error" in result or result.get("success") is False or result.get("authentication_status") is False:
                return False
            if result.get("login_status") is False and "message" in result:
                return False
    return True


class _Session:
    """A private instance set for one exploration run or replay."""

    def __init__(self, initial_config: dict[str, Any], classes: list[str]):
        self.instances = bfcl_api.new_instances(initial_config, classes)
        self.table = bfcl_api.method_table(self.instances)
        self.tool_classes = bfcl_api.class_of_tool(classes)
        self.docs = {d["name"]: d for cls in classes for d in bfcl_api.func_docs(cls)}
        # The state after the last call, which only calls change: the next call's state before it. One deep copy per
        # call instead of two (the copies were about half of building the builtin policy's demonstrations).
        self.state = bfcl_api.snapshot(self.instances)

    def arguments(self, tool: str, rng: random.Random) -> dict[str, Any]:
        params = self.docs.get(tool, {}).get("parameters", {})
        required = set(params.get("required", []))
        chosen: dict[str, Any] = {}
        for name, spec in params.get("properties", {}).items():
            # Optional parameters half of the time, so tasks cover both forms; find always names both.
            if name in required or tool == "find" or rng.random() < 0.5:
                chosen[name] = argument_value(tool, name, spec.get("type", "string"), self.instances, rng, chosen)
        return chosen

    def run(self, call: ToolCall, run_id: str) -> Triplet:
        observation = bfcl_api.run_call(self.table, self.tool_classes, call)
        before, self.state = self.state, bfcl_api.snapshot(self.instances)
        return Triplet(call, observation, run_id, is_ok(observation), self.state != before)


@lru_cache(maxsize=1)
def _official_states() -> tuple[tuple[str, tuple[str, ...]], ...]:
    seen: dict[str, tuple[str, tuple[str, ...]]] = {}
    # Long-context entries share these states (only a flag differs), so they add nothing.
    for category in CATEGORIES[:3]:
        for entry in bfcl_api.load_jsonl(bfcl_api.DATA_DIR / f"BFCL_v4_{category}.json"):
            classes = tuple(entry["involved_classes"])
            config = {c: entry["initial_config"][c] for c in classes if c in entry["initial_config"]}
            key = canonical_json([config, classes])
            seen.setdefault(key, (canonical_json(config), classes))
    return tuple(seen.values())


def environment_states(classes: list[str] | None = None) -> list[tuple[dict, list[str]]]:
    """Distinct (initial_config, involved_classes) pairs of the official entries.

    With ``classes``, each state keeps only those classes (states left with none are dropped).
    """
    out: dict[str, tuple[dict, list[str]]] = {}
    for config_json, state_classes in _official_states():
        config = json.loads(config_json)
        kept = [c for c in state_classes if classes is None or c in classes]
        if not kept:
            continue
        kept_config = {c: config[c] for c in kept if c in config}
        out.setdefault(canonical_json([kept_config, kept]), (kept_config, kept))
    return list(out.values())


def explore(
    initial_config: dict[str, Any],
    involved_classes: list[str],
    rng: random.Random,
    num_steps: int,
    focus_tools: list[str] | None = None,
    run_id: str = "x",
) -> list[Triplet]:
    """A random walk of ``num_steps`` calls on fresh instances, arguments read from the live state.

    With ``focus_tools`` the walk picks them 80% of the time. A tool that needs a login is preceded
    by the login call, so most calls are valid.
    """
    session = _Session(initial_config, involved_classes)
    tools = sorted(session.tool_classes)
    focus = [t for t in (focus_tools or []) if t in session.tool_classes]
    triplets: list[Triplet] = []
    while len(triplets) < num_steps:
        name = rng.choice(focus) if focus and rng.random() < 0.8 else rng.choice(tools)
        login = login_call(NEEDS_LOGIN[name], session.instances) if name in NEEDS_LOGIN else None
        call = ToolCall(*login) if login else ToolCall(name, session.arguments(name, rng))
        triplets.append(session.run(call, run_id))
    return triplets


def abstract(
    triplets: list[Triplet],
    initial_config: dict[str, Any],
    involved_classes: list[str],
    provenance: Provenance,
    min_steps: int = 3,
    max_steps: int = 5,
    calls_per_turn: int | None = None,
) -> Task | None:
    """A task from an exploration run, or None when fewer than ``min_steps`` calls are usable.

    Keeps the successful calls that changed the state or returned information, drops repeated
    read-only calls, and cuts to at most ``max_steps`` calls that replay cleanly from the initial state.
    The task is single-turn, or with ``calls_per_turn`` one user turn per consecutive run of at most
    that many calls (5 calls at 2 per turn: turns of 2, 2 and 1 calls), as the official multi-turn
    entries spread a job over several requests.
    """
    session = _Session(initial_config, involved_classes)
    sequence: list[ToolCall] = []
    seen_reads: set[str] = set()
    for triplet in triplets:
        if len(sequence) >= max_steps:
            break
        if not triplet.ok or not (triplet.state_changed or triplet.observation not in _EMPTY_RESULTS):
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
    return in_turns(
        Task(
            environment=ENVIRONMENT_NAME,
            initial_config=initial_config,
            involved_classes=list(involved_classes),
            turns=[verbalize_sequence(sequence)],
            reference=[sequence],
            provenance=provenance,
            description=verbalize_sequence(sequence),
        ),
        calls_per_turn,
    )


def in_turns(task: Task, calls_per_turn: int | None) -> Task:
    """The same job as user turns of at most ``calls_per_turn`` consecutive calls, each turn's request verbalized.

    None leaves the task as it is. The turns' requests are rebuilt from the calls, so this is for tasks
    whose requests are the explorer's verbalizations (an LLM-written query cannot be cut by calls).
    """
    if not calls_per_turn:
        return task
    calls = [call for turn in task.reference for call in turn]
    reference = [calls[i : i + calls_per_turn] for i in range(0, len(calls), calls_per_turn)]
    return replace(task, turns=[verbalize_sequence(chunk) for chunk in reference], reference=reference)


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
    changed = env.state() != before
    return True, "all reference calls succeeded", changed


def build_tasks(
    n: int,
    seed: int,
    origin: str = "seed",
    exclude: set[str] | frozenset[str] = frozenset(),
    min_steps: int = 3,
    max_steps: int = 5,
    classes: list[str] | None = None,
    calls_per_turn: int | None = None,
) -> list[Task]:
    """``n`` distinct tasks from unguided exploration of the official initial states, reproducible from ``seed``.

    ``calls_per_turn`` splits each task into user turns (see ``abstract``); None keeps one turn.
    """
    states = environment_states(list(classes or DEFAULT_CLASSES))
    if not states:
        raise ValueError(f"no official initial state involves any of {classes}")

    def walk(rng: random.Random, run_id: str) -> Task | None:
        config, involved = states[rng.randrange(len(states))]
        triplets = explore(config, involved, rng, rng.randint(max_steps, max_steps + 3), run_id=run_id)
        return abstract(triplets, config, involved, Provenance(origin=origin), min_steps, max_steps, calls_per_turn)

    return tasks_from_walks(n, seed, origin, exclude, walk)
