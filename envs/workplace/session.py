"""A private workplace state that exploration, abstraction and the task builders run calls on."""

from __future__ import annotations

from typing import Any

from coevolve.records import ToolCall
from envs.base import Triplet
from envs.workplace.apps import copy_state
from envs.workplace.templates import Context
from envs.workplace.tools import BY_NAME, is_ok, run_call


class Session:
    """Fresh state from a task's initial state; every call's step is recorded and what it singled out kept."""

    def __init__(self, initial_config: dict[str, Any], apps: list[str]):
        self.state: dict[str, Any] = copy_state(initial_config)
        self.apps = list(apps)
        self.context = Context()

    def run(self, call: ToolCall, run_id: str) -> Triplet:
        # Only the called tool's app can change, and only when the tool is no lookup.
        tool = BY_NAME.get(call.name)
        app = tool.app if tool is not None and not tool.reads else None
        before = copy_state(self.state.get(app)) if app else None
        observation = run_call(self.state, self.apps, call)
        self.context.learn(call, observation, self.state)
        changed = app is not None and self.state.get(app) != before
        return Triplet(call, observation, run_id, is_ok(observation), changed)
