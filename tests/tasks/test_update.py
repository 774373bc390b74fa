"""The update stage: TRL's GRPO moves the policy toward rewarded completions and away from the others."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trl.trainer.utils as trl_utils
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

import tasks.training.grpo_trainer
from agent.chat import ChatFormat, render_tiny
from agent.tiny import build_model, train_tokenizer
from agent.transformers_engine import load_policy
from agent.weights import adapter_chain
from coevolve.config import PipelineConfig, PolicyConfig
from coevolve.errors import DataError
from coevolve.records import Message, Segment, Trajectory
from tasks.common import open_warehouse
from tasks.training.finite_check import DivergedUpdateError
from tasks.training.grpo_groups import group_trajectories, replay_rows, segment_groups
from tasks.training.grpo_trainer import ReplayGRPOTrainer, SharedPrefix, unscored_prefix_length, use_behaviour_logprobs
from tasks.update import grpo_update, kl_reference_checkpoint

GROUP_SIZE = 4
GOOD = "[mkdir(dir_name='temp')]"
BAD = "[cd(folder='nowhere')]"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init tiny Qwen3 with the tiny tokenizer (no SFT: the test needs weights, not skill)."""
    text = render_tiny([Message("user", "make a folder temp"), Message("assistant", GOOD + " " + BAD)], False)
    tokenizer = train_tokenizer([text] * 4, vocab_size=300)
    model = build_model(tokenizer, PolicyConfig(hidden_size=32, num_layers=1), seed=0)
    out = tmp_path_factory.mktemp("update") / "round-000"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _completion_logprobs(model_dir: Path, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    model, _ = load_policy(model_dir)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def _batch(policy_dir: Path, temperature: float, rewards: dict[str, list[float]]) -> list[Trajectory]:
    """Per task, alternate the good and the bad message; the good one also gets a tool result appended."""
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
                    run_id="test",
                    round=0,
                    task_id=task_id,
                    sample=sample,
                    steps=[],
                    prompt_ids=prompt,
                    completion_ids=message + env,
                    completion_mask=[1] * len(message) + [0] * len(env),
                    logprobs=logprobs + [0.0] * len(env),
                    reward=reward,
                    success=reward > 0,
                    finish_reason="done",
                )
            )
    return out


def _config(tmp_path: Path, **training) -> PipelineConfig:
    return PipelineConfig(
        state_dir=tmp_path,
        rollout={"group_size": GROUP_SIZE, "temperature": 0.9},
        training={"learning_rate": 3e-3, "updates_per_batch": 2, **training},
    )


def _mean_logprob(model_dir: Path, policy_dir: Path, text: str) -> float:
    _, tokenizer = load_policy(policy_dir)
    chat = ChatFormat(tokenizer)
    values = _completion_logprobs(
        model_dir, chat.prompt_ids([Message("user", "make a folder temp")]), chat.generated_ids(text), 1.0
    )
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
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 0.0, 0.0]})
    out = tmp_path / "round-001"
    grpo_update(policy_dir, trajectories, _config(tmp_path, updates_per_batch=1), out)
    assert (out / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).chat_template is not None


