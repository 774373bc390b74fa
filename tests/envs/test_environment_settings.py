"""An environment owns its settings, as a signal kind does: it declares a settings model, whose fields are fields of
the ``environment`` section where environment.name names it, validated when the configuration loads.

BFCL's (``prompt_style``, ``bfcl_handler``) are declared in envs/bfcl/settings.py, the workplace's
(``sft_target_share``, and ``sft_steps``, which it builds checkpoint 0 with in place of policy.sft_steps) in
envs/workplace/settings.py, and no section under coevolve/config declares them. Configurations
written before keep loading: BFCL's keep their names, and the ones recorded for another environment, which carry
BFCL's settings at their defaults, load without them; a BFCL setting given another value for another environment is
refused with one line naming whose setting it is.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

import coevolve.config
from coevolve.config import EnvironmentConfig, load_config
from coevolve.config.environment import BUILT_IN_ENVIRONMENTS, NoSettings, settings_model
from coevolve.errors import ConfigError
from coevolve.records import Task
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.settings import BfclSettings
from envs.registry import make_environment
from envs.workplace.settings import WorkplaceSettings
from tasks.prepare import tiny_policy
from tasks.splits import build_initial_pools, sft_demonstrations, taken

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "state-9079251" / "warehouse" / "catalog" / "runs" / "e2e.json"


def test_bfcl_declares_its_settings_and_no_configuration_module_defines_them():
    assert settings_model("bfcl") is BfclSettings and BfclSettings.__module__ == "envs.bfcl.settings"
    assert settings_model("workplace") is WorkplaceSettings and set(BUILT_IN_ENVIRONMENTS) == {"bfcl", "workplace"}
    assert NoSettings().target_demonstrations() == 0.0
    names = [module.name for module in pkgutil.iter_modules(coevolve.config.__path__)]
    modules = [importlib.import_module(f"coevolve.config.{name}") for name in names]
    models = [v for m in modules for v in vars(m).values() if isinstance(v, type) and issubclass(v, BaseModel)]
    own = {"prompt_style", "bfcl_handler", "sft_target_share"}
    assert models and not any(own & set(model.model_fields) for model in models)


def test_the_environment_section_holds_the_environment_s_own_settings_at_their_defaults():
    # The section dumps what it dumped when they were its own fields, so the run key of the shipped BFCL checkpoint 0
    # (tasks/prepare.tiny_policy_inputs digests the section) is the same.
    assert EnvironmentConfig().model_dump() == {
        "name": "bfcl", "max_steps": 30, "max_steps_per_turn": 4, "max_observation_chars": 80, "tool_list": "names",
        "prompt_style": "compact", "bfcl_handler": None,
    }  # fmt: skip
    assert EnvironmentConfig(name="workplace").model_dump() == {
        "name": "workplace", "max_steps": 30, "max_steps_per_turn": 4, "max_observation_chars": 80,
        "tool_list": "names", "sft_target_share": 0.5, "sft_steps": 2400,
    }  # fmt: skip
    assert EnvironmentConfig(name="workplace", sft_target_share=0.5).settings().target_demonstrations() == 0.5
    assert EnvironmentConfig().settings().target_demonstrations() == 0.0
    # The workplace builds its checkpoint 0 with its own SFT length; BFCL with policy.sft_steps.
    workplace = load_config(overrides=["environment.name=workplace"], environ={})
    assert tiny_policy(workplace).sft_steps == 2400 and tiny_policy(workplace).sft_learning_rate == 6e-3
    assert tiny_policy(load_config(overrides=["policy.sft_steps=5"], environ={})).sft_steps == 5
    config = load_config(overrides=["environment.prompt_style=bfcl", "policy.model=/m/Llama-3.1-8B"], environ={})
    assert config.environment.settings() == BfclSettings(prompt_style="bfcl", bfcl_handler="llama_3_1")
    env = make_environment(config.environment)
    assert isinstance(env, BfclEnvironment) and env.bfcl_loop and env.handler == "llama_3_1"


def test_a_recorded_configuration_and_existing_yaml_keep_loading(tmp_path):
    recorded = json.loads(RECORDED.read_text())["config"]["environment"]
    assert "prompt_style" not in recorded  # recorded before BFCL had prompt settings: they take their defaults
    config = load_config(data={"environment": recorded}, environ={})
    assert config.environment.model_dump() == {**recorded, "prompt_style": "compact", "bfcl_handler": None}
    # A workplace run recorded while they were fields of the section holds them at their defaults: they say nothing.
    workplace = {**recorded, "name": "workplace", "prompt_style": "compact", "bfcl_handler": None}
    loaded = load_config(data={"environment": workplace}, environ={}).environment
    # Its own settings, which it did not have then, take their defaults.
    own = {k: v for k, v in workplace.items() if k not in ("prompt_style", "bfcl_handler")}
    assert loaded.model_dump() == {**own, "sft_target_share": 0.5, "sft_steps": 2400}
    # The shipped YAML that sets them reads them as before.
    paper = load_config(REPO / "configs" / "paper.yaml", environ={})
    assert paper.environment.settings() == BfclSettings(prompt_style="bfcl", bfcl_handler="qwen_fc")
    file = tmp_path / "old.yaml"
    file.write_text("environment:\n  prompt_style: bfcl\n  bfcl_handler: chat\npolicy:\n  model: /models/x\n")
    old = load_config(file, environ={}).environment
    assert old.settings() == BfclSettings(prompt_style="bfcl", bfcl_handler="chat")


def test_a_setting_that_is_not_the_environment_s_is_refused_with_one_line_naming_it(tmp_path):
    file = tmp_path / "workplace.yaml"
    file.write_text("environment:\n  name: workplace\n  bfcl_handler: qwen\n")
    cases = {
        "environment.bfcl_handler is a setting of environment 'bfcl' and applies to environment.name 'bfcl' only": (
            file, []),
        "environment.prompt_style: Input should be 'compact' or 'bfcl', not 'fancy'": (
            None, ["environment.prompt_style=fancy"]),
        "environment.promt_style: unknown field": (None, ["environment.promt_style=bfcl"]),
    }  # fmt: skip
    for message, (path, overrides) in cases.items():
        with pytest.raises(ConfigError) as refused:
            load_config(path, overrides, environ={})
        assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_policy_setting_the_environment_replaces_is_refused_at_the_build_naming_the_environment_s_own_that_works():
    given = load_config(overrides=["environment.name=workplace", "policy.sft_steps=1000"], environ={})
    with pytest.raises(ConfigError) as refused:
        tiny_policy(given)
    message = str(refused.value)
    assert (
        message.startswith("policy.sft_steps=1000 is not used with environment.name='workplace'")
        and "\n" not in message
    )
    advised = re.search(r"set (environment\.sft_steps=\d+) instead", message).group(1)
    assert tiny_policy(load_config(overrides=["environment.name=workplace", advised], environ={})).sft_steps == 1000
    # Its default, as every recorded configuration names it, and BFCL, which replaces nothing, build as given.
    default = load_config(overrides=["environment.name=workplace", "policy.sft_steps=800"], environ={})
    assert tiny_policy(default).sft_steps == 2400
    assert tiny_policy(load_config(overrides=["policy.sft_steps=1000"], environ={})).sft_steps == 1000


def test_the_workplace_teaches_checkpoint_0_on_jobs_of_the_target_s_shape_as_its_settings_ask():
    def demonstrations(share: float) -> tuple[list[Task], list[str]]:
        data = {"environment": {"name": "workplace", "sft_target_share": share}, "policy": {"sft_tasks": 20}}
        config = load_config(data=data, environ={})
        seed_pool, heldout = build_initial_pools(config)
        ids, conversations = sft_demonstrations(config, seed_pool, heldout)
        assert len(ids) == len(conversations) == 20 and not set(ids) & taken(seed_pool, heldout)
        return seed_pool, [m.content for conversation in conversations for m in conversation if m.role == "user"]

    seed_pool, short = demonstrations(0.0)
    _, mixed = demonstrations(0.5)
    # Short tasks have 1-2 calls (at most 2 turns each); half the mixed ones are jobs of 3-5 calls over 2-3 turns, as
    # D_0's are.
    assert len(short) <= 40 and len(mixed) >= len(short) + 10
    assert all(len(task.turns) >= 2 for task in seed_pool)
