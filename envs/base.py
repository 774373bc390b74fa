"""The contract of an agent environment: everything the loop asks of one (BFCL now, an AppWorld adapter later).

Rollout, validation, synthesis, the splits and evaluation only talk to `Environment`; envs/registry.py is the one
place that names an implementation, by ``environment.name`` (built-in ones and those installed packages declare
under the entry-point group ``coevolve.environments``). An instance is built from the configuration with
``from_config`` and plays one episode at a time; the same instance answers for the environment as a whole
(its seed pool, exploration, replay, demonstrations, prompts and official evaluation), which never touches the
episode's state unless a method says so.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from coevolve.errors import ConfigError
from coevolve.records import Message, Provenance, Task, ToolCall

if TYPE_CHECKING:
    from coevolve.config import EnvironmentConfig


@dataclass
class StepOutcome:
    """What the environment made of one model message.

    ``messages`` are appended to the conversation after the model's message: a ``tool`` message with
    the results when calls were made, then the next ``user`` message when the turn ended and another
    turn follows.
    """

    calls: list[ToolCall] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    error: str | None = None
    messages: list[Message] = field(default_factory=list)
    turn_ended: bool = False
    done: bool = False


@dataclass(frozen=True)
class Triplet:
    """One exploration step: the call, what the environment answered, and what it did to the state."""

    action: ToolCall
    observation: str
    run_id: str
    ok: bool
    state_changed: bool


class Conversation(Protocol):
    """An episode's prompts written the way an environment's own benchmark writes them (``prompt_style``)."""

    def text(self) -> str:
        """The prompt of the next step, ending where the model's reply begins."""
        ...

    def advance(self, reply: str, env: Environment) -> StepOutcome:
        """Keep the reply, play it in ``env`` (the episode's environment), keep what the environment answered."""
        ...


# One unguided walk: draws a start and a length from ``rng``, explores and abstracts the walk into a task (None when
# it made too few usable calls). ``run_id`` names the walk's exploration run.
Walk = Callable[[random.Random, str], Task | None]


def tasks_from_walks(n: int, seed: int, origin: str, exclude: set[str] | frozenset[str], walk: Walk) -> list[Task]:
    """``n`` distinct tasks, none with an id in ``exclude``, each from one ``walk`` on one random stream seeded by
    ``seed``: how every environment's `Environment.build_tasks` makes the seed pool and the splits. Gives up after
    50 walks a task, returning fewer."""
    rng = random.Random(seed)
    tasks: dict[str, Task] = {}
    attempts = 0
    while len(tasks) < n and attempts < 50 * n:
        attempts += 1
        task = walk(rng, f"{origin}-{seed}-{attempts}")
        if task is not None and task.task_id not in exclude and task.task_id not in tasks:
            tasks[task.task_id] = task
    return list(tasks.values())


