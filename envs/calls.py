"""Turn a model message into tool calls, without ever running anything.

These syntaxes are accepted because the policies the pipeline trains or evaluates emit them (and
bfcl-eval's handlers read them):

* BFCL python-call lists, ``[mkdir(dir_name='x'), cd(folder='y')]``, or one bare call (bfcl's
  prompting handlers: Qwen prompting, the generic chat format);
* Qwen/Hermes blocks, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several allowed;
  Qwen FC);
* Llama 3.1 JSON, ``{"name": ..., "parameters": {...}}``, several separated by ``;`` or in a list,
  optionally after ``<|python_tag|>``, also written as a python literal;
* OpenAI-style JSON, ``{"tool_calls": [{"function": {"name": ..., "arguments": ...}}]}``, or a JSON
  list of ``{"name", "arguments"}`` objects.

Parsing is AST/JSON only and every argument must be a literal. Positional arguments are kept under
``__pos0``, ``__pos1``...; the environment maps them to parameter names from the method signature.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

from coevolve.records import ToolCall

# The file name model output is compiled under. Text such as "2nd" makes the compiler warn (SyntaxWarning:
# invalid decimal literal) on every parse: noise in a run's log, not an error of the run, so it is silenced
# for this name only. A filter, not catch_warnings, because rollouts parse on several threads.
_SOURCE_NAME = "<model-output>"
warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(_SOURCE_NAME))

# Longer messages are refused before any parsing: ast/json on pathological input is slow or recursive.
MAX_TEXT_CHARS = 20_000
POSITIONAL_PREFIX = "__pos"

# Llama 3.1 may open a tool call with this token when special tokens are kept in the text.
_PYTHON_TAG = "<|python_tag|>"
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_CODE_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_LIST_OF_CALLS_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_BARE_CALL_START = re.compile(r"^\s*[A-Za-z_][\w.]*\s*\(")


class _ParseError(ValueError):
    """Internal: the message holds tool-call syntax that does not parse."""


def _json_friendly(value: Any) -> Any:
    """Tuples become lists; anything JSON cannot hold is refused, so calls can be stored as-is."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_friendly(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise _ParseError(f"unsupported dictionary key {k!r}")
            out[k if isinstance(k, str) else json.dumps(k)] = _json_friendly(v)
        return out
    raise _ParseError(f"unsupported argument value of type {type(value).__name__}")


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        # ``GorillaFileSystem.ls(...)``: the method name is what matters.
        return func.attr
    raise _ParseError("the called object is not a plain name")


def _from_call_node(node: ast.Call) -> ToolCall:
    name = _call_name(node.func)
    arguments: dict[str, Any] = {}
    for i, arg in enumerate(node.args):
        if isinstance(arg, ast.Starred):
            raise _ParseError(f"{name}: starred arguments are not allowed")
        arguments[f"{POSITIONAL_PREFIX}{i}"] = _literal(arg, name)
    for kw in node.keywords:
        if kw.arg is None:
            raise _ParseError(f"{name}: **kwargs are not allowed")
        arguments[kw.arg] = _literal(kw.value, name)
    return ToolCall(name=name, arguments=arguments)


def _literal(node: ast.expr, name: str) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise _ParseError(f"{name}: argument is not a literal ({type(exc).__name__})") from None
    return _json_friendly(value)


def _parse_python(source: str) -> list[ToolCall] | None:
    """Calls in python syntax; None when the source is valid python but holds no call at all."""
    tree = ast.parse(source.strip(), filename=_SOURCE_NAME, mode="eval")
    body = tree.body
    if isinstance(body, ast.Call):
        return [_from_call_node(body)]
    if isinstance(body, (ast.List, ast.Tuple)):
        if not any(isinstance(e, ast.Call) for e in body.elts):
            return None
        calls = []
        for i, element in enumerate(body.elts):
            if not isinstance(element, ast.Call):
                raise _ParseError(f"element {i} of the list is not a call")
            calls.append(_from_call_node(element))
        return calls
    return None


