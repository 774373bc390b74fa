"""A private workplace state that exploration, abstraction and the task builders run calls on, and the check that a
state is one the apps can run on."""

from __future__ import annotations

import random
from typing import Any, ClassVar

from coevolve.errors import EnvSetupError
from coevolve.records import ToolCall
from envs.exploration import Triplet, World
from envs.workplace.apps import copy_state
from envs.workplace.explore_values import CHOOSERS
from envs.workplace.templates import Context
from envs.workplace.tools import BY_NAME, is_ok, run_call, tools_of
from envs.workplace.world import APPS

# Task.environment of every workplace task, and the value of environment.name that picks this environment.
ENVIRONMENT_NAME = "workplace"
# Each app's table of records.
TABLES = {"Mail": "messages", "Calendar": "events", "Contacts": "contacts", "Tasks": "tasks"}


def check_initial_config(config: Any, apps: list[str]) -> None:
    """Refuse a state the apps cannot run on (a malformed synthesized task): EnvSetupError says what is wrong."""
    unknown = [app for app in apps if app not in APPS]
    if unknown or not apps:
        raise EnvSetupError(f"unknown workplace apps {unknown or apps}; known: {', '.join(APPS)}")
    if not isinstance(config, dict) or not isinstance(config.get("owner"), dict) or "today" not in config:
        raise EnvSetupError("a workplace state needs 'owner' and 'today'")
    for app in apps:
        data = config.get(app)
        if not isinstance(data, dict) or not isinstance(data.get(TABLES[app]), dict) or "next_id" not in data:
            raise EnvSetupError(f"the {app} state needs '{TABLES[app]}' and 'next_id'")


class Session(World):
    """Fresh state from a task's initial state; every call's step is recorded and what it singled out kept."""

    environment: ClassVar[str] = ENVIRONMENT_NAME

    def __init__(self, initial_config: dict[str, Any], apps: list[str]):
        check_initial_config(initial_config, apps)
        super().__init__(initial_config, apps)
        self.state: dict[str, Any] = copy_state(initial_config)
        self.apps = list(apps)
        self.context = Context()

    def tools(self) -> list[str]:
        return [tool.name for tool in tools_of(self.apps)]

    def choose(self, tool: str, rng: random.Random) -> ToolCall:
        try:
            arguments = CHOOSERS[tool](self.state, self.context, rng)
        except (IndexError, KeyError, ValueError):  # a state with nothing to choose from: the call fails
            arguments = {}
        return ToolCall(tool, arguments)

    def run(self, call: ToolCall, run_id: str) -> Triplet:
        # Only the called tool's app can change, and only when the tool is no lookup.
        tool = BY_NAME.get(call.name)
        app = tool.app if tool is not None and not tool.reads else None
        before = copy_state(self.state.get(app)) if app else None
        observation = run_call(self.state, self.apps, call)
        self.context.learn(call, observation, self.state)
        changed = app is not None and self.state.get(app) != before
        return Triplet(call, observation, run_id, is_ok(observation), changed)

    @staticmethod
    def succeeded(observation: str) -> bool:
        return is_ok(observation)

    @staticmethod
    def informative(observation: str) -> bool:
        """A lookup found something: its result does not begin "No " (no messages, no meetings...)."""
        return not observation.startswith("No ")
