"""Training steps as one run: each update resumes the trainer state the previous one saved beside its checkpoint.

The real TRL trainer on the tiny builtin policy; batches are stored groups of the test_update fixtures.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import PeftModel
from prefect.logging.loggers import disable_run_logger
from safetensors.torch import load_file
from transformers.trainer_callback import PrinterCallback

from agent.checkpoints import OPTIMIZER_STATE_FIX, TRAINER_STATE_SUBDIR
from agent.transformers_engine import load_policy
from agent.weights import adapter_chain
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.records import Trajectory
from coevolve.stages import UpdateInput
from tasks.common import open_warehouse
from tasks.training.grpo_groups import group_round, step_trajectories
from tasks.training.grpo_trainer import ReplayGRPOTrainer, StoredRollouts, grpo_arguments, stored_reward
from tasks.update import grpo_update, kl_reference_checkpoint, update_stage
from tests.tasks import test_update as single_step_tests
from tests.tasks.test_update import GROUP_SIZE, _batch, _first_step_kl

policy_dir = single_step_tests.policy_dir

# Four batches of two tasks each, in the order a run plays them; every task group has reward variance.
BATCH_REWARDS = [
    {"b0-a": [1.0, 0.0, 1.0, 0.0], "b0-b": [0.0, 1.0, 0.0, 0.0]},
    {"b1-a": [1.0, 1.0, 0.0, 0.0], "b1-b": [0.0, 0.0, 0.0, 1.0]},
    {"b2-a": [0.0, 1.0, 1.0, 1.0], "b2-b": [1.0, 0.0, 0.0, 0.0]},
    {"b3-a": [0.0, 0.0, 1.0, 1.0], "b3-b": [1.0, 0.0, 1.0, 1.0]},
]
# Largest |difference| allowed between a weight trained by four resumed steps and the same weight trained by
# one train() call over the four batches. Both apply the same AdamW updates to the same float32 weights from
# the same gradients: the state (moments, step count, scheduler) is saved and loaded exactly, and the float32
# checkpoints round-trip exactly. What may differ is rounding: a fresh trainer builds its own reference model
# and re-seeds before the resumed RNG is loaded, and TRL shuffles the rows of a generation batch into
# micro-batches, so the gradient's terms can be summed in another order (float32, about 1e-7 relative),
# which Adam's update (lr 3e-3) turns into weight differences far below its step size. Measured: 1.2e-7 at
# most (one float32 rounding step) over the 23,072 weights after 4 steps. The bound leaves 100x that for other
# CPUs' kernels and stays 750x below what a fresh optimizer at each step does to the same weights (1.5e-2
# measured; the test checks it exceeds 50x the bound).
WEIGHT_TOLERANCE = 2e-5


def _config(tmp_path: Path, **training) -> PipelineConfig:
    return PipelineConfig(
        state_dir=tmp_path,
        seed=3,
        rollout={"group_size": GROUP_SIZE, "temperature": 0.9},
        training={"learning_rate": 3e-3, "updates_per_batch": 1, **training},
    )


@pytest.fixture(scope="module")
def batches(policy_dir: Path) -> list[list[Trajectory]]:
    """The four stored batches, played (their behaviour logprobs taken) by checkpoint 0."""
    return [_batch(policy_dir, 0.9, rewards) for rewards in BATCH_REWARDS]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() <= b.keys()  # a state_dict may also list a tied output layer the file leaves out
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _steps(policy_dir: Path, batches: list[list[Trajectory]], config: PipelineConfig, root: Path) -> list[dict]:
    """Two rounds of two steps: four updates, each on the previous step's checkpoint folder."""
    checkpoint, out = policy_dir, []
    for index, batch in enumerate(batches):
        round_, step = divmod(index, 2)
        folder = root / (f"round-{round_ + 1:03d}" if step == 1 else f"round-{round_:03d}-step-01")
        out.append(grpo_update(checkpoint, batch, config, folder, reference_checkpoint=policy_dir))
        checkpoint = folder
    return out


def _one_run(policy_dir: Path, batches: list[list[Trajectory]], config: PipelineConfig) -> dict[str, torch.Tensor]:
    """One GRPOTrainer.train() call whose generation batches are the four batches, in order."""
    everything = group_round([t for batch in batches for t in batch], GROUP_SIZE)
    one_batch = group_round(batches[0], GROUP_SIZE)
    model, tokenizer = load_policy(policy_dir)
    with tempfile.TemporaryDirectory() as scratch:
        args = grpo_arguments(config, one_batch, 1, scratch)  # a generation batch is one stored batch
        args.max_steps = len(batches)
        args.max_completion_length = everything.longest_completion
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = ReplayGRPOTrainer(
                model=model,
                reward_funcs=[stored_reward],
                args=args,
                train_dataset=Dataset.from_dict({"prompt": list(everything.slots)}),
                processing_class=tokenizer,
                rollout_func=StoredRollouts(everything, tokenizer.pad_token_id),
            )
        trainer.remove_callback(PrinterCallback)
        assert trainer.train().global_step == len(batches)
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_four_resumed_steps_over_two_rounds_end_where_one_run_over_the_four_batches_ends(policy_dir, batches, tmp_path):
    config = _config(tmp_path)
    _steps(policy_dir, batches, config, tmp_path / "carried")
    carried = _weights(tmp_path / "carried" / "round-002")
    one_run = _one_run(policy_dir, batches, config)
    assert _max_difference(carried, one_run) <= WEIGHT_TOLERANCE

    _steps(policy_dir, batches, _config(tmp_path, carry_optimizer=False), tmp_path / "fresh")
    assert _max_difference(_weights(tmp_path / "fresh" / "round-002"), one_run) > 50 * WEIGHT_TOLERANCE


