"""One environment contract (envs/base.py) and one registry (envs/registry.py): an environment is one module.

The toy environment below (``counter``: named counters, the tools ``add`` and ``read``) implements the whole
contract. Written as the one module of a package that declares it under the entry-point group
``coevolve.environments``, it is accepted as ``environment.name``, built by the registry, and plays, builds,
explores, replays and demonstrates its tasks through the same calls the stages make, with nothing of the
project edited. A name nobody declares is refused with the names that exist.
"""

from __future__ import annotations

import random

import pytest

from coevolve.config import load_config
from coevolve.config.environment import BUILT_IN_ENVIRONMENTS, environment_names
from coevolve.errors import ConfigError
from coevolve.records import Provenance
from envs.base import Environment
from envs.bfcl.environment import BfclEnvironment
from envs.registry import BUILT_IN, environment_class, environment_for, make_environment
from envs.workplace.environment import WorkplaceEnvironment
from tests.flows.conftest import install_package

COUNTER_ENVIRONMENT = '''
"""counter: named counters; ``add(name, amount)`` adds to one, ``read(name)`` shows it."""

import copy
import random

from coevolve.records import Message, Provenance, Task, ToolCall
from envs.base import Environment, StepOutcome, Triplet
from envs.calls import parse_tool_calls

NAMES = ("apples", "pears", "plums")
SCHEMAS = [
    {"name": "add", "description": "Add an amount to a counter.",
     "parameters": {"type": "dict", "required": ["name", "amount"],
                    "properties": {"name": {"type": "string"}, "amount": {"type": "integer"}}}},
    {"name": "read", "description": "Show a counter.",
     "parameters": {"type": "dict", "required": ["name"], "properties": {"name": {"type": "string"}}}},
]


def words(calls):
    return ", then ".join(f"add {c.arguments['amount']} to {c.arguments['name']}" for c in calls) + "."


class CounterEnvironment(Environment):
    name = "counter"

    def __init__(self, max_steps_per_turn=4):
        self.max_steps_per_turn = max_steps_per_turn
        self.task = None
        self.counters = {}

    @classmethod
    def from_config(cls, config):
        return cls(config.max_steps_per_turn)

    # the episode: the task succeeds when the counters end as its reference leaves them
    def reset(self, task):
        self.task, self.counters = task, dict(task.initial_config["counters"])
        self._turn, self.steps, self.done = 0, 0, False
        return [Message("system", "Tools: add, read. Reply with a python list of calls, or done."),
                Message("user", task.turns[0])]

    def step(self, model_text):
        calls, error = parse_tool_calls(model_text, allowed={"add", "read"})
        outcome = StepOutcome(calls=calls, error=error)
        self.steps += 1
        if calls:
            outcome.observations = self.execute(calls)
            outcome.messages.append(Message("tool", "\\n".join(outcome.observations)))
        if not calls or self.steps >= self.max_steps_per_turn:
            outcome.turn_ended = True
            self._turn, self.steps = self._turn + 1, 0
            if self._turn >= len(self.task.turns):
                self.done = outcome.done = True
            else:
                outcome.messages.append(Message("user", self.task.turns[self._turn]))
        return outcome

    def score(self):
        truth = type(self)()
        truth.reset(self.task)
        truth.execute([call for turn in self.task.reference for call in turn])
        success = self.done and self.counters == truth.counters
        return float(success), success, {} if success else {"error_type": "counters differ"}

    def execute(self, calls):
        results = []
        for call in calls:
            name = call.arguments.get("name")
            if call.name == "add" and name in NAMES and isinstance(call.arguments.get("amount"), int):
                self.counters[name] = self.counters.get(name, 0) + call.arguments["amount"]
                results.append(str(self.counters[name]))
            elif call.name == "read" and name in NAMES:
                results.append(str(self.counters.get(name, 0)))
            else:
                results.append(f"Error: cannot run {call.render()}")
        return results

    def state(self):
        return dict(self.counters)

    def tool_names(self):
        return ["add", "read"]

    @property
    def turn(self):
        return self._turn

    def tool_schemas(self, task):
        return copy.deepcopy(SCHEMAS)

    # the environment's tasks
    def build_tasks(self, n, seed, origin="seed", exclude=frozenset(), min_steps=3, max_steps=5, calls_per_turn=None):
        rng, tasks = random.Random(seed), {}
        for _ in range(50 * n):
            if len(tasks) == n:
                break
            calls = [ToolCall("add", {"name": rng.choice(NAMES), "amount": rng.randint(1, 9)})
                     for _ in range(rng.randint(min_steps, max_steps))]
            task = self.in_turns(self._task(calls, Provenance(origin=origin)), calls_per_turn)
            if task.task_id not in exclude:
                tasks.setdefault(task.task_id, task)
        return list(tasks.values())

    def _task(self, calls, provenance, counters=None):
        return Task(environment=self.name, initial_config={"counters": counters or {}}, involved_classes=["Counter"],
                    turns=[words(calls)], reference=[calls], provenance=provenance, description=words(calls))

    def in_turns(self, task, calls_per_turn):
        if not calls_per_turn:
            return task
        calls = [call for turn in task.reference for call in turn]
        reference = [calls[i : i + calls_per_turn] for i in range(0, len(calls), calls_per_turn)]
        return Task(environment=task.environment, initial_config=task.initial_config,
                    involved_classes=task.involved_classes, turns=[words(chunk) for chunk in reference],
                    reference=reference, provenance=task.provenance, description=task.description)

    def explore(self, start, rng, num_steps, focus_tools=None, run_id="x"):
        env = type(self)()
        env.reset(start)
        return [env.explore_call(ToolCall(rng.choice(focus_tools or ["add", "read"]),
                                          {"name": rng.choice(NAMES), "amount": rng.randint(1, 9)}), run_id)
                for _ in range(num_steps)]

    def explore_call(self, call, run_id):
        before = self.state()
        [observation] = self.execute([call])
        return Triplet(call, observation, run_id, not observation.startswith("Error"), self.state() != before)

    def abstract(self, triplets, start, provenance, min_steps=3, max_steps=5, calls_per_turn=None):
        calls = [ToolCall("add", t.action.arguments) for t in triplets if t.ok and t.state_changed][:max_steps]
        if len(calls) < min_steps:
            return None
        return self.in_turns(self._task(calls, provenance, start.initial_config["counters"]), calls_per_turn)

    def replay(self, task):
        env = type(self)()
        env.reset(task)
        before = env.state()
        results = env.execute([call for turn in task.reference for call in turn])
        failed = [r for r in results if r.startswith("Error")]
        return not failed, failed[0] if failed else "all reference calls succeeded", env.state() != before

    def demonstration(self, task):
        messages = self.reset(task)
        for reference in task.reference:
            for text in ("[" + ", ".join(call.render() for call in reference) + "]", "done"):
                outcome = self.step(text)
                messages += [Message("assistant", text), *outcome.messages]
                if outcome.turn_ended:
                    break
        return messages
'''


