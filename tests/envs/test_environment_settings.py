"""An environment owns its settings, as a signal kind does: it declares a settings model, whose fields are fields of
the ``environment`` section where environment.name names it, validated when the configuration loads.

BFCL's (``prompt_style``, ``bfcl_handler``) are declared in envs/bfcl/settings.py, and nothing under coevolve/config
names them. Configurations written before keep loading: BFCL's keep their names, and the ones recorded for another
environment, which carry BFCL's settings at their defaults, load without them; a BFCL setting given another value for
another environment is refused with one line naming whose setting it is.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest
from pydantic import BaseModel

import coevolve.config
from coevolve.config import EnvironmentConfig, load_config
from coevolve.config.environment import BUILT_IN_ENVIRONMENTS, NoSettings, settings_model
from coevolve.errors import ConfigError
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.settings import BfclSettings
from envs.registry import make_environment

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "state-9079251" / "warehouse" / "catalog" / "runs" / "e2e.json"


def test_bfcl_declares_its_settings_and_no_configuration_module_defines_them():
    assert settings_model("bfcl") is BfclSettings and BfclSettings.__module__ == "envs.bfcl.settings"
    assert settings_model("workplace") is NoSettings and set(BUILT_IN_ENVIRONMENTS) == {"bfcl", "workplace"}
    names = [module.name for module in pkgutil.iter_modules(coevolve.config.__path__)]
    modules = [importlib.import_module(f"coevolve.config.{name}") for name in names]
    models = [v for m in modules for v in vars(m).values() if isinstance(v, type) and issubclass(v, BaseModel)]
    assert models and not any({"prompt_style", "bfcl_handler"} & set(model.model_fields) for model in models)


def test_the_environment_section_holds_the_environment_s_own_settings_at_their_defaults():
    # The section dumps what it dumped when they were its own fields, so the run key of the shipped BFCL checkpoint 0
    # (tasks/prepare.tiny_policy_inputs digests the section) is the same.
    assert EnvironmentConfig().model_dump() == {
        "name": "bfcl", "max_steps": 30, "max_steps_per_turn": 4, "max_observation_chars": 80, "tool_list": "names",
        "prompt_style": "compact", "bfcl_handler": None,
    }  # fmt: skip
    assert EnvironmentConfig(name="workplace").model_dump() == {
        "name": "workplace", "max_steps": 30, "max_steps_per_turn": 4, "max_observation_chars": 80,
        "tool_list": "names",
    }  # fmt: skip
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
    assert loaded.model_dump() == {k: v for k, v in workplace.items() if k not in ("prompt_style", "bfcl_handler")}
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
