"""One environment contract (envs/base.py) and one registry (envs/registry.py): an environment is one module.

The toy environment of docs/extending.md (``counter``: named counters, the tools ``add`` and ``read``) implements
the whole contract: its episode, its tools, its own settings and the `World` whose hooks task making
(envs/exploration.py) runs on; the seed pool, exploration, abstraction, replay and demonstrations are the base
class's. Written as the one module of a package that declares it under the entry-point groups
``coevolve.environments`` and ``coevolve.environment_settings``, it is accepted as ``environment.name``, built by
the registry, and plays, builds, explores, replays and demonstrates its tasks through the same calls the stages
make, with nothing of the project edited. A name nobody declares is refused with the names that exist.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from coevolve.config import load_config
from coevolve.config.environment import BUILT_IN_ENVIRONMENTS, environment_names
from coevolve.errors import ConfigError
from coevolve.records import Provenance
from envs.base import Environment, World
from envs.bfcl.environment import BfclEnvironment
from envs.registry import BUILT_IN, environment_class, environment_for, make_environment
from envs.workplace.environment import WorkplaceEnvironment
from tests.flows.conftest import install_package

# The toy is the module docs/extending.md shows ("A whole environment ... is one module of a page"), read from the page.
EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
COUNTER_ENVIRONMENT = re.search(r"^```python\n(# counter_env\.py.*?)^```", EXTENDING.read_text(), re.S | re.M)[1]


def install_counter(folder):
    installed = install_package(
        folder, "counter_env", COUNTER_ENVIRONMENT, "coevolve.environments", "counter = counter_env:CounterEnvironment"
    )
    # The package declares the environment's settings model too, under the same name.
    with (installed / "counter_env-0.1.dist-info" / "entry_points.txt").open("a") as entry_points:
        entry_points.write("[coevolve.environment_settings]\ncounter = counter_env:CounterSettings\n")
    return installed


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


def test_an_installed_environment_s_own_settings_are_fields_of_the_environment_section(counter_installed, tmp_path):
    default = load_config(overrides=[f"state_dir={tmp_path}", "environment.name=counter"], environ={})
    assert default.environment.model_dump()["counter_prompt"].startswith("Tools: add, read.")
    said = load_config(
        overrides=[f"state_dir={tmp_path}", "environment.name=counter", "environment.counter_prompt=Count."],
        environ={},
    )
    env = make_environment(said.environment)
    assert env.reset(env.build_tasks(1, seed=0)[0])[0].content == "Count."
    # Another environment's setting is refused for it, naming whose it is; so is a value of the wrong type.
    with pytest.raises(ConfigError, match="environment.counter_prompt is a setting of environment 'counter'"):
        load_config(overrides=[f"state_dir={tmp_path}", "environment.counter_prompt=Count."], environ={})
    with pytest.raises(ConfigError, match="environment.counter_prompt: Input should be a valid string"):
        load_config(
            data={"state_dir": str(tmp_path), "environment": {"name": "counter", "counter_prompt": [1]}}, environ={}
        )


def test_an_environment_writes_its_episode_tools_and_world_and_inherits_the_task_making():
    assert sorted(Environment.__abstractmethods__) == [
        "execute", "from_config", "reset", "score", "state", "step", "tool_names", "tool_schemas",
    ]  # fmt: skip
    assert sorted(World.__abstractmethods__) == [
        "choose", "informative", "requests", "run", "start", "succeeded", "tools",
    ]  # fmt: skip
    made_once = ("build_tasks", "in_turns", "explore", "explore_call", "abstract", "replay", "demonstration")
    for environment in BUILT_IN.values():
        assert not {name for name in made_once if name in vars(environment)}


def test_a_declaration_that_is_no_environment_is_refused(tmp_path, monkeypatch):
    folder = install_package(
        tmp_path / "site", "not_an_env", "class Abacus:\n    name = 'abacus'\n", "coevolve.environments",
        "abacus = not_an_env:Abacus",
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ConfigError, match="not a Environment subclass"):
        environment_class("abacus")
