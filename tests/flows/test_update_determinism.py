"""A resumed round redoes an interrupted update: with the same seed it must write the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.chat import ChatFormat, render_tiny
from agent.checkpoints import checkpoint_digest
from agent.tiny import build_model, train_tokenizer
from coevolve.config import PipelineConfig, PolicyConfig
from coevolve.records import Message, Trajectory
from tasks.update import grpo_update

pytestmark = pytest.mark.slow

GOOD, BAD = "[mkdir(dir_name='temp')]", "[cd(folder='nowhere')]"


def _policy_and_batch(tmp_path: Path) -> tuple[Path, list[Trajectory]]:
    text = render_tiny([Message("user", "make a folder temp"), Message("assistant", GOOD + " " + BAD)], False)
    tokenizer = train_tokenizer([text] * 4, vocab_size=300)
    policy = tmp_path / "round-000"
    build_model(tokenizer, PolicyConfig(hidden_size=32, num_layers=1), seed=0).save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt_ids([Message("user", "make a folder temp")])
    batch = []
    for task_id, rewards in {"t-a": [1.0, 0.0, 1.0, 0.0], "t-b": [0.0, 1.0, 0.0, 0.0]}.items():
        for sample, reward in enumerate(rewards):
            message = chat.generated_ids(GOOD if reward > 0 else BAD)
            batch.append(
                Trajectory(
                    run_id="test",
                    round=0,
                    task_id=task_id,
                    sample=sample,
                    steps=[],
                    prompt_ids=prompt,
                    completion_ids=message,
                    completion_mask=[1] * len(message),
                    logprobs=[-1.0] * len(message),
                    reward=reward,
                    success=reward > 0,
                    finish_reason="done",
                )
            )
    return policy, batch


def test_two_updates_from_the_same_groups_and_seed_write_identical_checkpoints(tmp_path: Path) -> None:
    policy, batch = _policy_and_batch(tmp_path)
    config = PipelineConfig(
        state_dir=tmp_path,
        seed=5,
        rollout={"group_size": 4, "temperature": 0.9},
        training={"learning_rate": 3e-3, "updates_per_batch": 2},
    )
    first = grpo_update(policy, batch, config, tmp_path / "first")
    second = grpo_update(policy, batch, config, tmp_path / "second")
    assert first["steps"] == second["steps"] == 2
    assert checkpoint_digest(tmp_path / "first") == checkpoint_digest(tmp_path / "second") != checkpoint_digest(policy)
