"""BFCL's world for task making (envs/exploration.py): fresh API instances of an official initial state, arguments
read from their live state, and requests written from templates; the module's functions are the task making of
envs/exploration.py on BFCL's worlds.

The seed pool comes from unguided exploration (random walks over the tools, arguments filled from
the live state); signal-driven synthesis reuses the same walk with ``focus_tools``. Official entries
contribute only their initial states: their questions and answers are never read here.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, ClassVar

import envs.bfcl.api as bfcl_api
import envs.exploration as exploration
from coevolve.records import Task, ToolCall, canonical_json
from envs.bfcl.api import ENVIRONMENT_NAME
from envs.bfcl.explore_values import NEEDS_LOGIN, argument_value, login_call
from envs.bfcl.official import CATEGORIES
from envs.bfcl.state import same_state
from envs.bfcl.templates import verbalize, verbalize_sequence
from envs.exploration import Start, Triplet, World

if TYPE_CHECKING:
    from envs.base import Environment

__all__ = [
    "DEFAULT_CLASSES",
    "BfclWorld",
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


class BfclWorld(World):
    """A private instance set of the involved classes for one exploration run, abstraction or replay."""

    environment: ClassVar[str] = ENVIRONMENT_NAME

    def __init__(self, initial_config: dict[str, Any], involved: list[str]):
        super().__init__(initial_config, involved)
        self.instances = bfcl_api.new_instances(initial_config, self.involved)
        self.table = bfcl_api.method_table(self.instances)
        self.tool_classes = bfcl_api.class_of_tool(self.involved)
        self.docs = {d["name"]: d for cls in self.involved for d in bfcl_api.func_docs(cls)}
        # The state after the last call, which only calls change: the next call's state before it. One deep copy per
        # call instead of two (the copies were about half of building the builtin policy's demonstrations).
        self.state = bfcl_api.snapshot(self.instances)

    @classmethod
    def start(cls, rng: random.Random) -> Start:
        """One of the official initial states of the default classes."""
        return _start(rng, DEFAULT_CLASSES)

    def tools(self) -> list[str]:
        return sorted(self.tool_classes)

    def choose(self, tool: str, rng: random.Random) -> ToolCall:
        """The tool with arguments from the live state, or the login it needs first, so most calls are valid."""
        login = login_call(NEEDS_LOGIN[tool], self.instances) if tool in NEEDS_LOGIN else None
        return ToolCall(*login) if login else ToolCall(tool, self.arguments(tool, rng))

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
        return Triplet(call, observation, run_id, is_ok(observation), not self.same_state(before, self.state))

    @staticmethod
    def succeeded(observation: str) -> bool:
        return is_ok(observation)

    @staticmethod
    def same_state(before: Any, after: Any) -> bool:
        """Equal as bfcl-eval's checker compares them, also where a directory was copied into itself."""
        return same_state(before, after)

    @staticmethod
    def informative(observation: str) -> bool:
        """Anything but an empty result (None, {}, [])."""
        return observation not in _EMPTY_RESULTS

    @classmethod
    def requests(cls, chunks: list[list[ToolCall]], initial_config: dict[str, Any], involved: list[str]) -> list[str]:
        return [verbalize_sequence(chunk) for chunk in chunks]


def _start(rng: random.Random, classes: tuple[str, ...] | list[str]) -> Start:
    """One of the official initial states restricted to ``classes``, a fresh copy."""
    states = _states(tuple(classes))
    if not states:
        raise ValueError(f"no official initial state involves any of {list(classes)}")
    config, involved = states[rng.randrange(len(states))]
    return json.loads(config), list(involved)


@lru_cache(maxsize=8)
def _states(classes: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`environment_states` of ``classes``, kept as text: every walk takes its own copy of the state it starts from."""
    return tuple((json.dumps(config), tuple(involved)) for config, involved in environment_states(list(classes)))


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
    """A walk of ``num_steps`` calls on fresh instances (`envs.exploration.explore`); a tool that needs a login is
    preceded by the login call."""
    return exploration.explore(BfclWorld(initial_config, involved_classes), rng, num_steps, focus_tools, run_id)


# A task from an exploration run on fresh instances (`envs.exploration.abstract`), or None when fewer than
# ``min_steps`` calls are usable: abstract(triplets, initial_config, involved_classes, provenance, ...).
abstract = partial(exploration.abstract, BfclWorld)


def replay(task: Task, env: Environment) -> tuple[bool, str, bool]:
    """Run the reference in a fresh environment of ``env``'s kind (`Environment.replay`)."""
    return env.replay(task)


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
    """``n`` distinct tasks from unguided exploration of the official initial states of ``classes`` (the default
    classes when None), reproducible from ``seed`` (`envs.exploration.build_tasks`)."""
    return exploration.build_tasks(
        BfclWorld, n, seed, origin, exclude, min_steps, max_steps, calls_per_turn,
        start=lambda rng: _start(rng, classes or DEFAULT_CLASSES),
    )  # fmt: skip
