"""The contract of an agent environment: everything the loop asks of one (BFCL now, an AppWorld adapter later).

Rollout, validation, synthesis, the splits and evaluation only talk to `Environment`; envs/registry.py is the one
place that names an implementation, by ``environment.name`` (built-in ones and those installed packages declare
under the entry-point group ``coevolve.environments``). An instance is built from the configuration with
``from_config`` and plays one episode at a time; the same instance answers for the environment as a whole
(its seed pool, exploration, replay, demonstrations, prompts and official evaluation), which never touches the
episode's state unless a method says so.

An environment writes its episodes and its tools; the method's task making (the exploration walk, abstraction,
turns, replay, the seed pool and splits) is written once, in envs/exploration.py and the final methods here, and
reaches the environment's state through its `World` (``world_type``).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, final

import envs.exploration as exploration
from coevolve.config import EnvironmentConfig
from coevolve.errors import ConfigError
from coevolve.records import Message, Provenance, Task, ToolCall
from envs.exploration import Triplet, World

__all__ = ["Conversation", "Environment", "StepOutcome", "Triplet", "World"]


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


class Conversation(Protocol):
    """An episode's prompts written the way an environment's own benchmark writes them (``prompt_style``)."""

    def text(self) -> str:
        """The prompt of the next step, ending where the model's reply begins."""
        ...

    def advance(self, reply: str, env: Environment) -> StepOutcome:
        """Keep the reply, play it in ``env`` (the episode's environment), keep what the environment answered."""
        ...


class Environment(ABC):
    """A multi-turn tool environment: plays a task's episode and scores it, and makes and checks the tasks.

    What an environment writes (the abstract members, and ``name`` and ``world_type``): the episode, one at a time
    from ``reset`` (``reset``, ``step``, ``score``, ``execute``, ``state``, ``tool_names``), its tools
    (``tool_schemas``) and its `World`, the hooks task making reaches its state through. What it inherits, final:
    ``build_tasks``/``in_turns`` (the seed pool and the held-out, dev and final splits), ``explore``/
    ``explore_call``/``abstract`` (synthesis), ``replay`` (validation), ``demonstration`` (checkpoint 0's
    fine-tuning set; ``demonstration_messages`` says how a turn's calls are written). Prompts: ``reset``'s
    messages, or ``conversation`` where the environment writes them itself. Evaluation: the ``official_*``
    members, where the environment has an official benchmark (none by default).
    """

    # The value of environment.name that picks this environment, and Task.environment of the tasks it makes.
    name: ClassVar[str]
    # The worlds its tasks are made in (envs/exploration.py): a private copy of an initial state and its hooks.
    world_type: ClassVar[type[World]]
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

    # -- tasks (envs/exploration.py) -------------------------------------------------------------
    @final
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
        """``n`` distinct tasks from unguided exploration, reproducible from ``seed``, none whose id or identity is
        in ``exclude``: the seed pool and every split are built with this (tasks/splits.py chooses the seeds and
        passes the earlier splits' ids and identities, so the splits share no task, however worded).

        Each task's reference has ``min_steps`` to ``max_steps`` calls; ``calls_per_turn`` spreads them over
        user turns (``in_turns``), None keeps one turn.
        """
        return exploration.build_tasks(self.world_type, n, seed, origin, exclude, min_steps, max_steps, calls_per_turn)

    @final
    def in_turns(self, task: Task, calls_per_turn: int | None) -> Task:
        """The same job as user turns of at most ``calls_per_turn`` consecutive calls; None leaves it as it is."""
        return exploration.in_turns(self.world_type, task, calls_per_turn)

    @final
    def explore(
        self,
        start: Task,
        rng: random.Random,
        num_steps: int,
        focus_tools: list[str] | None = None,
        run_id: str = "x",
    ) -> list[Triplet]:
        """``num_steps`` exploration calls from ``start``'s initial state on fresh state, favouring ``focus_tools``."""
        world = self.world_type(start.initial_config, start.involved_classes)
        return exploration.explore(world, rng, num_steps, focus_tools, run_id)

    @final
    def explore_call(self, call: ToolCall, run_id: str) -> Triplet:
        """Execute one exploration call in the episode (after ``reset``) and record it as a step of run ``run_id``."""
        before = self.state()
        [observation] = self.execute([call])
        changed = not self.world_type.same_state(before, self.state())
        return Triplet(call, observation, run_id, self.world_type.succeeded(observation), changed)

    @final
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
        return exploration.abstract(
            self.world_type, triplets, start.initial_config, start.involved_classes, provenance,
            min_steps, max_steps, calls_per_turn,
        )  # fmt: skip

    @final
    def replay(self, task: Task) -> tuple[bool, str, bool]:
        """Run the reference on fresh state: (every call succeeded, reason, the state changed).

        On a fresh environment of the section's default settings: replay only executes calls and compares states.
        """
        env = self.from_config(EnvironmentConfig(name=self.name))
        try:
            env.reset(task)
        except Exception as exc:  # noqa: BLE001 - a synthesized state that cannot load is a rejection, not a crash
            return False, f"cannot build the environment: {exc}", False
        before = env.state()
        for turn_index, turn in enumerate(task.reference):
            for call_index, (call, result) in enumerate(zip(turn, env.execute(turn), strict=True)):
                if not self.world_type.succeeded(result):
                    return False, f"turn {turn_index} call {call_index} {call.render()} failed: {result[:200]}", False
        return True, "all reference calls succeeded", not self.world_type.same_state(before, env.state())

    @final
    def demonstration(self, task: Task) -> list[Message]:
        """The expert conversation on ``task``, played in this environment: per turn the reference calls in the
        messages ``demonstration_messages`` groups them into, then ``done`` where the calls did not end the turn."""
        messages = self.reset(task)
        for reference in task.reference:
            turn_ended = False
            for calls in self.demonstration_messages(reference) if reference else []:
                text = "[" + ", ".join(call.render() for call in calls) + "]"
                outcome = self.step(text)
                messages.append(Message("assistant", text))
                messages.extend(outcome.messages)
                turn_ended = outcome.turn_ended
                if turn_ended:
                    break
            if not turn_ended:
                outcome = self.step("done")
                messages.append(Message("assistant", "done"))
                messages.extend(outcome.messages)
            if outcome.done:
                break
        return messages

    def demonstration_messages(self, calls: list[ToolCall]) -> list[list[ToolCall]]:
        """How a demonstration writes a turn's reference calls (non-empty), played next in the episode: the messages
        in order, each a list of calls. One message by default."""
        return [calls]

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
