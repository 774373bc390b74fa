"""The environment protocol every agent environment implements (BFCL now, an AppWorld adapter later).

Rollout, validation and exploration code only talk to this protocol, so a second environment only
needs a class with these methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from coevolve.records import Message, Task, ToolCall


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


@runtime_checkable
class Environment(Protocol):
    """A multi-turn tool environment that replays a task's reference and scores an episode."""

    def reset(self, task: Task) -> list[Message]:
        """Start an episode on fresh state; returns the system message and the first user message."""
        ...

    def step(self, model_text: str) -> StepOutcome:
        """Parse and execute one model message. Never raises on model output."""
        ...

    def score(self) -> tuple[float, bool, dict[str, Any]]:
        """Reward, success, and details of the first failure."""
        ...

    def execute(self, calls: list[ToolCall]) -> list[str]:
        """Execute calls on the episode's state outside the turn bookkeeping (explorers, validators)."""
        ...

    def state(self) -> dict[str, Any]:
        """A snapshot of the public state, comparable with ``==``."""
        ...

    def tool_names(self) -> list[str]:
        """Names of the tools the current task can call."""
        ...
