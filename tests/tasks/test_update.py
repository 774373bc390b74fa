"""The update stage: TRL's GRPO moves the policy toward rewarded completions and away from the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import PipelineConfig, PolicyConfig
from coevolve.records import Message, Trajectory
from tasks.update import group_trajectories, grpo_update

GROUP_SIZE = 4
GOOD = "[mkdir(dir_name='temp')]"
BAD = "[cd(folder='nowhere')]"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init tiny Qwen3 with the tiny tokenizer (no SFT: the test needs weights, not skill)."""
    from agent.tiny import build_model, train_tokenizer
    from agent.chat import render_tiny

    text = render_tiny([Message("user", "make a folder temp"), Message("assistant", GOOD + " " + BAD)], False)
    tokenizer = train_tokenizer([text] * 4, vocab_size=300)
    model = build_model(tokenizer, PolicyConfig(hidden_size=32, num_layers=1), seed=0)
    out = tmp_path_factory.mktemp("update") / "round-000"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _completion_logprobs(model_dir: Path, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    import torch

    from agent.engine import load_policy

    model, _ = load_policy(model_dir)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def _batch(policy_dir: Path, temperature: float, rewards: dict[str, list[float]]) -> list[Trajectory]:
    """Per task, alternate the good and the bad message; the good one also gets a tool result appended."""
    from agent.engine import load_policy
    from agent.chat import ChatFormat

    _, tokenizer = load_policy(policy_dir)
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt_ids([Message("user", "make a folder temp")])
    tool_ids = chat.continuation_ids([Message("tool", "ok")])
    out = []
    for task_id, task_rewards in rewards.items():
        for sample, reward in enumerate(task_rewards):
            message = chat.generated_ids(GOOD if reward > 0 else BAD)
            logprobs = _completion_logprobs(policy_dir, prompt, message, temperature)
            env = tool_ids if reward > 0 else []
            out.append(
                Trajectory(
                    run_id="test", round=0, task_id=task_id, sample=sample, steps=[],
                    prompt_ids=prompt, completion_ids=message + env, completion_mask=[1] * len(message) + [0] * len(env),
                    logprobs=logprobs + [0.0] * len(env), reward=reward, success=reward > 0, finish_reason="done",
                )
            )
    return out


def _config(tmp_path: Path, **training) -> PipelineConfig:
    return PipelineConfig(
        state_dir=tmp_path,
        rollout={"group_size": GROUP_SIZE, "temperature": 0.9},
        training={"learning_rate": 3e-3, "steps_per_round": 2, **training},
    )


def _mean_logprob(model_dir: Path, policy_dir: Path, text: str) -> float:
    from agent.chat import ChatFormat
    from agent.engine import load_policy

    _, tokenizer = load_policy(policy_dir)
    chat = ChatFormat(tokenizer)
    values = _completion_logprobs(model_dir, chat.prompt_ids([Message("user", "make a folder temp")]), chat.generated_ids(text), 1.0)
    return sum(values) / len(values)


def test_groups_without_reward_variance_or_with_missing_samples_are_dropped(policy_dir):
    rewards = {"t-mixed": [1.0, 0.0, 1.0, 0.0], "t-flat": [0.0] * 4, "t-short": [1.0, 0.0]}
    kept, dropped = group_trajectories(_batch(policy_dir, 0.9, rewards), GROUP_SIZE)
    assert list(kept) == ["t-mixed"]
    assert dropped == {"flat": 1, "malformed": 1}


def test_one_update_raises_rewarded_and_lowers_unrewarded_completions(policy_dir, tmp_path):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0], "t-b": [0.0, 1.0, 0.0, 0.0]})
    out = tmp_path / "round-001"
    stats = grpo_update(policy_dir, trajectories, _config(tmp_path), out)
    assert stats["skipped"] is False and stats["steps"] == 2 and stats["groups"] == 2
    assert {"loss", "duration_s", "kl"} <= stats.keys()
    assert _mean_logprob(out, policy_dir, GOOD) > _mean_logprob(policy_dir, policy_dir, GOOD)
    assert _mean_logprob(out, policy_dir, BAD) < _mean_logprob(policy_dir, policy_dir, BAD)


def test_updated_checkpoint_loads_with_from_pretrained(policy_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 0.0, 0.0]})
    out = tmp_path / "round-001"
    grpo_update(policy_dir, trajectories, _config(tmp_path, steps_per_round=1), out)
    assert (out / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).chat_template is not None


def test_lora_update_saves_merged_weights_and_the_adapter(policy_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    out = tmp_path / "round-001"
    stats = grpo_update(policy_dir, trajectories, _config(tmp_path, use_lora=True, lora_rank=4, steps_per_round=1), out)
    assert stats["steps"] == 1
    assert (out / "adapter" / "adapter_config.json").is_file()
    AutoModelForCausalLM.from_pretrained(out)


def test_zero_variance_batch_is_skipped_and_copies_the_input(policy_dir, tmp_path):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0] * 4, "t-b": [0.0] * 4})
    out = tmp_path / "round-001"
    stats = grpo_update(policy_dir, trajectories, _config(tmp_path), out)
    assert stats["skipped"] is True and stats["steps"] == 0 and stats["groups"] == 0
    assert (out / "model.safetensors").read_bytes() == (policy_dir / "model.safetensors").read_bytes()
