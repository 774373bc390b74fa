"""Comparing BFCL states that may hold a directory inside itself.

bfcl-eval's ``cp`` of a directory onto its own name (``cp(source='d', destination='d')``) adds ``d/d`` whose contents
are a copy of ``d``'s, which by then hold ``d/d`` itself: the file system is no longer a tree, and
``Directory.__eq__`` (name and contents, recursively) never ends on two such states. A state is compared here as
``==`` compares it, except that a pair of directories already under comparison is taken as equal: two states are
the same unless some path of names leads to a difference. On states without such a directory the verdicts are
bfcl-eval's own (``state_check`` calls its ``state_checker``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import Directory
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker


def same_state(first: Any, second: Any) -> bool:
    """``first == second`` for values of BFCL states (dicts, lists, tuples, directories, plain values), ending on
    directories that contain themselves. Walked without recursion, so no tree is too deep."""
    assumed: set[tuple[int, int]] = set()
    pending = [(first, second)]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue  # as containers' == does: an object equals itself
        if isinstance(a, Directory) and isinstance(b, Directory):
            if (id(a), id(b)) in assumed:
                continue
            assumed.add((id(a), id(b)))
            if a.name != b.name or a.contents.keys() != b.contents.keys():
                return False
            pending.extend((a.contents[name], b.contents[name]) for name in a.contents)
        elif type(a) is dict and type(b) is dict:
            if a.keys() != b.keys():
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif type(a) in (list, tuple) and type(b) is type(a):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif a != b:
            return False
    return True


def contains_itself(value: Any) -> bool:
    """Whether a directory reachable from ``value`` (an API instance, or a state's dicts and lists) is inside itself."""
    finished: set[int] = set()
    on_path: set[int] = set()
    # Depth-first without recursion: (directory, its subdirectories not yet entered).
    stack: list[tuple[Directory, Iterator[Directory]]] = []
    for root in _directories(value):
        if id(root) in finished:
            continue
        stack.append((root, _subdirectories(root)))
        on_path.add(id(root))
        while stack:
            directory, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(id(directory))
                finished.add(id(directory))
            elif id(child) in on_path:
                return True
            elif id(child) not in finished:
                stack.append((child, _subdirectories(child)))
                on_path.add(id(child))
    return False


def state_check(model: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """bfcl-eval's ``state_checker(model, truth)`` on instances by class name; where a directory is inside itself
    (which that checker never finishes on), the same check and result with ``same_state`` for ``!=``."""
    if not any(contains_itself(instance) for instance in (*model.values(), *truth.values())):
        return state_checker(model, truth)
    for class_name, truth_instance in truth.items():
        model_state = _public(model[class_name])
        truth_state = _public(truth_instance)
        differences = {
            name: {"model": model_state[name], "ground_truth": value}
            for name, value in truth_state.items()
            if not same_state(model_state[name], value)
        }
        if differences:
            # bfcl-eval's state_checker's result, word for word.
            message = f"Model instance for {class_name} does not match the state with ground truth instance."
            return {
                "valid": False,
                "error_message": message,
                "error_type": "multi_turn:instance_state_mismatch",
                "details": {
                    "differences": differences,
                    "model_instance_state": model_state,
                    "ground_truth_instance_state": truth_state,
                },
            }
    return {"valid": True}


def _public(instance: Any) -> dict[str, Any]:
    """The attributes bfcl-eval's checker compares: the public ones."""
    return {name: value for name, value in vars(instance).items() if not name.startswith("_")}


def _subdirectories(directory: Directory) -> Iterator[Directory]:
    return (item for item in directory.contents.values() if isinstance(item, Directory))


def _directories(value: Any) -> Iterator[Directory]:
    """The directories held in ``value``'s public attributes, dicts, lists and tuples (not inside other directories)."""
    seen: set[int] = set()
    pending = [value]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Directory):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            pending.extend(_public(item).values())