def test_a_micro_batch_runs_each_distinct_prompt_once_and_scores_as_the_full_pass(policy_dir):
    """Two tasks x two samples: the two prompts go through the model once each, not four times."""
    model, _ = load_policy(policy_dir)
    add_fused_lm_head(model, temperature=0.9)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (n,), generator=generator) for n in (9, 12)]
    completions = [torch.randint(3, 300, (n,), generator=generator) for n in (7, 5, 6, 7)]
    width, length = 12, 7
    input_ids = torch.zeros((4, width + length), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, completion in enumerate(completions):
        prompt = prompts[row // 2]
        input_ids[row, width - len(prompt) : width] = prompt  # left-padded prompts, right-padded completions
        input_ids[row, width : width + len(completion)] = completion
        attention_mask[row, width - len(prompt) : width + len(completion)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :width] = -100
    assert unscored_prefix_length(labels) == width - 1
    positions = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: positions.append(args[0].numel()))

    def scored(call):
        model.zero_grad()
        out = call(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        out.log_probs[:, -length:].sum().backward()
        return out.log_probs[:, -length:].detach(), [p.grad.clone() for p in model.parameters()]

    full, full_grads = scored(model)
    shared, shared_grads = scored(SharedPrefix(model))
    hook.remove()
    assert positions == [4 * (width + length), 2 * (width - 1), 4 * (length + 1)]
    assert torch.allclose(shared, full, atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(shared_grads, full_grads, strict=True))


def test_gradient_checkpointing_trains_the_same_update_up_to_float_rounding(policy_dir, tmp_path):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0], "t-b": [0.0, 1.0, 0.0, 0.0]})
    weights = {}
    for on in (False, True):
        out = tmp_path / f"checkpointing-{on}"
        # One thread: on two the recomputed pass splits its sums across the threads in another order, and Adam's
        # first steps magnify that rounding to about 2e-5.
        config = _config(tmp_path, gradient_checkpointing=on, torch_threads=1)
        grpo_update(policy_dir, trajectories, config, out)
        weights[on] = load_policy(out)[0].state_dict()
    assert weights[True].keys() == weights[False].keys()
    assert all(torch.allclose(weights[True][k], weights[False][k], atol=1e-6) for k in weights[True])


def test_an_update_in_the_rounds_process_trains_on_the_training_thread_count(policy_dir, tmp_path):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    for threads in (2, 1):
        grpo_update(policy_dir, trajectories, _config(tmp_path, torch_threads=threads), tmp_path / f"threads-{threads}")
        assert torch.get_num_threads() == threads


def test_lora_update_saves_merged_weights_and_the_adapter(policy_dir, tmp_path):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    out = tmp_path / "round-001"
    stats = grpo_update(
        policy_dir, trajectories, _config(tmp_path, use_lora=True, lora_rank=4, updates_per_batch=1), out
    )
    assert stats["steps"] == 1
    assert (out / "adapter" / "adapter_config.json").is_file()
    saved = AutoModelForCausalLM.from_pretrained(out).state_dict()
    # The saved weights are the base with the trained adapter merged in: no adapter left, and not the base.
    merged = PeftModel.from_pretrained(load_policy(policy_dir)[0], out / "adapter").merge_and_unload().state_dict()
    base = load_policy(policy_dir)[0].state_dict()
    assert saved.keys() == merged.keys() == base.keys()
    assert all(torch.allclose(saved[name], merged[name], atol=1e-6) for name in saved)
    assert any(not torch.equal(saved[name], base[name]) for name in saved)


def test_zero_variance_batch_is_skipped_and_copies_the_input(policy_dir, tmp_path):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0] * 4, "t-b": [0.0] * 4})
    out = tmp_path / "round-001"
    stats = grpo_update(policy_dir, trajectories, _config(tmp_path), out)
    assert stats["skipped"] is True and stats["steps"] == 0 and stats["groups"] == 0
    assert (out / "model.safetensors").read_bytes() == (policy_dir / "model.safetensors").read_bytes()


def test_a_skipped_lora_update_of_the_base_carries_an_adapter_chain_to_it(policy_dir, tmp_path):
    """LoRA weight sync serves checkpoint r+1 as adapters on the served base: a copy needs a chain that reaches it."""
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0] * 4})
    out = tmp_path / "round-001"
    config = _config(tmp_path, use_lora=True, lora_rank=4)
    assert grpo_update(policy_dir, trajectories, config, out)["skipped"] is True
    chain = adapter_chain(out, [str(policy_dir)])
    assert chain is not None and chain[0] == str(policy_dir) and chain[1] == [out / "adapter"]

    base, _ = load_policy(policy_dir)
    with_adapter = PeftModel.from_pretrained(load_policy(policy_dir)[0], out / "adapter").merge_and_unload()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert torch.equal(with_adapter(input_ids=ids).logits, base(input_ids=ids).logits)