def install_counter(folder):
    return install_package(
        folder, "counter_env", COUNTER_ENVIRONMENT, "coevolve.environments", "counter = counter_env:CounterEnvironment"
    )


@pytest.fixture
def counter_installed(tmp_path, monkeypatch):
    """The toy's package on the path, as installing it would leave it."""
    monkeypatch.syspath_prepend(str(install_counter(tmp_path / "site")))


def test_the_configuration_and_the_registry_name_the_same_built_in_environments():
    assert list(BUILT_IN) == list(BUILT_IN_ENVIRONMENTS)
    assert all(environment_class(name).name == name for name in BUILT_IN_ENVIRONMENTS)
    assert environment_class("bfcl") is BfclEnvironment
    assert environment_class("workplace") is WorkplaceEnvironment


def test_an_environment_nobody_declares_is_refused_with_the_names_that_exist(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[f"state_dir={tmp_path}", "environment.name=counter"], environ={})
    assert "counter" in str(refused.value) and "bfcl" in str(refused.value)
    with pytest.raises(ConfigError) as unknown:
        environment_class("counter")
    assert "environment.name" in str(unknown.value) and "bfcl" in str(unknown.value)


def test_an_installed_environment_is_accepted_by_name_and_built_by_the_registry(counter_installed, tmp_path):
    assert environment_names() == ["bfcl", "workplace", "counter"]
    config = load_config(overrides=[f"state_dir={tmp_path}", "environment.name=counter"], environ={})
    env = make_environment(config.environment)
    assert isinstance(env, Environment) and type(env).__name__ == "CounterEnvironment"
    assert env.max_steps_per_turn == config.environment.max_steps_per_turn
    # A name still unknown is refused with every installed name.
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[f"state_dir={tmp_path}", "environment.name=abacus"], environ={})
    assert "bfcl" in str(refused.value) and "counter" in str(refused.value)


def test_the_installed_environment_serves_every_part_of_the_loop(counter_installed, tmp_path):
    config = load_config(overrides=[f"state_dir={tmp_path}", "environment.name=counter"], environ={})
    env = make_environment(config.environment)
    tasks = env.build_tasks(6, seed=0, calls_per_turn=2)
    assert len({t.task_id for t in tasks}) == 6 and all(t.environment == "counter" for t in tasks)
    assert tasks == make_environment(config.environment).build_tasks(6, seed=0, calls_per_turn=2)
    for task in tasks:
        # The stages that hold a task and no configuration build the task's own environment.
        assert type(environment_for(task)) is type(env)
        assert environment_for(task).replay(task)[::2] == (True, True)
        messages = env.demonstration(task)
        assert messages[-1].content == "done" and env.score()[:2] == (1.0, True)
    triplets = env.explore(tasks[0], random.Random(1), 6, focus_tools=["add"], run_id="r")
    made = env.abstract(triplets, tasks[0], Provenance(origin="boundary"))
    assert made is not None and environment_for(made).replay(made)[0]
    # No official benchmark: asked for one, it names what it has.
    assert env.official_categories == () and env.official_overall({"heldout": 1.0}) is None
    with pytest.raises(ConfigError, match="no official benchmark"):
        env.official_category("multi_turn_base")
    assert env.conversation(tasks[0], render_chat=str) is None
    assert env.tool_signatures(tasks[0]) == ["add(name: string, amount: integer)", "read(name: string)"]


def test_a_declaration_that_is_no_environment_is_refused(tmp_path, monkeypatch):
    folder = install_package(
        tmp_path / "site", "not_an_env", "class Abacus:\n    name = 'abacus'\n", "coevolve.environments",
        "abacus = not_an_env:Abacus",
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ConfigError, match="not a Environment subclass"):
        environment_class("abacus")
