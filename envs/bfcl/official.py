"""The official BFCL v3 multi-turn entries as tasks, and what an entry needs beyond a Task.

An official task keeps its entry id in ``Task.description``; its category, context size and hidden
functions are registered in ``OFFICIAL_META`` when the category is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import envs.bfcl.api as bfcl_api
from coevolve.records import Provenance, Task, ToolCall
from envs.calls import parse_tool_calls

CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
REVEAL_PROMPT = "I have updated some more functions you can choose from. What about now?"


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
            environment=bfcl_api.ENVIRONMENT_NAME,
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


def multi_turn_overall(accuracies: Mapping[str, float]) -> float | None:
    """The BFCL leaderboard's multi-turn overall: the unweighted mean of the four multi-turn categories.

    As bfcl-eval computes it (``calculate_unweighted_accuracy`` over multi_turn_base, miss_func,
    miss_param and long_context in ``generate_leaderboard_csv``, bfcl_eval/eval_checker/
    eval_runner_helper.py): each category weighs the same whatever its entry count, and a category
    that was not evaluated counts as 0. None when no multi-turn category was evaluated at all.
    """
    if not any(category in accuracies for category in CATEGORIES):
        return None
    return sum(accuracies.get(category, 0.0) for category in CATEGORIES) / len(CATEGORIES)