def _shifted(trajectories: list[Trajectory], shift: float) -> list[Trajectory]:
    """The same trajectories with every model token's stored logprob moved by ``shift``."""
    return [
        dataclasses.replace(
            t, logprobs=[lp + shift if m else lp for lp, m in zip(t.logprobs, t.completion_mask, strict=True)]
        )
        for t in trajectories
    ]


def test_stored_behaviour_logprobs_are_what_trls_importance_ratio_divides_by(policy_dir, tmp_path):
    # At the first step the policy is the checkpoint that sampled: with stored logprobs equal to its
    # own, no ratio is clipped; claiming each sampled token was 0.5 nats less likely makes the ratio
    # exp(0.5) = 1.65 > 1 + epsilon_high on every token, so TRL clips all positive-advantage tokens.
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    config = _config(tmp_path, updates_per_batch=1)
    exact = grpo_update(policy_dir, trajectories, config, tmp_path / "exact")
    shifted = grpo_update(policy_dir, _shifted(trajectories, -0.5), config, tmp_path / "shifted")
    assert exact["clip_ratio/region_mean"] == pytest.approx(0.0, abs=1e-6)
    assert shifted["clip_ratio/high_mean"] > 0.3
    assert shifted["clip_ratio/region_mean"] > exact["clip_ratio/region_mean"]


def test_the_loss_and_the_kl_reference_project_only_the_trained_tokens_and_log_what_trls_full_projection_logs(
    policy_dir, tmp_path, monkeypatch
):
    # The rewarded episodes carry a tool result (mask 0) after the message: the loss never counts it, so its
    # positions, like the prompt's and the padding's, are not projected onto the vocabulary.
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    config = _config(tmp_path, updates_per_batch=1)
    projected: list[int] = []
    chunked = trl_utils._ChunkedLogProbFunction

    def recording(hidden, *args):
        projected.append(hidden.shape[0])
        return chunked.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", SimpleNamespace(apply=recording))
    scored = grpo_update(policy_dir, trajectories, config, tmp_path / "scored")
    # The KL reference's pass (no gradient) and the loss's each project only the trained tokens.
    trained = sum(sum(t.completion_mask) for t in trajectories)
    assert trained < sum(len(t.completion_ids) for t in trajectories)  # a tool result, or nothing is tested
    assert projected == [trained, trained]

    # TRL's own scoring projects every position of the batch; the figures it logs are the same.
    monkeypatch.setattr(
        ReplayGRPOTrainer, "_get_per_token_logps_and_entropies", GRPOTrainer._get_per_token_logps_and_entropies
    )
    projected.clear()
    full = grpo_update(policy_dir, trajectories, config, tmp_path / "full")
    assert min(projected) > sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories) // 2
    for figure in ("loss", "entropy", "kl"):
        assert scored[figure] == pytest.approx(full[figure], rel=1e-4, abs=1e-7)


def test_a_trl_batch_without_rollout_logprobs_fails_naming_the_tested_trl_version():
    with pytest.raises(DataError, match=r"trl==1\.16\.0"):
        use_behaviour_logprobs({"old_per_token_logps": torch.zeros(2, 3), "advantages": torch.zeros(2)})


