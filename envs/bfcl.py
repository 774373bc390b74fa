"""The BFCL v3 multi-turn environment: episodes, turn checking like bfcl-eval, and official tasks.

An episode plays one Task: the model's calls run on one private set of API instances, the task's
reference runs turn by turn on a second set, and each turn is checked as bfcl-eval's
``multi_turn_checker`` does (same public state, reference results among the model's results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

from coevolve.records import Message, Provenance, Task, ToolCall
from envs import bfcl_api
from envs.base import StepOutcome
from envs.calls import POSITIONAL_PREFIX, parse_tool_calls

ENVIRONMENT_NAME = "bfcl"
CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
TOOL_LISTS = ("described", "signatures", "names")
INSTRUCTION = "Reply with a python list of calls like [f(a=1), g(b='x')]; reply done when the request is complete."
REVEAL_PROMPT = "I have updated some more functions you can choose from. What about now?"
# bfcl-eval's MAXIMUM_STEP_LIMIT (constants/default_prompts.py): steps one turn may execute in its loop.
TURN_STEP_LIMIT = 20


@dataclass(frozen=True)
class OfficialMeta:
    """What an official entry needs beyond a Task: its id, context size and hidden functions."""

    entry_id: str
    category: str
    long_context: bool = False
    excluded: tuple[str, ...] = ()
    missed: dict[int, tuple[str, ...]] = field(default_factory=dict)


# Entry id -> meta. Keyed by entry id (kept in Task.description), not task_id: a long-context entry
# has the same content as its base entry, only the flag differs.
OFFICIAL_META: dict[str, OfficialMeta] = {}


def official_meta(task: Task) -> OfficialMeta | None:
    """Meta of an official task, loading its category when the task came from another process."""
    if task.provenance.origin != "official":
        return None
    entry_id = task.description
    if entry_id not in OFFICIAL_META:
        category = entry_id.rsplit("_", 1)[0]
        if category in CATEGORIES:
            official_tasks(category)
    return OFFICIAL_META.get(entry_id)


class BfclEnvironment:
    """One episode at a time on BFCL API classes; implements envs.base.Environment."""

    name = ENVIRONMENT_NAME

    def __init__(
        self,
        max_steps_per_turn: int = 4,
        max_observation_chars: int = 240,
        stop_on_failure: bool = True,
        tool_list: str = "described",
        irrelevance_check: bool = False,
        bfcl_loop: bool = False,
    ):
        self.max_steps_per_turn = max_steps_per_turn
        # bfcl-eval's multi-turn loop (prompt_style 'bfcl'): a reply without calls, or one that does not
        # parse, ends the turn; results are not cut; a turn that executes more than TURN_STEP_LIMIT steps
        # quits the whole entry as a failure. The conversation's messages are kept by envs/bfcl_prompts.py.
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
        self._task: Task | None = None
        self._model: dict[str, Any] = {}
        self._truth: dict[str, Any] = {}

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
        result = state_checker(self._model, self._truth)
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


def _failure(turn: int, error_type: str, message: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"turn": turn, "error_type": error_type, "error_message": message}
    for key, value in extra.items():
        # The checker's details hold live objects (directories, sets): keep them readable and storable.
        details[key] = _short(value)
    return details


def _short(value: Any, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- official entries ------------------------------------------------------------------------------
def _category(category: str) -> str:
    return category if category.startswith("multi_turn_") else f"multi_turn_{category}"


def official_tasks(category: str = "multi_turn_base", limit: int | None = None) -> list[Task]:
    """Official BFCL entries as Tasks (origin "official", description = entry id), registered in OFFICIAL_META.

    A long-context entry has the same task_id as its base twin; the entry id tells them apart.
    """
    category = _category(category)
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; choose one of {', '.join(CATEGORIES)}")
    entries = bfcl_api.load_jsonl(bfcl_api.DATA_DIR / f"BFCL_v4_{category}.json")
    answer_file = bfcl_api.DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json"
    answers = {a["id"]: a["ground_truth"] for a in bfcl_api.load_jsonl(answer_file)}
    tasks: list[Task] = []
    for entry in entries[:limit] if limit is not None else entries:
        classes = list(entry["involved_classes"])
        tool_classes = bfcl_api.class_of_tool(classes)
        missed = {int(k): tuple(v) for k, v in entry.get("missed_function", {}).items()}
        reference: list[list[ToolCall]] = []
        for turn_calls in answers[entry["id"]]:
            parsed = []
            for text in turn_calls:
                calls, error = parse_tool_calls(text)
                if error or len(calls) != 1:
                    raise ValueError(f"{entry['id']}: cannot parse reference call {text!r}: {error}")
                call = calls[0]
                if call.name in tool_classes:
                    call = bfcl_api.normalize_call(call, tool_classes[call.name])
                parsed.append(call)
            reference.append(parsed)
        turns = []
        for index, messages in enumerate(entry["question"]):
            text = "\n".join(m["content"] for m in messages if m.get("role") == "user")
            if not messages and index in missed:
                docs = {d["name"]: d for cls in classes for d in bfcl_api.func_docs(cls)}
                revealed = [bfcl_api.tool_line(docs[n]) for n in missed[index] if n in docs]
                text = "\n".join(revealed + [REVEAL_PROMPT])
            turns.append(text)
        task = Task(
            environment=ENVIRONMENT_NAME,
            initial_config=entry["initial_config"],
            involved_classes=classes,
            turns=turns,
            reference=reference,
            provenance=Provenance(origin="official"),
            description=entry["id"],
        )
        OFFICIAL_META[entry["id"]] = OfficialMeta(
            entry_id=entry["id"],
            category=category,
            long_context="long_context" in category,
            excluded=tuple(entry.get("excluded_function", [])),
            missed=missed,
        )
        tasks.append(task)
    return tasks
