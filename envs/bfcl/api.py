"""Direct access to the BFCL multi-turn API classes, data files and function docs.

bfcl-eval's own executor keeps instances in module globals and runs call strings with ``eval``;
this module replaces it for everything that touches model output: it builds private instances,
whitelists their public methods and calls them with parsed literal arguments.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import bfcl_eval
from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)

from coevolve.errors import EnvSetupError
from coevolve.records import ToolCall
from envs.calls import POSITIONAL_PREFIX

# Task.environment of every BFCL task, and the value of environment.name that picks this environment.
ENVIRONMENT_NAME = "bfcl"
DATA_DIR = Path(bfcl_eval.__file__).parent / "data"
MULTI_TURN_CLASSES: tuple[str, ...] = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)

# Arguments that make a single call run for minutes (huge exponents, decimal precision, int sizes).
_MAX_INT = 10**18
_BOUNDED_ARGUMENTS = {"exponent": 10_000, "precision": 10_000, "decimal_places": 10_000}


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@cache
def api_class(class_name: str) -> type:
    if class_name not in CLASS_FILE_PATH_MAPPING or class_name not in MULTI_TURN_CLASSES:
        raise EnvSetupError(f"unknown BFCL class {class_name!r}; known: {', '.join(MULTI_TURN_CLASSES)}")
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    return getattr(module, class_name)


@cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """The official function docs of one class, in file order."""
    return tuple(load_jsonl(DATA_DIR / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


@cache
def public_methods(class_name: str) -> tuple[str, ...]:
    cls = api_class(class_name)
    return tuple(
        name for name, member in inspect.getmembers(cls, predicate=inspect.isfunction) if not name.startswith("_")
    )


@cache
def method_parameters(class_name: str, method: str) -> tuple[str, ...]:
    """Parameter names of a method, without ``self``: maps positional arguments to names."""
    signature = inspect.signature(getattr(api_class(class_name), method))
    return tuple(p for p in signature.parameters if p != "self")


@cache
def mutable_defaults(class_name: str, method: str) -> tuple[tuple[str, Any], ...]:
    """Parameters whose default is a list/dict/set, with a fresh empty container of that type.

    ``post_tweet(tags=[], mentions=[])`` stores its default list in the tweet and ``mention`` later
    appends to it, which would leak mentions between episodes; every call gets its own copy instead.
    """
    signature = inspect.signature(getattr(api_class(class_name), method))
    return tuple(
        # An empty container, not a copy: the shared default may already hold another episode's data.
        (p.name, type(p.default)())
        for p in signature.parameters.values()
        if isinstance(p.default, (list, dict, set))
    )


def class_of_tool(classes: list[str]) -> dict[str, str]:
    """Tool name -> owning class for a set of involved classes (BFCL method names never collide)."""
    return {method: cls for cls in classes for method in public_methods(cls)}


_PLAIN = (str, int, float, bool, type(None))


def copy_value(value: Any) -> Any:
    """A deep copy of ``value``: dicts, lists and plain values (JSON's kinds, most of a BFCL state) copied directly,
    anything else (a file system's directories, a tuple, a date) by ``copy.deepcopy``.

    Equal to ``copy.deepcopy(value)``, about three times faster on plain data, where building tasks spends much of its
    time copying states; only objects shared between two places of a dict or list come out as two equal copies.
    """
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {key: copy_value(item) for key, item in value.items()}
    if kind is list:
        return [copy_value(item) for item in value]
    return copy.deepcopy(value)


def new_instances(initial_config: dict[str, Any], classes: list[str], long_context: bool = False) -> dict[str, Any]:
    """Fresh instances of ``classes`` loaded from a deep copy of ``initial_config``; no shared state."""
    instances: dict[str, Any] = {}
    for class_name in classes:
        instance = api_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            try:
                instance._load_scenario(copy_value(initial_config.get(class_name, {})), long_context=long_context)
            except Exception as exc:  # a malformed synthesized state must not crash a round
                raise EnvSetupError(f"cannot load the initial state of {class_name}: {exc}") from exc
        instances[class_name] = instance
    return instances


def method_table(instances: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """The whitelist of callable tools: public methods of the involved instances only."""
    return {name: getattr(instance, name) for cls, instance in instances.items() for name in public_methods(cls)}


def normalize_call(call: ToolCall, class_name: str) -> ToolCall:
    """Positional arguments (``__pos0``...) renamed to the method's parameter names, when they fit."""
    if not any(k.startswith(POSITIONAL_PREFIX) for k in call.arguments):
        return call
    params = method_parameters(class_name, call.name)
    named: dict[str, Any] = {}
    for key, value in call.arguments.items():
        if key.startswith(POSITIONAL_PREFIX):
            index = int(key[len(POSITIONAL_PREFIX) :])
            if index >= len(params) or params[index] in call.arguments:
                return call  # left as is: the call fails with a clear error when executed
            named[params[index]] = value
        else:
            named[key] = value
    ordered = {p: named[p] for p in params if p in named}
    ordered.update({k: v for k, v in named.items() if k not in ordered})
    return ToolCall(name=call.name, arguments=ordered)


def format_result(value: Any) -> str:
    """A call's result as text, exactly as bfcl-eval's executor formats it."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:  # noqa: BLE001 - bfcl-eval's executor falls back to str() on any failure (a bare except)
            return str(value)
    return str(value)


def _out_of_range(arguments: dict[str, Any]) -> str | None:
    for key, value in arguments.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, int) and abs(value) > _MAX_INT:
            return key
        if key in _BOUNDED_ARGUMENTS and abs(value) > _BOUNDED_ARGUMENTS[key]:
            return key
    return None


def run_call(table: dict[str, Callable[..., Any]], tool_classes: dict[str, str], call: ToolCall) -> str:
    """Execute one call on whitelisted methods; every failure is a result string, never an exception."""
    method = table.get(call.name)
    if method is None:
        return f"Error during execution: unknown tool '{call.name}'"
    call = normalize_call(call, tool_classes[call.name])
    if any(k.startswith(POSITIONAL_PREFIX) for k in call.arguments):
        return f"Error during execution: {call.name}() got too many positional arguments"
    bad = _out_of_range(call.arguments)
    if bad is not None:
        return f"Error during execution: argument '{bad}' is out of the supported range"
    # Deep copies: the API classes keep references to list/dict arguments inside their state.
    arguments = copy_value(call.arguments)
    for name, default in mutable_defaults(tool_classes[call.name], call.name):
        arguments.setdefault(name, copy_value(default))
    try:
        return format_result(method(**arguments))
    except Exception as exc:  # noqa: BLE001 - a model-chosen call may fail in any way; it is the call's result
        return f"Error during execution: {exc}"


def snapshot(instances: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Public attributes of every stateful instance, deep-copied: the state bfcl's checker compares."""
    return {
        cls: {k: copy_value(v) for k, v in vars(instance).items() if not k.startswith("_")}
        for cls, instance in instances.items()
        if cls not in STATELESS_CLASSES
    }


def tool_line(doc: dict[str, Any], style: str = "described") -> str:
    """One tool of the system prompt, from an official function doc.

    described: ``name(param: type, opt: type = default) - short description``; signatures: the
    same without the description; names: the bare name.
    """
    if style == "names":
        return doc["name"]
    properties = doc.get("parameters", {}).get("properties", {})
    required = set(doc.get("parameters", {}).get("required", []))
    params = []
    for name, spec in properties.items():
        text = f"{name}: {spec.get('type', 'any')}"
        if name not in required:
            default = spec.get("default")
            text += " = None" if default in (None, "None") else f" = {default!r}"
        params.append(text)
    if style == "signatures":
        return f"{doc['name']}({', '.join(params)})"
    description = doc.get("description", "")
    if "Tool description:" in description:
        description = description.split("Tool description:", 1)[1]
    short = description.strip().split(". ")[0].rstrip(".")
    return f"{doc['name']}({', '.join(params)}) - {short}"