def test_the_global_step_and_the_optimizer_state_continue_from_step_to_step(policy_dir, batches, tmp_path):
    stats = _steps(policy_dir, batches[:3], _config(tmp_path), tmp_path)
    assert [s["global_step"] for s in stats] == [1, 2, 3]
    assert [s["steps"] for s in stats] == [1, 1, 1]
    assert stats[0]["optimizer_resumed_from"] is None
    assert stats[1]["optimizer_resumed_from"] == str(tmp_path / "round-000-step-01" / TRAINER_STATE_SUBDIR)
    state = tmp_path / "round-001-step-01" / TRAINER_STATE_SUBDIR
    assert json.loads((state / "trainer_state.json").read_text())["global_step"] == 3
    moments = torch.load(state / "optimizer.pt", weights_only=True)["state"]
    assert all(int(m["step"]) == 3 for m in moments.values())  # AdamW's own count: three updates, not one


def _follow_the_fix(policy_dir, batches, tmp_path) -> None:
    """The fix the errors name: the run again from checkpoint 0 in a new state folder, fresh optimizer per step."""
    fresh = _config(tmp_path / "new-state", carry_optimizer=False)
    first = grpo_update(policy_dir, batches[0], fresh, tmp_path / "new-state" / "round-000-step-01")
    second = grpo_update(
        tmp_path / "new-state" / "round-000-step-01", batches[1], fresh, tmp_path / "new-state" / "round-001"
    )
    assert first["steps"] == second["steps"] == 1 and second["optimizer_resumed_from"] is None


def test_a_step_without_state_where_one_is_expected_fails_naming_the_fix(policy_dir, batches, tmp_path):
    first = tmp_path / "round-000-step-01"
    grpo_update(policy_dir, batches[0], _config(tmp_path, carry_optimizer=False), first)
    with pytest.raises(DataError, match="has no optimizer state") as refused:
        grpo_update(first, batches[1], _config(tmp_path), tmp_path / "round-001", state_expected=True)
    assert OPTIMIZER_STATE_FIX in str(refused.value) and "--round" not in str(refused.value)
    _follow_the_fix(policy_dir, batches, tmp_path)


def test_a_damaged_optimizer_state_fails_naming_the_fix(policy_dir, batches, tmp_path):
    first = tmp_path / "round-000-step-01"
    grpo_update(policy_dir, batches[0], _config(tmp_path), first)
    (first / TRAINER_STATE_SUBDIR / "optimizer.pt").write_bytes(b"not a torch file")
    with pytest.raises(DataError, match="could not be resumed") as refused:
        grpo_update(first, batches[1], _config(tmp_path), tmp_path / "round-001")
    assert OPTIMIZER_STATE_FIX in str(refused.value)
    (first / TRAINER_STATE_SUBDIR / "optimizer.pt").unlink()
    with pytest.raises(DataError, match="lacks optimizer.pt") as refused:
        grpo_update(first, batches[1], _config(tmp_path), tmp_path / "round-001")
    assert OPTIMIZER_STATE_FIX in str(refused.value)


def test_a_skipped_step_carries_the_state_to_the_next(policy_dir, batches, tmp_path):
    config = _config(tmp_path)
    first, skipped = tmp_path / "round-000-step-01", tmp_path / "round-001"
    grpo_update(policy_dir, batches[0], config, first)
    flat = _batch(policy_dir, 0.9, {"t-flat": [1.0] * GROUP_SIZE})
    stats = grpo_update(first, flat, config, skipped, state_expected=True)
    assert stats["skipped"] is True and stats["global_step"] == 1
    state = TRAINER_STATE_SUBDIR + "/optimizer.pt"
    assert (skipped / state).read_bytes() == (first / state).read_bytes()
    assert grpo_update(skipped, batches[1], config, tmp_path / "round-001-step-01")["global_step"] == 2