@pytest.fixture(scope="module")
def later_checkpoint(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint a few rounds on from policy_dir (checkpoint 0): the same model with perturbed weights."""
    model, tokenizer = load_policy(policy_dir)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=noise))
    out = tmp_path_factory.mktemp("update") / "round-003"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _first_step_kl(policy: Path, reference: Path, trajectories: list[Trajectory], temperature: float) -> float:
    """TRL's k3 estimate of KL(policy || reference) over the model tokens of one group, at the sampling temperature."""
    total, count = 0.0, 0
    for t in trajectories:
        model_tokens = [i for i, m in zip(t.completion_ids, t.completion_mask, strict=True) if m]
        policy_lp = _completion_logprobs(policy, t.prompt_ids, model_tokens, temperature)
        reference_lp = _completion_logprobs(reference, t.prompt_ids, model_tokens, temperature)
        total += sum(math.exp(r - p) - (r - p) - 1 for p, r in zip(policy_lp, reference_lp, strict=True))
        count += len(model_tokens)
    return total / count


@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_the_kl_penalty_is_taken_against_the_reference_checkpoint_given(
    policy_dir, later_checkpoint, tmp_path, use_lora
):
    # One group, one step: TRL's logged KL is that of the round's input against its reference model.
    trajectories = _batch(later_checkpoint, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    config = _config(tmp_path, updates_per_batch=1, use_lora=use_lora, lora_rank=4)
    initial = grpo_update(later_checkpoint, trajectories, config, tmp_path / "initial", reference_checkpoint=policy_dir)
    round_ = grpo_update(
        later_checkpoint, trajectories, config, tmp_path / "round", reference_checkpoint=later_checkpoint
    )
    expected = _first_step_kl(later_checkpoint, policy_dir, trajectories, 0.9)
    assert expected > 1e-3  # the two checkpoints really differ
    assert initial["kl"] == pytest.approx(expected, rel=1e-3)
    assert round_["kl"] == pytest.approx(0.0, abs=1e-6)
    assert initial["kl_reference_checkpoint"] == str(policy_dir)


def test_kl_reference_initial_is_checkpoint_zero_of_the_run_and_round_the_input(policy_dir, later_checkpoint, tmp_path):
    config = _config(tmp_path)
    assert config.training.kl_reference == "initial"  # the paper's penalty against the initial policy
    with open_warehouse(config) as wh:
        wh.mark_stage(config.run_id, 0, "prepare", {"checkpoint": str(policy_dir)})
        assert kl_reference_checkpoint(config, wh, later_checkpoint) == policy_dir
        assert (
            kl_reference_checkpoint(_config(tmp_path, kl_reference="round"), wh, later_checkpoint) == later_checkpoint
        )


def test_kl_reference_initial_without_a_recorded_checkpoint_zero_fails(later_checkpoint, tmp_path):
    with open_warehouse(_config(tmp_path)) as wh, pytest.raises(DataError, match="checkpoint 0"):
        kl_reference_checkpoint(_config(tmp_path), wh, later_checkpoint)


# --- episodes of several segments (a prompt that rewrote history started a new one) -----------------


def _with_second_segment(policy_dir: Path, trajectories: list[Trajectory], samples: set[int]) -> list[Trajectory]:
    """The trajectories, those of ``samples`` with a second segment: a new prompt and the same reply."""
    _, tokenizer = load_policy(policy_dir)
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt_ids(
        [Message("user", "make a folder temp"), Message("assistant", "ok"), Message("user", "again")]
    )
    out = []
    for t in trajectories:
        if t.sample in samples:
            message = chat.generated_ids(GOOD if t.reward > 0 else BAD)
            logprobs = _completion_logprobs(policy_dir, prompt, message, 0.9)
            t = dataclasses.replace(t, later_segments=[Segment(prompt, message, [1] * len(message), logprobs)])
        out.append(t)
    return out


def test_one_segment_episodes_are_one_group_per_task_holding_their_stored_tokens(policy_dir):
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    groups, _ = group_trajectories(trajectories, GROUP_SIZE)
    slots = segment_groups(groups)
    assert slots == {"t-a": ("t-a", 0)}
    rows = replay_rows(["t-a"] * GROUP_SIZE, groups, slots, pad_token_id=0)
    assert rows["completion_ids"] == [t.completion_ids for t in trajectories]
    assert rows["env_mask"] == [t.completion_mask for t in trajectories]


def test_every_segment_is_handed_to_trl_once_and_fillers_hold_no_trained_token(policy_dir):
    trajectories = _with_second_segment(policy_dir, _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]}), {0, 3})
    groups, _ = group_trajectories(trajectories, GROUP_SIZE)
    slots = segment_groups(groups)
    assert list(slots) == ["t-a", "t-a#1"]
    rows = replay_rows([key for key in slots for _ in range(GROUP_SIZE)], groups, slots, pad_token_id=0)
    trained = [
        (p, c, m)
        for p, c, m in zip(rows["prompt_ids"], rows["completion_ids"], rows["env_mask"], strict=True)
        if any(m)
    ]
    every_segment = [(s.prompt_ids, s.completion_ids, s.completion_mask) for t in trajectories for s in t.segments]
    assert sorted(map(repr, trained)) == sorted(map(repr, every_segment))
    assert sum(not any(m) for m in rows["env_mask"]) == 2  # samples 1 and 2 have no second segment
    assert rows["stored_reward"] == [t.reward for t in trajectories] * 2


