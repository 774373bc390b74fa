"""Parsing the LLM synthesizer's replies: JSON objects, the context, the next call, the written task.

Each parser returns the parsed value, or None with the reason the reply is rejected (tasks/synthesis/llm_synthesis.py
records it and goes on). Model output is only parsed here, never evaluated.
"""

from __future__ import annotations

import json
import re
from typing import Any

from coevolve.records import ToolCall
from envs.calls import parse_tool_calls

CONTEXT_KEYS = (
    "summary",
    "failure_cause",
    "instability_pattern",
    "focus_patterns",
    "exploration_objectives",
    "do_not_repeat",
)
# Longer replies are refused before parsing, as envs.calls does for policy output.
MAX_REPLY_CHARS = 20_000
MAX_QUERY_CHARS = 800
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def extract_json_object(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The first JSON object in a reply (bare, in a code fence, or inside prose), or a reason why none is there."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty reply"
    if len(text) > MAX_REPLY_CHARS:
        return None, f"reply longer than {MAX_REPLY_CHARS} characters"
    candidates = [text.strip(), *(block.strip() for block in _FENCE.findall(text))]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        start = candidate.find("{")
        tries = 0
        while start != -1 and tries < 20:
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, dict):
                return value, None
            start = candidate.find("{", start + 1)
            tries += 1
    return None, "no JSON object in the reply"


def _as_text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _as_text_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [_as_text(v) for v in value if _as_text(v)]
    text = _as_text(value)
    return [text] if text else []


def parse_context(text: str, known_tools: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """A validated signal-conditioned context from a reply, or the reason it is rejected.

    Focus patterns keep only tools the environment has; at least one must remain, otherwise the
    exploration would have nothing to focus on.
    """
    obj, error = extract_json_object(text)
    if obj is None:
        return None, f"context: {error}"
    missing = [k for k in CONTEXT_KEYS if k not in obj]
    if missing:
        return None, f"context: missing keys {missing}"
    focus_raw = obj["focus_patterns"]
    if isinstance(focus_raw, str):
        focus_raw = re.split(r"[\s,>]+", focus_raw)
    if not isinstance(focus_raw, list):
        return None, "context: focus_patterns is not a list of tool names"
    names: list[str] = []
    for item in focus_raw:
        # A pattern may be written as a sequence such as "cd>mv"; its tools are what the walk focuses on.
        for part in re.split(r"[\s,>()]+", item) if isinstance(item, str) else []:
            if part:
                names.append(part)
    known = set(known_tools)
    focus = list(dict.fromkeys(n for n in names if n in known))
    if not focus:
        return None, f"context: focus_patterns names no available tool (got {names[:8]})"
    context = {
        "summary": _as_text(obj["summary"]),
        "failure_cause": _as_text(obj["failure_cause"]),
        "instability_pattern": _as_text(obj["instability_pattern"]),
        "focus_patterns": focus,
        "exploration_objectives": _as_text_list(obj["exploration_objectives"]),
        "do_not_repeat": _as_text_list(obj["do_not_repeat"]),
    }
    if not context["exploration_objectives"]:
        return None, "context: exploration_objectives is empty"
    return context, None


def parse_next_call(text: str, allowed: list[str]) -> tuple[ToolCall | None, bool, str | None]:
    """(call, the run is done, rejection reason) from an exploration reply.

    ``DONE`` ends the run. Exactly one call is executed per step: extra calls in the reply are
    ignored, so each observation the model sees answers exactly one action.
    """
    if not isinstance(text, str) or not text.strip():
        return None, False, "empty reply"
    stripped = text.strip()
    if stripped.strip("`*. ").upper() == "DONE":
        return None, True, None
    calls, error = parse_tool_calls(stripped, allowed=set(allowed))
    if error is not None:
        return None, False, error
    if not calls:
        return None, False, f"no tool call in the reply: {stripped[:80]!r}"
    return calls[0], False, None


def parse_abstraction(text: str) -> tuple[dict[str, str] | None, str | None]:
    """{"description", "query"} from a reply, or the reason it is rejected."""
    obj, error = extract_json_object(text)
    if obj is None:
        return None, f"query: {error}"
    out: dict[str, str] = {}
    for key in ("description", "query"):
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            return None, f"query: '{key}' is missing or not a non-empty string"
        if len(value) > MAX_QUERY_CHARS:
            return None, f"query: '{key}' longer than {MAX_QUERY_CHARS} characters"
        out[key] = " ".join(value.split())
    return out, None
