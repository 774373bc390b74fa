"""The BFCL v3 multi-turn environment: episodes, turn checking like bfcl-eval, and the environment's tasks.

An episode plays one Task: the model's calls run on one private set of API instances, the task's
reference runs turn by turn on a second set, and each turn is checked as bfcl-eval's
``multi_turn_checker`` does (same public state, reference results among the model's results).
Its tasks are made by envs/exploration.py in BFCL's worlds (envs/bfcl/explorer.py), the official
entries envs/bfcl/official.py's, and the prompts of prompt_style 'bfcl' envs/bfcl/prompts.py's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker

import envs.bfcl.api as bfcl_api
from coevolve.errors import ConfigError
from coevolve.optional import optional_module
from coevolve.records import Message, Task, ToolCall
from envs.base import Environment, StepOutcome, World
from envs.bfcl.explorer import BfclWorld
from envs.bfcl.official import CATEGORIES, OfficialMeta, multi_turn_overall, official_meta, official_tasks
from envs.bfcl.settings import BfclSettings
from envs.bfcl.state import state_check
from envs.calls import POSITIONAL_PREFIX, parse_tool_calls

# The prompts of prompt_style 'bfcl' load bfcl-eval's model handlers (and openai's types): seconds, needed only
# when an episode plays with that style.
if TYPE_CHECKING:
    import envs.bfcl.prompts as bfcl_prompts
    from coevolve.config import EnvironmentConfig
else:
    bfcl_prompts = optional_module("envs.bfcl.prompts")

ENVIRONMENT_NAME = bfcl_api.ENVIRONMENT_NAME
TOOL_LISTS = ("described", "signatures", "names")
INSTRUCTION = "Reply with a python list of calls like [f(a=1), g(b='x')]; reply done when the request is complete."
# bfcl-eval's MAXIMUM_STEP_LIMIT (constants/default_prompts.py): steps one turn may execute in its loop.
TURN_STEP_LIMIT = 20


class BfclEnvironment(Environment):
    """One episode at a time on BFCL API classes, and BFCL's tasks; implements envs.base.Environment."""

    name: ClassVar[str] = ENVIRONMENT_NAME
    world_type: ClassVar[type[World]] = BfclWorld
    official_categories: ClassVar[tuple[str, ...]] = CATEGORIES
    # The paper's protocol: all 200 multi_turn_base entries.
    default_categories: ClassVar[tuple[str, ...]] = ("multi_turn_base",)
    overall_name: ClassVar[str] = "multi_turn_overall"
    shipped_checkpoint: ClassVar[Path | None] = Path(__file__).resolve().parent / "checkpoint0"

    def __init__(
        self,
        max_steps_per_turn: int = 4,
        max_observation_chars: int = 240,
        stop_on_failure: bool = True,
        tool_list: str = "described",
        irrelevance_check: bool = False,
        bfcl_loop: bool = False,
        handler: str | None = None,
    ):
        self.max_steps_per_turn = max_steps_per_turn
        # bfcl-eval's multi-turn loop (prompt_style 'bfcl'): a reply without calls, or one that does not
        # parse, ends the turn; results are not cut; a turn that executes more than TURN_STEP_LIMIT steps
        # quits the whole entry as a failure. The conversation's messages are kept by envs/bfcl/prompts.py.
        self.bfcl_loop = bfcl_loop
        if tool_list not in TOOL_LISTS:
            raise ValueError(f"tool_list must be one of {TOOL_LISTS}, not {tool_list!r}")
        # Shorter lists suit small models with short contexts: they train and generate several
        # times faster, and learn the tools' arguments from demonstrations instead.
        self.tool_list = tool_list
        self.max_observation_chars = max_observation_chars
        # A failed turn already fixes the reward at 0; stopping saves the rest of the rollout.
        self.stop_on_failure = stop_on_failure
        # bfcl-eval's multi-turn runner never calls its multi_turn_irrelevance_checker: calls in a turn
        # whose reference is empty run (and can break the next turn's state check) but do not fail it.
        # Off matches the official scores; on also fails such a turn at once, as that checker would.
        self.irrelevance_check = irrelevance_check
        # The bfcl-eval handler family whose conversation a bfcl-loop episode is prompted with (envs/bfcl/prompts.py).
        self.handler = handler
        self._task: Task | None = None
        self._meta: OfficialMeta | None = None
        self._model: dict[str, Any] = {}
        self._truth: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: EnvironmentConfig) -> BfclEnvironment:
        """The environment of the ``environment`` section; prompt_style 'bfcl' plays bfcl-eval's multi-turn loop."""
        settings = BfclSettings.of(config)
        return cls(
            max_steps_per_turn=config.max_steps_per_turn,
            max_observation_chars=config.max_observation_chars,
            tool_list=config.tool_list,
            bfcl_loop=settings.prompt_style == "bfcl",
            handler=settings.bfcl_handler,
        )

    # -- episode -------------------------------------------------------------------------------
    def _reset_task(self) -> Task:
        """The task the environment was last reset with."""
        if self._task is None:
            raise RuntimeError("The environment has no task yet; call reset(task) first.")
        return self._task

    def reset(self, task: Task) -> list[Message]:
        meta = official_meta(task)
        long_context = bool(meta and meta.long_context)
        self._task = task
        self._meta = meta
        self._model = bfcl_api.new_instances(task.initial_config, task.involved_classes, long_context)
        self._truth = bfcl_api.new_instances(task.initial_config, task.involved_classes, long_context)
        self._tool_classes = bfcl_api.class_of_tool(task.involved_classes)
        self._model_table = bfcl_api.method_table(self._model)
        self._truth_table = bfcl_api.method_table(self._truth)
        self._turn = 0
        self._steps_in_turn = 0
        self._turn_called = False
        self._all_results: list[str] = []
        self._failure: dict[str, Any] | None = None
        self._done = False
        return [Message("system", self.system_prompt()), Message("user", task.turns[0])]

    def system_prompt(self) -> str:
        hidden: set[str] = set()
        if self._meta is not None:
            hidden.update(self._meta.excluded)
            for names in self._meta.missed.values():
                hidden.update(names)
        lines = [
            bfcl_api.tool_line(doc, self.tool_list)
            for cls in self._reset_task().involved_classes
            for doc in bfcl_api.func_docs(cls)
            if doc["name"] not in hidden
        ]
        return "Tools:\n" + "\n".join(lines) + "\n" + INSTRUCTION

    def step(self, model_text: str) -> StepOutcome:
        if self._task is None or self._done:
            return StepOutcome(error="the episode is over", turn_ended=True, done=True)
        if self.bfcl_loop:
            return self._bfcl_step(model_text)
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

    def _bfcl_step(self, model_text: str) -> StepOutcome:
        calls, error = parse_tool_calls(model_text, bracketed=True)
        # bfcl-eval's python-call decoder keeps keyword arguments only: ``sort('a.txt')`` runs as
        # ``sort()`` there (and fails), so it does here too.
        calls = [
            ToolCall(c.name, {k: v for k, v in c.arguments.items() if not k.startswith(POSITIONAL_PREFIX)})
            for c in calls
        ]
        outcome = StepOutcome(calls=calls, error=error)
        if not calls:
            outcome.turn_ended = True
            outcome.done = self._end_turn()
            return outcome
        outcome.observations = self.execute(calls)
        self._all_results.extend(outcome.observations)
        self._turn_called = True
        self._steps_in_turn += 1
        if self._steps_in_turn > TURN_STEP_LIMIT:
            if self._failure is None:
                message = f"Model has been forced to quit after {TURN_STEP_LIMIT} steps in turn {self._turn}."
                self._failure = _failure(self._turn, "multi_turn:force_quit", message)
            self._done = True
            outcome.turn_ended = outcome.done = True
        return outcome

    def _end_turn(self) -> bool:
        """Score the turn that ends and move to the next; whether the episode is over."""
        task = self._reset_task()
        turn = self._turn
        reference = task.reference[turn] if turn < len(task.reference) else []
        truth_results = [bfcl_api.run_call(self._truth_table, self._tool_classes, c) for c in reference]
        if self._failure is None:
            self._failure = self._check_turn(turn, reference, truth_results)
        self._turn += 1
        self._steps_in_turn = 0
        self._turn_called = False
        if self._turn >= len(task.turns) or (self._failure is not None and self.stop_on_failure):
            self._done = True
        return self._done

    def _check_turn(self, turn: int, reference: list[ToolCall], truth_results: list[str]) -> dict[str, Any] | None:
        if not reference:
            if self._turn_called and self.irrelevance_check:
                return _failure(
                    turn,
                    "multi_turn:irrelevance_error:decoder_success",
                    f"Model outputs valid function calls when it should not for turn {turn}.",
                )
            return None
        if not self._turn_called:
            message = f"Model response list is empty for turn {turn}"
            return _failure(turn, "multi_turn:empty_turn_model_response", message)
        result = state_check(self._model, self._truth)
        if not result["valid"]:
            return _failure(turn, result["error_type"], result["error_message"], differences=result.get("details"))
        result = response_checker(self._all_results, truth_results, turn)
        if not result["valid"]:
            missing = result.get("details", {}).get("missing_items", [])
            return _failure(turn, result["error_type"], result["error_message"], missing_items=missing)
        return None

    def score(self) -> tuple[float, bool, dict[str, Any]]:
        if self._failure is not None:
            return 0.0, False, dict(self._failure)
        if not self._done:
            turn = self._turn
            return 0.0, False, _failure(turn, "unfinished", f"the episode stopped in turn {turn}")
        return 1.0, True, {"turns": len(self._task.turns) if self._task else 0}

    # -- direct access (explorers, validators) ---------------------------------------------------
    def execute(self, calls: list[ToolCall]) -> list[str]:
        return [bfcl_api.run_call(self._model_table, self._tool_classes, c) for c in calls]

    def state(self) -> dict[str, Any]:
        return bfcl_api.snapshot(self._model)

    def tool_names(self) -> list[str]:
        return sorted(self._tool_classes) if self._task is not None else []

    @property
    def turn(self) -> int:
        return self._turn

    # -- tools -----------------------------------------------------------------------------------
    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        """The official function docs of the task's classes, in class and file order."""
        return [copy.deepcopy(doc) for cls in task.involved_classes for doc in bfcl_api.func_docs(cls)]

    def tool_signatures(self, task: Task) -> list[str]:
        return [
            bfcl_api.tool_line(doc, "signatures") for cls in task.involved_classes for doc in bfcl_api.func_docs(cls)
        ]

    # -- prompts ---------------------------------------------------------------------------------
    def conversation(
        self, task: Task, render_chat: Callable[[list[dict[str, Any]]], str]
    ) -> bfcl_prompts.BfclConversation | None:
        """bfcl-eval's conversation with the handler family's model (prompt_style 'bfcl'), else None."""
        if not self.bfcl_loop:
            return None
        if self.handler is None:
            raise ConfigError(
                "environment.prompt_style is 'bfcl' but environment.bfcl_handler is unset; set it to qwen_fc, qwen, "
                "llama_3_1 or chat (a loaded configuration derives it from policy.model where the name says which)."
            )
        return bfcl_prompts.BfclConversation(self.handler, task, render_chat=render_chat)

    # -- official evaluation (envs/bfcl/official.py) ----------------------------------------------
    def official_category(self, name: str) -> str:
        """``base`` or ``multi_turn_base`` -> ``multi_turn_base``; an unknown name fails with the choices."""
        full = name if name.startswith("multi_turn_") else f"multi_turn_{name}"
        if full not in CATEGORIES:
            raise ConfigError(
                f"unknown BFCL category {name!r}; choose from {', '.join(CATEGORIES)} (or without 'multi_turn_')"
            )
        return full

    def official_tasks(self, category: str, limit: int | None = None) -> list[Task]:
        return official_tasks(category, limit)

    def official_overall(self, accuracies: Mapping[str, float]) -> float | None:
        return multi_turn_overall(accuracies)


def _failure(turn: int, error_type: str, message: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"turn": turn, "error_type": error_type, "error_message": message}
    for key, value in extra.items():
        # The checker's details hold live objects (directories, sets): keep them readable and storable.
        details[key] = _short(value)
    return details


def _short(value: Any, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