def _from_json_object(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise _ParseError("a tool call must be a JSON object")
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _ParseError("a tool call needs a string 'name'")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise _ParseError(f"{name}: 'arguments' must be an object")
    return ToolCall(name=name, arguments=_json_friendly(arguments))


def _parse_json(value: Any) -> list[ToolCall] | None:
    """Calls in a decoded JSON value; None when the value is not shaped like tool calls."""
    if isinstance(value, dict):
        if "tool_calls" in value:
            items = value["tool_calls"] or []
            if not isinstance(items, list):
                raise _ParseError("'tool_calls' must be a list")
            return [_from_json_object(item) for item in items]
        if "name" in value or "function" in value:
            return [_from_json_object(value)]
        return None
    if isinstance(value, list):
        if not value or not all(isinstance(v, dict) for v in value):
            return None
        return [_from_json_object(v) for v in value]
    return None


def _parse_tool_call_blocks(text: str) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for body in _TOOL_CALL_BLOCK.findall(text):
        body = body.strip()
        if not body:
            continue
        try:
            found = _parse_json(json.loads(body))
        except json.JSONDecodeError:
            found = _parse_python(body)
        if found is None:
            raise _ParseError("a <tool_call> block holds no call")
        calls.extend(found)
    return calls


def _embedded_list(text: str) -> list[ToolCall] | None:
    """A python call list inside prose, e.g. ``Sure: [ls(a=True)]``."""
    match = _LIST_OF_CALLS_START.search(text)
    if match is None:
        return None
    start = match.start()
    ends = [i for i, ch in enumerate(text) if ch == "]" and i > start]
    # Longest candidate first so nested lists inside arguments stay inside the call list.
    for end in reversed(ends[-32:]):
        try:
            found = _parse_python(text[start : end + 1])
        except (SyntaxError, ValueError):
            continue
        if found:
            return found
    raise _ParseError(text[start : start + 80])


def _structured(text: str) -> list[ToolCall] | None:
    """Calls written as data: JSON, JSON objects separated by ``;`` (Llama 3.1), or the same shapes as
    python literals (``True``, single quotes); None when the text is no such value."""
    try:
        return _parse_json(json.loads(text))
    except json.JSONDecodeError:
        pass
    if ";" in text:
        try:
            parts = [json.loads(part) for part in text.split(";") if part.strip()]
        except json.JSONDecodeError:
            parts = None
        if parts and all(isinstance(p, dict) for p in parts):
            return [_from_json_object(p) for p in parts]
    try:
        # literal_eval's own parse, under the model output's file name (see _SOURCE_NAME).
        value = ast.literal_eval(ast.parse(text.lstrip(" \t"), filename=_SOURCE_NAME, mode="eval"))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return _parse_json(value)


def _bracketed(text: str) -> list[ToolCall] | None:
    """bfcl-eval's prompting decoder's reading: fences' backticks and blank ends stripped, a missing ``[`` or
    ``]`` added (``f(a=1), g(b=2)`` and ``[f(a=1)`` are call lists there); None when that holds no call."""
    body = text.strip("`\n ")
    body = body if body.startswith("[") else "[" + body
    body = body if body.endswith("]") else body + "]"
    try:
        return _parse_python(body)
    except (SyntaxError, ValueError):
        return None


def _parse(text: str, bracketed: bool = False) -> list[ToolCall]:
    if bracketed:
        found = _bracketed(text)
        if found:
            return found
    stripped = text.strip()
    if not stripped:
        return []
    if "<tool_call>" in stripped:
        return _parse_tool_call_blocks(stripped)
    fenced = _CODE_FENCE.search(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    stripped = stripped.removeprefix(_PYTHON_TAG).strip()
    if stripped[:1] in "[{":
        found = _structured(stripped)
        if found is not None:
            return found
    try:
        found = _parse_python(stripped)
        return found or []
    except SyntaxError:
        pass
    found = _embedded_list(stripped)
    if found is not None:
        return found
    if _BARE_CALL_START.match(stripped) and stripped.rstrip().endswith(")"):
        raise _ParseError(stripped[:80])
    return []


def parse_tool_calls(
    text: object, allowed: set[str] | None = None, bracketed: bool = False
) -> tuple[list[ToolCall], str | None]:
    """Tool calls in ``text`` and an error text, or ([], None) when the text calls nothing.

    Never raises and never runs anything. With ``allowed``, a call to any other name is an error.
    ``bracketed`` also reads calls the way bfcl-eval's prompting handlers do (a missing bracket of the
    call list added); prompt_style 'bfcl' turns it on, the compact style keeps its stricter reading.
    """
    if not isinstance(text, str):
        return [], "unparseable tool call: message is not text"
    if len(text) > MAX_TEXT_CHARS:
        return [], f"unparseable tool call: message longer than {MAX_TEXT_CHARS} characters"
    try:
        calls = _parse(text, bracketed)
    except _ParseError as exc:
        return [], f"unparseable tool call: {exc}"
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, json.JSONDecodeError) as exc:
        return [], f"unparseable tool call: {type(exc).__name__}"
    if allowed is not None:
        for call in calls:
            if call.name not in allowed:
                return [], f"unknown tool: {call.name}"
    return calls, None