class Environment(ABC):
    """A multi-turn tool environment: plays a task's episode and scores it, and makes and checks the tasks.

    Episode (one at a time, from ``reset``): ``reset``, ``step``, ``score``, ``execute``, ``state``,
    ``tool_names``, ``turn``. Tasks: ``tool_schemas``/``tool_signatures``, ``build_tasks``/``in_turns`` (the
    seed pool and the held-out, dev and final splits), ``explore``/``explore_call``/``abstract`` (synthesis),
    ``replay`` (validation), ``demonstration`` (checkpoint 0's fine-tuning set). Prompts: ``reset``'s
    messages, or ``conversation`` where the environment writes them itself. Evaluation: the ``official_*``
    members, where the environment has an official benchmark (none by default).
    """

    # The value of environment.name that picks this environment, and Task.environment of the tasks it makes.
    name: ClassVar[str]
    # The environment's official evaluation splits, those `coevolve evaluate` scores by default, and the name of
    # their overall score (``official_overall``); none where the environment has no official benchmark.
    official_categories: ClassVar[tuple[str, ...]] = ()
    default_categories: ClassVar[tuple[str, ...]] = ()
    overall_name: ClassVar[str] = "overall"
    # The embedded policy's checkpoint 0 for the default settings on this environment, shipped beside the code
    # (a folder, and its record in the .json of the same name; agent/shipped_policy.py) so a first run starts at
    # round 0 instead of spending minutes on SFT. `make policy` rebuilds it; None builds it in every new state folder.
    shipped_checkpoint: ClassVar[Path | None] = None

    @classmethod
    @abstractmethod
    def from_config(cls, config: EnvironmentConfig) -> Environment:
        """A fresh environment set up as the ``environment`` section says (one per episode)."""

    # -- episode -------------------------------------------------------------------------------
    @abstractmethod
    def reset(self, task: Task) -> list[Message]:
        """Start an episode on fresh state; returns the system message and the first user message."""

    @abstractmethod
    def step(self, model_text: str) -> StepOutcome:
        """Parse and execute one model message. Never raises on model output."""

    @abstractmethod
    def score(self) -> tuple[float, bool, dict[str, Any]]:
        """Reward, success, and details of the first failure."""

    @abstractmethod
    def execute(self, calls: list[ToolCall]) -> list[str]:
        """Execute calls on the episode's state outside the turn bookkeeping (explorers, validators)."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """A snapshot of the public state, comparable with ``==``."""

    @abstractmethod
    def tool_names(self) -> list[str]:
        """Names of the tools the current task can call."""

    @property
    @abstractmethod
    def turn(self) -> int:
        """The index of the user turn the episode is in."""

    # -- tools ---------------------------------------------------------------------------------
    @abstractmethod
    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        """The documentation of every tool ``task`` involves (name, description, JSON-schema parameters)."""

    def tool_signatures(self, task: Task) -> list[str]:
        """One line per tool of ``task``, ``name(param: type, opt: type = default)``, for a synthesizer's prompts."""
        lines = []
        for schema in self.tool_schemas(task):
            parameters = schema.get("parameters", {})
            required = set(parameters.get("required", []))
            params = [
                f"{name}: {spec.get('type', 'any')}" + ("" if name in required else f" = {spec.get('default')!r}")
                for name, spec in parameters.get("properties", {}).items()
            ]
            lines.append(f"{schema['name']}({', '.join(params)})")
        return lines

    # -- tasks ---------------------------------------------------------------------------------
    @abstractmethod
    def build_tasks(
        self,
        n: int,
        seed: int,
        origin: str = "seed",
        exclude: set[str] | frozenset[str] = frozenset(),
        min_steps: int = 3,
        max_steps: int = 5,
        calls_per_turn: int | None = None,
    ) -> list[Task]:
        """``n`` distinct tasks from unguided exploration, reproducible from ``seed``, none with an id in
        ``exclude``: the seed pool and every split are built with this (tasks/splits.py chooses the seeds).

        Each task's reference has ``min_steps`` to ``max_steps`` calls; ``calls_per_turn`` spreads them over
        user turns (``in_turns``), None keeps one turn.
        """

    @abstractmethod
    def in_turns(self, task: Task, calls_per_turn: int | None) -> Task:
        """The same job as user turns of at most ``calls_per_turn`` consecutive calls; None leaves it as it is."""

    @abstractmethod
    def explore(
        self,
        start: Task,
        rng: random.Random,
        num_steps: int,
        focus_tools: list[str] | None = None,
        run_id: str = "x",
    ) -> list[Triplet]:
        """``num_steps`` exploration calls from ``start``'s initial state on fresh state, favouring ``focus_tools``."""

    @abstractmethod
    def explore_call(self, call: ToolCall, run_id: str) -> Triplet:
        """Execute one exploration call in the episode (after ``reset``) and record it as a step of run ``run_id``."""

    @abstractmethod
    def abstract(
        self,
        triplets: list[Triplet],
        start: Task,
        provenance: Provenance,
        min_steps: int = 3,
        max_steps: int = 5,
        calls_per_turn: int | None = None,
    ) -> Task | None:
        """A task from ``start``'s initial state whose reference is a minimal sequence of the run's calls that
        replays cleanly, or None when fewer than ``min_steps`` calls are usable."""

    @abstractmethod
    def replay(self, task: Task) -> tuple[bool, str, bool]:
        """Run the reference on fresh state: (every call succeeded, reason, the state changed)."""

    def demonstration(self, task: Task) -> list[Message]:
        """The expert conversation on ``task``, played in this environment: per turn the reference calls in one
        message, then ``done`` where the calls did not end the turn."""
        messages = self.reset(task)
        for reference in task.reference:
            turn_ended = False
            if reference:
                text = "[" + ", ".join(call.render() for call in reference) + "]"
                outcome = self.step(text)
                messages.append(Message("assistant", text))
                messages.extend(outcome.messages)
                turn_ended = outcome.turn_ended
            if not turn_ended:
                outcome = self.step("done")
                messages.append(Message("assistant", "done"))
                messages.extend(outcome.messages)
            if outcome.done:
                break
        return messages

    # -- prompts -------------------------------------------------------------------------------
    def conversation(self, task: Task, render_chat: Callable[[list[dict[str, Any]]], str]) -> Conversation | None:
        """The episode's prompts as the environment's own benchmark writes them, for ``task`` just ``reset``;
        None keeps the project's compact prompts (``reset``'s and ``step``'s messages in the model's chat format).

        ``render_chat`` renders a message list with the model's chat template.
        """
        return None

    # -- official evaluation -------------------------------------------------------------------
    def official_category(self, name: str) -> str:
        """The official split ``name`` stands for; an unknown name fails with the choices."""
        if name in self.official_categories:
            return name
        choices = ", ".join(self.official_categories) or "none: it has no official benchmark"
        raise ConfigError(f"unknown {self.name} category {name!r}; choose from {choices}")

    def official_tasks(self, category: str, limit: int | None = None) -> list[Task]:
        """The entries of an official split, as tasks (the first ``limit``)."""
        raise ConfigError(f"environment {self.name!r} has no official category {category!r}")

    def official_overall(self, accuracies: Mapping[str, float]) -> float | None:
        """The official overall score of per-split accuracies (``overall_name``); None when it has none."""
        return None
