"""One engine contract (agent/engine.py): every engine's requests are checked once, and an engine is one module.

The toy engine below answers every prompt with the same tool call. Written as the one module of a package
that declares it under the entry-point group ``coevolve.engines``, it is picked by ``rollout.engine`` and plays
a whole round through the real CLI, with nothing of the project edited.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.engines import BUILT_IN, engine_class
from coevolve.config import load_config
from coevolve.config.engines import BUILT_IN_ENGINES
from coevolve.errors import ConfigError
from storage.warehouse import Warehouse
from tests.flows.conftest import REPO, env_with_package, install_package

# Checkpoint 0 of the default configuration, shipped in the repository: the toy engine reads its tokenizer.
SHIPPED_CHECKPOINT = REPO / "envs" / "bfcl" / "checkpoint0"

CANNED_ENGINE = '''
"""canned: answers every prompt with one fixed tool call, whatever the checkpoint's weights would say."""

from transformers import AutoTokenizer

from agent.chat import ChatFormat
from agent.engine import Engine, Generation

REPLY = "[ls()]"


class CannedEngine(Engine):
    name = "canned"

    def __init__(self, checkpoint):
        self.tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        self.chat = ChatFormat(self.tokenizer)
        self.calls = 0

    @classmethod
    def from_config(cls, checkpoint, config):
        return cls(checkpoint)

    def _generate(self, prompts, temperature, max_new_tokens, seeds):
        self.calls += 1
        ids = self.tokenizer.encode(REPLY, add_special_tokens=False)[: max_new_tokens - 1] + [self.chat.eos_token_id]
        return [Generation(token_ids=list(ids), logprobs=[-1.0] * len(ids), finish_reason="stop") for _ in prompts]
'''


def install_canned_engine(folder: Path) -> Path:
    """The toy's module and the metadata of a package declaring it, as an installed package leaves them."""
    return install_package(
        folder, "canned_engine", CANNED_ENGINE, "coevolve.engines", "canned = canned_engine:CannedEngine"
    )


def test_the_configuration_and_the_registry_name_the_same_built_in_engines():
    assert list(BUILT_IN) == list(BUILT_IN_ENGINES)
    assert all(engine_class(name).name == name for name in BUILT_IN_ENGINES)


def test_an_engine_nobody_declares_is_refused_with_the_names_that_exist(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[f"state_dir={tmp_path}", "rollout.engine=canned"], environ={})
    assert "canned" in str(refused.value) and "transformers" in str(refused.value)


def test_every_engine_gets_the_requests_checked_by_the_contract(tmp_path):
    module_path = install_canned_engine(tmp_path / "site") / "canned_engine.py"
    spec = importlib.util.spec_from_file_location("canned_engine", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine = module.CannedEngine(SHIPPED_CHECKPOINT)
    with pytest.raises(ValueError, match="one seed per prompt"):
        engine.generate([[1, 2]], 0.9, 8, seeds=[1, 2])
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[1], []], 0.9, 8)
    assert engine.generate([], 0.9, 8) == [] and engine.calls == 0
    (reply,) = engine.generate([[1, 2]], 0.9, 8, seeds=[5])
    assert reply.finish_reason == "stop" and reply.token_ids[-1] == engine.chat.eos_token_id


@pytest.mark.slow
def test_an_installed_engine_plays_a_round_through_the_cli(tiny_config, tmp_path):
    plugin = install_canned_engine(tmp_path / "site")
    config = tiny_config(tmp_path / "state", rollout={"engine": "transformers"})
    data = config.model_dump(mode="json")
    data["rollout"]["engine"] = "canned"  # only a process with the package installed accepts it
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    env = env_with_package(config.state_dir, plugin)
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "evolve", "--config", str(config_file), "--rounds", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        texts = wh.sql("SELECT DISTINCT model_text FROM steps WHERE run_id = 'e2e'")["model_text"].to_list()
        finished = wh.round_status("e2e", 0)
    assert finished == "finished"
    assert texts and all(text.strip().startswith("[ls()]") for text in texts)
