"""A private workplace state that exploration, abstraction and the task builders run calls on."""

from __future__ import annotations

import copy
from typing import Any

from coevolve.records import ToolCall
from envs.base import Triplet
from envs.workplace.templates import Context
from envs.workplace.tools import is_ok, run_call


class Session:
    """Fresh state from a task's initial state; every call's step is recorded and what it singled out kept."""

    def __init__(self, initial_config: dict[str, Any], apps: list[str]):
        self.state: dict[str, Any] = copy.deepcopy(initial_config)
        self.apps = list(apps)
        self.context = Context()

    def run(self, call: ToolCall, run_id: str) -> Triplet:
        before = copy.deepcopy(self.state)
        observation = run_call(self.state, self.apps, call)
        self.context.learn(call, observation, self.state)
        return Triplet(call, observation, run_id, is_ok(observation), self.state != before)