def test_trls_advantage_of_a_segment_slot_is_its_episodes(policy_dir, tmp_path, monkeypatch):
    trajectories = _with_second_segment(
        policy_dir, _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0], "t-b": [0.0, 1.0, 0.0, 0.0]}), {0, 1}
    )
    batches = []
    behaviour = tasks.training.grpo_trainer.use_behaviour_logprobs

    def record(batch):
        batches.append(batch["advantages"].tolist())
        return behaviour(batch)

    monkeypatch.setattr(tasks.training.grpo_trainer, "use_behaviour_logprobs", record)
    stats = grpo_update(policy_dir, trajectories, _config(tmp_path, updates_per_batch=1), tmp_path / "round-001")
    assert stats["groups"] == 2 and stats["segment_groups"] == 4 and stats["steps"] == 1
    # TRL's rows, group by group in dataset order: t-a, t-a#1, t-b, t-b#1.
    a, a1, b, b1 = (batches[0][i : i + GROUP_SIZE] for i in range(0, 4 * GROUP_SIZE, GROUP_SIZE))
    assert len(batches[0]) == 4 * GROUP_SIZE
    assert a1 == a and b1 == b
    assert any(a) and any(b)


# -- an update that diverges is never saved --------------------------------------------------------------------


def _scaled_policy(policy_dir: Path, folder: Path, scale: float) -> Path:
    """``policy_dir`` with its final norm's weights times ``scale``: finite, but outsized for a large rate."""
    model, tokenizer = load_policy(policy_dir)
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_an_update_that_makes_weights_non_finite_stops_before_anything_is_written(policy_dir, tmp_path):
    """AdamW at the highest rate the configuration allows, on outsized weights, left 23,072 weights inf or NaN with
    an ordinary loss: the update stops naming the rate, and neither the checkpoint nor its trainer state exist."""
    scaled = _scaled_policy(policy_dir, tmp_path / "scaled", 1e3)
    trajectories = _batch(scaled, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    out = tmp_path / "round-001"
    with pytest.raises(DivergedUpdateError, match=r"training.learning_rate \(now 0.1;") as refused:
        grpo_update(scaled, trajectories, _config(tmp_path, learning_rate=0.1, updates_per_batch=2), out)
    assert "non-finite" in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scaled"]


def test_an_input_checkpoint_with_non_finite_weights_is_not_trained(policy_dir, tmp_path):
    broken = _scaled_policy(policy_dir, tmp_path / "broken", math.inf)
    trajectories = _batch(policy_dir, 0.9, {"t-a": [1.0, 0.0, 1.0, 0.0]})
    with pytest.raises(DivergedUpdateError, match="holds .* non-finite weights"):
        grpo_update(broken, trajectories, _config(tmp_path), tmp_path / "round-001")
    assert not (tmp_path / "round-001").exists()