def test_lora_trains_one_adapter_on_checkpoint_zero_across_steps(policy_dir, batches, tmp_path):
    config = _config(tmp_path, use_lora=True, lora_rank=4)
    stats = _steps(policy_dir, batches[:3], config, tmp_path)
    assert [s["global_step"] for s in stats] == [1, 2, 3]
    last = tmp_path / "round-001-step-01"
    adapter = json.loads((last / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(policy_dir)
    assert adapter_chain(last, [str(policy_dir)]) == (str(policy_dir), [last / "adapter"])
    # The adapter moved at every step, and the merged weights are checkpoint 0 plus the last adapter.
    previous = load_file(str(tmp_path / "round-001" / "adapter" / "adapter_model.safetensors"))
    current = load_file(str(last / "adapter" / "adapter_model.safetensors"))
    assert _max_difference(previous, current) > 1e-4
    merged = PeftModel.from_pretrained(load_policy(policy_dir)[0], last / "adapter").merge_and_unload()
    assert _max_difference(_weights(last), merged.state_dict()) < 1e-6


def test_with_lora_the_kl_against_checkpoint_zero_is_taken_with_the_adapter_disabled(policy_dir, batches, tmp_path):
    # A large rate, so that after one step the policy is measurably away from checkpoint 0.
    config = _config(tmp_path, use_lora=True, lora_rank=4, learning_rate=3e-2)
    first = tmp_path / "round-000-step-01"
    grpo_update(policy_dir, batches[0], config, first, reference_checkpoint=policy_dir)
    played = _batch(first, 0.9, BATCH_REWARDS[1])  # played by the first step's policy
    stats = grpo_update(first, played, config, tmp_path / "round-001", reference_checkpoint=policy_dir)
    expected = _first_step_kl(first, policy_dir, played, 0.9)
    assert expected > 1e-5
    assert stats["kl"] == pytest.approx(expected, rel=1e-2)


def test_the_update_stage_trains_its_steps_batch_only_and_writes_the_steps_checkpoint(policy_dir, batches, tmp_path):
    config = _config(tmp_path, batches_per_round=2).with_overrides({"run_id": "test"})
    # Step 1 draws task b0-a again: round 0 holds its episodes of both steps (samples 0-3 and 4-7).
    step_one = [
        dataclasses.replace(t, sample=t.sample + GROUP_SIZE)
        for t in _batch(policy_dir, 0.9, {"b0-a": [0.0, 0.0, 1.0, 1.0], "b1-b": [1.0, 0.0, 0.0, 0.0]})
    ]
    with open_warehouse(config) as wh, disable_run_logger():
        wh.write_trajectories(batches[0] + step_one)
        wh.mark_stage(config.run_id, 0, "prepare", {"checkpoint": str(policy_dir)})
        first = update_stage.function(config, wh, UpdateInput(round_=0, checkpoint=str(policy_dir), step=0))
        second = update_stage.function(config, wh, UpdateInput(round_=0, checkpoint=first.checkpoint, step=1))
    assert first.checkpoint == str(config.checkpoint_after(0, 0)) != str(config.checkpoint_dir(1))
    assert second.checkpoint == str(config.checkpoint_dir(1))
    assert (first.stats["step"], second.stats["step"]) == (0, 1)
    assert second.stats["trajectories"] == 8 and second.trained_on["count"] == 8
    assert second.stats["global_step"] == 2 and second.stats["optimizer_resumed_from"].startswith(first.checkpoint)
    # The same as training the step's batch alone, its samples numbered from 0.
    alone = tmp_path / "alone"
    grpo_update(Path(first.checkpoint), step_trajectories(step_one, 1, GROUP_SIZE), config, alone, policy_dir)
    assert _max_difference(_weights(config.checkpoint_dir(1)), _weights(alone)) == 0.0


def test_a_lora_checkpoint_of_an_older_run_with_a_chain_of_adapters_is_refused_naming_the_fix(
    policy_dir, batches, tmp_path
):
    config = _config(tmp_path, use_lora=True, lora_rank=4)
    first = tmp_path / "round-001"
    grpo_update(policy_dir, batches[0], config, first)
    # An older run trained round 2's adapter on round 1's merged checkpoint, which holds an adapter itself.
    older = tmp_path / "round-002"
    shutil.copytree(first, older)
    adapter_config = older / "adapter" / "adapter_config.json"
    adapter_config.write_text(
        json.dumps({**json.loads(adapter_config.read_text()), "base_model_name_or_path": str(first)})
    )
    with pytest.raises(DataError, match="chain of adapters.*start a new run_id"):
        grpo_update(older, batches[1], config, tmp_path / "round-003")


def test_kl_reference_round_is_the_rounds_input_at_every_step(policy_dir, tmp_path):
    config = _config(tmp_path, kl_reference="round")
    step_input = tmp_path / "round-002-step-01"
    with open_warehouse(config) as wh:
        wh.mark_stage(config.run_id, 0, "prepare", {"checkpoint": str(policy_dir)})
        assert kl_reference_checkpoint(config, wh, step_input, round_=2, step=0) == step_input
        assert kl_reference_checkpoint(config, wh, step_input, round_=2, step=1) == config.checkpoint_dir(2)
        assert kl_reference_checkpoint(config, wh, step_input, round_=0, step=1) == policy_dir
        initial = _config(tmp_path)
        assert kl_reference_checkpoint(initial, wh, step_input, round_=2, step=1) == policy_dir
