"""The workplace environment: a person's mail, calendar, contacts and project tasks, and its tasks.

An episode plays one Task: the model's calls run on one private copy of the task's initial state, the reference
runs turn by turn on a second copy, and each turn is judged as BFCL's turns are (envs/bfcl/environment.py): when
the turn ends, the two states must be equal, and every lookup the reference made (a search, a listing, a free
slot) must have been answered to the model too, with the same result. Its tasks are made by envs/exploration.py
in the workplace's worlds (envs/workplace/explorer.py); its demonstrations wait for a lookup's result before a call
that needs it. It has no official benchmark.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from coevolve.records import Message, Task, ToolCall
from envs.base import Environment, StepOutcome, World
from envs.calls import parse_tool_calls
from envs.workplace.apps import copy_state
from envs.workplace.explorer import ENVIRONMENT_NAME, WorkplaceWorld
from envs.workplace.session import TABLES, check_initial_config
from envs.workplace.tools import BY_NAME, is_ok, run_call, schemas, tool_line, tools_of
from envs.workplace.world import weekday

if TYPE_CHECKING:
    from coevolve.config import EnvironmentConfig

TOOL_LISTS = ("described", "signatures", "names")
INSTRUCTION = "Reply with a python list of calls like [f(a=1), g(b='x')]; reply done when the request is complete."


class WorkplaceEnvironment(Environment):
    """One episode at a time on a workplace state, and the workplace's tasks; implements envs.base.Environment."""

    name: ClassVar[str] = ENVIRONMENT_NAME
    world_type: ClassVar[type[World]] = WorkplaceWorld
    shipped_checkpoint: ClassVar[Path | None] = Path(__file__).resolve().parent / "checkpoint0"

    def __init__(
        self,
        max_steps_per_turn: int = 4,
        max_observation_chars: int = 240,
        stop_on_failure: bool = True,
        tool_list: str = "described",
    ):
        if tool_list not in TOOL_LISTS:
            raise ValueError(f"tool_list must be one of {TOOL_LISTS}, not {tool_list!r}")
        self.max_steps_per_turn = max_steps_per_turn
        self.max_observation_chars = max_observation_chars
        # A failed turn already fixes the reward at 0; stopping saves the rest of the rollout.
        self.stop_on_failure = stop_on_failure
        self.tool_list = tool_list
        self._task: Task | None = None
        self._apps: list[str] = []
        self._model: dict[str, Any] = {}
        self._truth: dict[str, Any] = {}
        self._turn = 0

    @classmethod
    def from_config(cls, config: EnvironmentConfig) -> WorkplaceEnvironment:
        """The environment of the ``environment`` section; it writes only the compact prompts (the section refuses
        prompt_style 'bfcl' for it)."""
        return cls(
            max_steps_per_turn=config.max_steps_per_turn,
            max_observation_chars=config.max_observation_chars,
            tool_list=config.tool_list,
        )

    # -- episode -------------------------------------------------------------------------------
    def _reset_task(self) -> Task:
        if self._task is None:
            raise RuntimeError("The environment has no task yet; call reset(task) first.")
        return self._task

    def reset(self, task: Task) -> list[Message]:
        check_initial_config(task.initial_config, task.involved_classes)
        self._task = task
        self._apps = list(task.involved_classes)
        self._model = copy_state(task.initial_config)
        self._truth = copy_state(task.initial_config)
        self._turn = 0
        self._steps_in_turn = 0
        self._turn_called = False
        self._all_results: list[str] = []
        self._failure: dict[str, Any] | None = None
        self._done = False
        return [Message("system", self.system_prompt()), Message("user", task.turns[0])]

    def system_prompt(self) -> str:
        owner, today = self._model["owner"], self._model["today"]
        who = f"You manage the work apps of {owner['name']} <{owner['email']}>; today is {weekday(today)} {today}."
        lines = [tool_line(tool.name, self.tool_list) for tool in tools_of(self._apps)]
        return who + "\nTools:\n" + "\n".join(lines) + "\n" + INSTRUCTION

    def step(self, model_text: str) -> StepOutcome:
        if self._task is None or self._done:
            return StepOutcome(error="the episode is over", turn_ended=True, done=True)
        calls, error = parse_tool_calls(model_text)
        self._steps_in_turn += 1
        outcome = StepOutcome(calls=calls, error=error)
        if calls:
            outcome.observations = self.execute(calls)
            self._all_results.extend(outcome.observations)
            self._turn_called = True
            lines = [
                f"{c.name} -> {o[: self.max_observation_chars]}"
                for c, o in zip(calls, outcome.observations, strict=True)
            ]
            outcome.messages.append(Message("tool", "\n".join(lines)))
        if not calls or self._steps_in_turn >= self.max_steps_per_turn:
            outcome.turn_ended = True
            if self._end_turn():
                outcome.done = True
            else:
                outcome.messages.append(Message("user", self._reset_task().turns[self._turn]))
        return outcome

    def _end_turn(self) -> bool:
        """Judge the turn that ends and move to the next; whether the episode is over."""
        task = self._reset_task()
        reference = task.reference[self._turn] if self._turn < len(task.reference) else []
        answers = [run_call(self._truth, self._apps, call) for call in reference]
        if self._failure is None:
            self._failure = self._check_turn(reference, answers)
        self._turn += 1
        self._steps_in_turn = 0
        self._turn_called = False
        if self._turn >= len(task.turns) or (self._failure is not None and self.stop_on_failure):
            self._done = True
        return self._done

    def _check_turn(self, reference: list[ToolCall], answers: list[str]) -> dict[str, Any] | None:
        turn = self._turn
        if not reference:
            return None
        if not self._turn_called:
            return _failure(turn, "empty_turn", f"no tool was called in turn {turn}")
        if self._model != self._truth:
            differences = state_differences(self._model, self._truth)
            return _failure(turn, "state_mismatch", f"the state differs after turn {turn}", differences=differences)
        missing = [
            answer
            for call, answer in zip(reference, answers, strict=True)
            if call.name in BY_NAME and BY_NAME[call.name].reads and is_ok(answer)
            and answer not in self._all_results
        ]  # fmt: skip
        if missing:
            return _failure(turn, "missing_lookup", f"a lookup of turn {turn} was not made", missing=missing)
        return None

    def score(self) -> tuple[float, bool, dict[str, Any]]:
        if self._failure is not None:
            return 0.0, False, dict(self._failure)
        if not self._done:
            return 0.0, False, _failure(self._turn, "unfinished", f"the episode stopped in turn {self._turn}")
        return 1.0, True, {"turns": len(self._task.turns) if self._task else 0}

    def demonstration_messages(self, calls: list[ToolCall]) -> list[list[ToolCall]]:
        """A turn's calls in one message, except that a call needing a value a lookup of the message returns (a value
        the request refers to instead of naming it: "email them", "read that message", "book it in that slot") starts
        the next message, written once the lookup's result is in: the policy learns to wait for what it must read."""
        request = self._reset_task().turns[self._turn]
        state = copy_state(self._model)
        messages: list[list[ToolCall]] = [[]]
        results: list[str] = []  # of the calls of the message being written
        for call in calls:
            looked_up = [v for v in _values(call) if repr(v) not in request and any(v in r for r in results)]
            if looked_up and messages[-1]:
                messages.append([])
                results = []
            messages[-1].append(call)
            results.append(run_call(state, self._apps, call))
        return messages

    # -- direct access (explorers, validators) ---------------------------------------------------
    def execute(self, calls: list[ToolCall]) -> list[str]:
        self._reset_task()
        return [run_call(self._model, self._apps, call) for call in calls]

    def state(self) -> dict[str, Any]:
        return dict(copy_state(self._model))

    def tool_names(self) -> list[str]:
        return sorted(tool.name for tool in tools_of(self._apps)) if self._task is not None else []

    @property
    def turn(self) -> int:
        return self._turn

    # -- tools -----------------------------------------------------------------------------------
    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return schemas(task.involved_classes)


