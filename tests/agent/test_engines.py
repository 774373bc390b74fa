"""rollout.engine picks the generation engine; every engine keeps the same contract."""

from __future__ import annotations

import pytest

from agent.engines import context_length, make_engine
from agent.http_engine import OpenAICompatibleEngine
from agent.transformers_engine import TransformersEngine
from coevolve.config import EnvironmentConfig, load_config
from coevolve.errors import ConfigError
from coevolve.records import Provenance, Task, ToolCall
from tasks.rollout import play_episodes


def config(tmp_path, **rollout):
    return load_config(data={"state_dir": str(tmp_path), "rollout": rollout}, environ={})


def test_transformers_is_the_default_engine(tmp_path, served_policy_dir):
    engine = make_engine(served_policy_dir, config(tmp_path))
    assert isinstance(engine, TransformersEngine)
    assert context_length(engine) == engine.model.config.max_position_embeddings


def test_openai_engine_needs_a_base_url(tmp_path):
    with pytest.raises(ConfigError, match="base_url"):
        config(tmp_path, engine="openai")


def test_openai_engine_asks_the_server_for_the_checkpoint_by_default(tmp_path, served_policy_dir, monkeypatch):
    monkeypatch.setenv("COEVOLVE_OPENAI_API_KEY", "secret")
    engine = make_engine(served_policy_dir, config(tmp_path, engine="openai", base_url="http://127.0.0.1:9/v1/"))
    assert isinstance(engine, OpenAICompatibleEngine)
    assert engine.model_name == str(served_policy_dir)
    assert engine.base_url == "http://127.0.0.1:9/v1"
    assert engine._client.headers["Authorization"] == "Bearer secret"
    assert engine.chat.eos_token_id == engine.tokenizer.convert_tokens_to_ids("<|end|>")


def test_a_served_model_name_overrides_the_checkpoint_path(tmp_path, served_policy_dir):
    engine = make_engine(
        served_policy_dir, config(tmp_path, engine="openai", base_url="http://h/v1", served_model="policy")
    )
    assert engine.model_name == "policy"


def test_rollouts_through_the_server_follow_the_rollout_contract(tmp_path, openai_server):
    """The rollout stage runs unchanged on the server: episodes end with a reason and exact token bookkeeping."""
    engine = make_engine(openai_server.model_dir, config(tmp_path, engine="openai", base_url=openai_server.base_url))
    task = Task(
        environment="bfcl",
        initial_config={"GorillaFileSystem": {"root": {"workspace": {"type": "directory", "contents": {}}}}},
        involved_classes=["GorillaFileSystem"],
        turns=["make a folder logs"],
        reference=[[ToolCall("mkdir", {"dir_name": "logs"})]],
        provenance=Provenance(origin="seed"),
    )
    trajectories = play_episodes(
        engine, [task], samples=3, temperature=0.9, max_new_tokens=24, env_config=EnvironmentConfig(max_steps=3),
        run_id="r", round_=0, max_context_tokens=context_length(engine), progress=False,
    )  # fmt: skip
    assert len(trajectories) == 3
    for t in trajectories:
        assert t.finish_reason in {"done", "max_steps", "length", "error"}
        assert len(t.completion_ids) == len(t.completion_mask) == len(t.logprobs)
        assert sum(t.completion_mask) == sum(s.completion_tokens for s in t.steps) > 0
