"""The environments by name, and how every stage builds one: BFCL multi-turn, the workplace (mail, calendar,
contacts, tasks), and any environment an installed package declares.

Every environment keeps the contract of envs/base.py (`Environment`), so rollout, synthesis, validation, the splits
and evaluation never branch on which one plays. This module is the only place outside an environment's own
package that names an implementation.

    env = make_environment(config.environment)   # environment.name decides; one per episode
    env = environment_for(task)                   # the environment a task was made in (Task.environment)

A package adds an environment by declaring its `Environment` subclass under the entry-point group
``coevolve.environments`` (``[project.entry-points."coevolve.environments"] myenv = "mypackage.env:MyEnvironment"``);
the configuration accepts ``environment.name: myenv`` wherever that package is installed
(coevolve/config/environment.py reads the names without importing it).
"""

from __future__ import annotations

from coevolve.config import EnvironmentConfig
from coevolve.config.environment import ENVIRONMENT_ENTRY_POINTS
from coevolve.plugins import declared_class
from coevolve.records import Task
from envs.base import Environment
from envs.bfcl.environment import BfclEnvironment
from envs.workplace.environment import WorkplaceEnvironment

BUILT_IN: dict[str, type[Environment]] = {e.name: e for e in (BfclEnvironment, WorkplaceEnvironment)}


def environment_class(name: str) -> type[Environment]:
    """The environment called ``name``: a built-in one, or the one an installed package declares under that name."""
    return declared_class(ENVIRONMENT_ENTRY_POINTS, name, BUILT_IN, Environment, "envs/base.py", "environment.name")


def make_environment(config: EnvironmentConfig) -> Environment:
    """A fresh environment of ``config.name``, set up as the ``environment`` section says."""
    return environment_class(config.name).from_config(config)


def environment_for(task: Task) -> Environment:
    """A fresh environment of the kind ``task`` was made in, with the section's default settings.

    For work on a task outside a policy's episode (exploration, replay, judging, listing its tools), which
    executes calls and compares states and does not depend on how prompts are written.
    """
    return make_environment(EnvironmentConfig(name=task.environment))