def state_differences(model: dict[str, Any], truth: dict[str, Any], limit: int = 2000) -> str:
    """Where two workplace states differ: per app, the records that are missing, extra or changed."""
    lines: list[str] = []
    for key in sorted(set(model) | set(truth)):
        mine, theirs = model.get(key), truth.get(key)
        if mine == theirs:
            continue
        table = TABLES.get(key)
        if table is None or not isinstance(mine, dict) or not isinstance(theirs, dict):
            lines.append(f"{key}: {mine!r} != {theirs!r}")
            continue
        ours, wanted = mine.get(table, {}), theirs.get(table, {})
        for record in sorted(set(ours) | set(wanted)):
            if ours.get(record) != wanted.get(record):
                lines.append(f"{key}.{record}: {ours.get(record)!r} != expected {wanted.get(record)!r}")
        if mine.get("next_id") != theirs.get("next_id"):
            lines.append(f"{key}.next_id: {mine.get('next_id')} != expected {theirs.get('next_id')}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "..."


def _values(call: ToolCall) -> list[str]:
    """The text values of a call's arguments, list items included: what a request names or refers to."""
    values: list[str] = []
    for value in call.arguments.values():
        values.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and len(v) > 1)
    return values


def _failure(turn: int, error_type: str, message: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"turn": turn, "error_type": error_type, "error_message": message}
    details.update(extra)
    return details
