"""One GRPO update through TRL's GRPOTrainer on a round's stored rollouts (`train`).

The round's rollouts already exist (the rollout stage wrote them, with behaviour logprobs), so
nothing is generated here: TRL's GRPOTrainer receives them through its ``rollout_func`` hook and does
everything else itself: group-normalized advantages, the clipped objective (epsilon_low/high), the
KL penalty (beta), the optimizer, LoRA through peft.

How a round maps onto TRL (the groups themselves: tasks/training/grpo_groups.py):
- segment slot j of a task's group_size episodes is one TRL group: one dataset row per slot, which
  TRL repeats group_size times; the rollout hook hands back row i as episode i's segment j, or a
  filler row without trained tokens. Every row carries its episode's stored reward, so the rewards
  of every slot of a task are the same list and TRL's own group advantage of each slot equals the
  episode-level advantage of that task's group;
- the fillers change no loss: TRL's default loss_type 'dapo' (left as it is) sums the loss over the
  trained tokens (completion mask x env_mask) of a micro-batch and divides by the trained tokens of
  the whole generation batch, so a row without trained tokens adds nothing to either, and the loss
  is the token mean over every produced token of every step. (Under 'grpo', 'bnpo' or 'dr_grpo' the
  per-row or per-micro-batch means would count fillers.) TRL pads each micro-batch's completions to
  its longest; every slot group holds at least one real segment of one token or more, so a filler
  never lengthens a batch (and mask_truncated_completions is off, so its token need not be an EOS);
- one generation batch holds every group; each optimizer step accumulates over all groups, and
  the batch is reused for ``updates_per_batch`` steps (TRL's ``num_iterations``);
- under several processes (tasks/training/launch.py starts them) the generation batch is shared: each rank
  takes an equal number of whole groups (micro-batches of group_size rows), so every group enters every
  optimizer step exactly once, on one rank, and DDP averages the gradients; rank 0 writes the
  checkpoint. TRL sizes a generation batch as per-device batch x processes x steps_per_generation
  and drops an incomplete one, so steps_per_generation is the groups per rank, not all groups
  (with all of them, two ranks would ask for twice the rows there are and train zero steps);
- ``completion_mask`` becomes TRL's ``env_mask``, so tool results never enter the loss;
- the stored logprobs replace TRL's recomputed "old" logprobs, so the importance ratio is taken
  against the policy that actually sampled (same checkpoint: ratio ~1 at the first step). This
  overrides a private TRL method, tested against TRL 1.16.0 (the version pyproject pins); a TRL
  that no longer hands the rollout's logprobs to it fails the stage instead of training on
  recomputed ones;
- the KL penalty is taken against a reference checkpoint: TRL's own (full weights: the input
  checkpoint; LoRA: the adapter disabled, which is checkpoint 0) or another one loaded into TRL's
  reference model (`use_reference`);
- the reward function returns the stored reward.

How the steps of a run make one TRL run: a round's F training steps, and the rounds after it, each
build a trainer on the previous step's checkpoint and resume the trainer state that step saved
beside it (``<checkpoint>/trainer_state``: transformers' own optimizer.pt, scheduler.pt,
trainer_state.json and rng_state files, written with the Trainer's save methods and read by
``trainer.train(resume_from_checkpoint=...)``; tasks/training/grpo_resume.py), so the global step, the AdamW
moments and the scheduler continue as in one ``train()`` call over the same batches. ``max_steps`` is the resumed
global step plus this step's updates, and ``ignore_data_skip`` keeps transformers from skipping
batches of the new step's data as if it were the old run's. The weights come from the checkpoint,
not from the state folder (`ReplayGRPOTrainer._load_from_checkpoint`). With LoRA one adapter is
trained across the whole run on checkpoint 0: each step loads checkpoint 0, puts the previous
step's adapter weights into TRL's adapter, and saves the adapter (relative to checkpoint 0) and
the merged weights.

This module imports torch, trl and peft at its top; modules above it name it with
``optional_module("tasks.training.grpo_trainer")`` so that importing the flows stays cheap.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import transformers
import trl.trainer.utils as trl_utils
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers.cache_utils import DynamicLayer
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

from agent.checkpoints import ADAPTER_SUBDIR, TRAINER_STATE_SUBDIR, save_atomically, trainer_state_global_step
from agent.transformers_engine import load_policy
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from tasks.training.finite_check import refuse_non_finite, refuse_non_finite_input
from tasks.training.grpo_groups import RoundGroups, replay_rows
from tasks.training.grpo_resume import (
    continue_adapter,
    lora_chain,
    save_trainer_state,
    unusable_state,
)
from tasks.training.step_metrics import OptimizerStepLog, informative_share

# The TRL version whose GRPOTrainer internals (the batch keys below, the reference model) this module is tested against.
TESTED_TRL = "1.16.0"
# Where TRL 1.16 puts the rollout function's logprobs, and the "old" logprobs its importance ratio divides by.
BEHAVIOUR_KEY = "sampling_per_token_logps"
OLD_KEY = "old_per_token_logps"
# Keys of TRL's per-step logs that describe bookkeeping rather than training.
_IGNORED_LOG_KEYS = {
    "epoch",
    "step",
    "total_flos",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
}


def use_behaviour_logprobs(batch: dict[str, Any]) -> dict[str, Any]:
    """Make the rollouts' stored logprobs TRL's "old" logprobs in a batch from _generate_and_score_completions.

    Raises DataError when the batch has no rollout logprobs: training on without them would silently
    take the importance ratio against the trainer's own recomputed logprobs.
    """
    if batch.get(BEHAVIOUR_KEY) is None:
        raise DataError(
            f"TRL's GRPO batch has no {BEHAVIOUR_KEY!r}, so the stored behaviour logprobs cannot replace its "
            f"{OLD_KEY!r}. The update stage is tested with trl=={TESTED_TRL} only; install that version."
        )
    batch[OLD_KEY] = batch[BEHAVIOUR_KEY]
    return batch


@contextlib.contextmanager
def project_scored_positions_only() -> Iterator[None]:
    """Within the block, TRL's fused LM head projects only the positions it scores (label not -100), on every device.

    TRL 1.16 does so only where Triton runs (CUDA, XPU) and otherwise projects every position of the batch, prompt
    and padding included, because on Neuron a varying number of positions recompiles the graph; eager CPU has no
    graph to recompile. The scored positions get the same values either way (their rows of the same products).
    """
    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


class TrainedPositionsOnly:
    """A model call TRL makes with ``labels`` that scores only the positions ``trained`` marks (rows in call order).

    The loss multiplies every per-token term by the trained mask (completion_mask x env_mask), so a logprob at a
    tool result's token is computed and thrown away: about five of every six completion positions of an episode
    here. TRL scores micro-batch rows in consecutive chunks; each call takes the next rows of ``trained``.
    """

    def __init__(self, model: Any, trained: torch.Tensor) -> None:
        self.model, self.trained, self.row = model, trained, 0

    def __call__(self, *args: Any, labels: torch.Tensor, **kwargs: Any) -> Any:
        keep = self.trained[self.row : self.row + labels.size(0)].to(labels.device)
        self.row += labels.size(0)
        return self.model(*args, labels=labels.masked_fill(~keep, -100), **kwargs)


class SharedPrefix:
    """A model call TRL makes with ``labels``: the leading columns no row scores are run once per distinct prompt.

    Those columns are the batch's prompts, left-padded to one width, and a task's samples share their first prompt,
    so a micro-batch holds only a few distinct ones (a chunk of the reference pass, one). Each distinct prompt goes
    through the model once, and every row attends to its prompt's keys and values, so a prompt costs one row's
    forward and backward pass instead of one per sample. The scored positions get the values of the full pass up
    to float rounding (tests/tasks/test_update.py). Only in a single process (a DDP, FSDP or DeepSpeed wrapper
    expects one forward call per backward pass) and without gradient checkpointing (which drops the layers' keys
    and values).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        # Full attention only: a sliding-window or linear-attention layer keeps other state than all keys and values.
        self.applies = all(
            type(layer) is DynamicLayer for layer in transformers.DynamicCache(config=model.config).layers
        )

    def __call__(
        self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, **kwargs: Any
    ) -> Any:
        shared = unscored_prefix_length(labels)
        if not self.applies or shared < 1:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
        columns = torch.cat([input_ids[:, :shared], attention_mask[:, :shared]], dim=1)
        distinct, row_prefix = torch.unique(columns, dim=0, return_inverse=True)
        if len(distinct) == input_ids.size(0):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
        first_rows = [int((row_prefix == index).nonzero()[0]) for index in range(len(distinct))]
        # The prefix's keys and values land in the cache passed in, whatever the model's use_cache setting.
        prefix = transformers.DynamicCache(config=self.model.config)
        self.model(
            input_ids=input_ids[first_rows, :shared],
            attention_mask=attention_mask[first_rows, :shared],
            past_key_values=prefix,
            logits_to_keep=1,
        )
        cache = transformers.DynamicCache(config=self.model.config)
        for index, layer in enumerate(prefix.layers):
            keys, values = cast(DynamicLayer, layer).keys, cast(DynamicLayer, layer).values
            cache.update(cast(torch.Tensor, keys)[row_prefix], cast(torch.Tensor, values)[row_prefix], index)
        # Positions continue from the cache's length, as they would in the full pass; the output covers the columns
        # after the prefix, and TRL keeps only the last completion-length ones.
        return self.model(
            input_ids=input_ids[:, shared:],
            attention_mask=attention_mask,
            past_key_values=cache,
            labels=labels[:, shared:],
            **kwargs,
        )


def unscored_prefix_length(labels: torch.Tensor) -> int:
    """How many leading columns no row scores, less one: the label of the column after the prefix is predicted from
    the prefix's last position, so that column must be unscored too."""
    return max(0, int((labels == -100).all(0).long().cumprod(0).sum()) - 1)


class ReplayGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose "old" logprobs are the behaviour logprobs stored with the rollouts, and whose loss and KL
    reference score only the trained tokens' positions."""

    # The micro-batch's trained positions (prompt and completion), while _compute_loss runs.
    _trained: torch.Tensor | None = None

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return use_behaviour_logprobs(super()._generate_and_score_completions(inputs))

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        completion = inputs["completion_mask"]
        if "tool_mask" in inputs:
            completion = completion * inputs["tool_mask"]
        self._trained = torch.cat([torch.zeros_like(inputs["prompt_mask"]), completion], dim=1).bool()
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._trained = None

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *args: Any,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        if world_size() == 1 and not self.args.gradient_checkpointing:
            model = SharedPrefix(model)
        # In the loss, the micro-batch's trained positions; before it (the KL reference's pass over the generation
        # batch), those of the rows the rollout function just handed over: the loss and the logged KL mask the rest.
        trained = self._trained
        if trained is None and isinstance(self.rollout_func, StoredRollouts):
            trained = self.rollout_func.trained_positions(attention_mask, logits_to_keep)
        if trained is not None and trained.shape == input_ids.shape:
            model = TrainedPositionsOnly(model, trained)
        with project_scored_positions_only():
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Resuming takes the optimizer, scheduler, step and RNG from the state folder; the weights are the
        input checkpoint's (LoRA: checkpoint 0 and the previous adapter), already loaded, so nothing is read here."""

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        try:
            super()._load_optimizer_and_scheduler(checkpoint)
        except Exception as exc:  # whatever torch.load or load_state_dict raise, the state is unusable
            raise unusable_state(checkpoint, exc) from exc

    def _load_rng_state(self, checkpoint: str | None) -> None:
        try:
            super()._load_rng_state(checkpoint)
        except Exception as exc:  # as above
            raise unusable_state(checkpoint, exc) from exc


class StoredRollouts:
    """TRL's ``rollout_func``: hands back the stored rollouts of the groups TRL asks for, in sample order.

    Under several processes TRL calls it on every rank with that rank's share of the prompts;
    ``task_ids`` records, in order, the tasks this process trained.
    """

    def __init__(self, round_groups: RoundGroups, pad_token_id: int) -> None:
        self.round_groups = round_groups
        self.pad_token_id = pad_token_id
        self.task_ids: list[str] = []
        self.env_masks: list[list[int]] = []  # of the rows handed over last, in order

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        slots = self.round_groups.slots
        asked = dict.fromkeys(slots[key][0] for key in prompts)
        self.task_ids.extend(t for t in asked if t not in self.task_ids)
        rows = replay_rows(prompts, self.round_groups.groups, slots, self.pad_token_id)
        self.env_masks = rows["env_mask"]
        return rows

    def trained_positions(self, attention_mask: torch.Tensor, completion_width: int) -> torch.Tensor | None:
        """The positions of the rows handed over last that the loss trains, laid out as TRL lays out their batch
        (prompts left-padded, then completions right-padded to ``completion_width``; ``attention_mask`` covers both):
        a completion token the model produced (its ``env_mask`` is 1). None for a batch of other rows."""
        if len(self.env_masks) != attention_mask.size(0):
            return None
        produced = torch.zeros_like(attention_mask, dtype=torch.bool)
        start = attention_mask.size(1) - completion_width
        for row, mask in enumerate(self.env_masks):
            produced[row, start : start + len(mask)] = torch.tensor(mask, dtype=torch.bool)
        return produced & attention_mask.bool()


def stored_reward(
    prompts: list[str], completions: list[Any], stored_reward: list[float], **_: Any
) -> list[float | None]:
    """TRL's reward function: the reward stored with each row's episode."""
    return list(stored_reward)


def world_size() -> int:
    """Training processes of this process group: WORLD_SIZE, which torchrun and accelerate launch set; 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def lora_config(config: PipelineConfig) -> LoraConfig | None:
    """The LoRA adapter the update trains (alpha = 2 x rank on every linear layer), or None for full fine-tuning."""
    if not config.training.use_lora:
        return None
    rank = config.training.lora_rank
    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")


def grpo_arguments(
    config: PipelineConfig, round_groups: RoundGroups, world: int, output_dir: str, start_step: int = 0
) -> GRPOConfig:
    """TRL's settings for one training step: one generation batch of every group, reused for every update.

    ``start_step`` is the global step the resumed trainer state is at: the step's updates come after it.
    """
    per_rank = len(round_groups.slots) // world
    return GRPOConfig(
        output_dir=output_dir,
        # One generation batch holds every group once: each rank takes per_rank whole groups (TRL hands
        # each rank a consecutive block of the repeated prompts) in micro-batches of group_size rows, and
        # each optimizer step accumulates over all of them: every group enters every step on one rank.
        per_device_train_batch_size=config.rollout.group_size,
        gradient_accumulation_steps=per_rank,
        steps_per_generation=per_rank,
        num_generations=config.rollout.group_size,
        num_iterations=config.training.updates_per_batch,
        max_steps=start_step + config.training.updates_per_batch,
        # A resumed state's global step counts earlier batches: none of this batch is to be skipped.
        ignore_data_skip=True,
        learning_rate=config.training.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=config.training.beta,
        epsilon=config.training.epsilon_low,
        epsilon_high=config.training.epsilon_high,
        # TRL scales logits by this before taking logprobs: it must match the sampling temperature.
        temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0,
        max_completion_length=round_groups.longest_completion,
        mask_truncated_completions=False,
        shuffle_dataset=False,
        use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=config.training.gradient_checkpointing,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=config.seed,
        dataloader_num_workers=0,
    )


def use_reference(trainer: GRPOTrainer, reference_checkpoint: Path) -> None:
    """Make ``reference_checkpoint`` the model TRL's KL penalty is taken against,
    prepared the way TRL prepares its own."""
    reference, _ = load_policy(reference_checkpoint)
    if trainer.ref_model is not None:
        # Full weights: TRL built its reference from the input checkpoint and prepared it (dropout off,
        # fused log-prob head, accelerator placement); only the weights change.
        target = trainer.accelerator.unwrap_model(trainer.ref_model)
        try:
            target.load_state_dict(reference.state_dict())
        except RuntimeError as exc:
            raise DataError(
                f"The KL reference {reference_checkpoint} does not fit the policy's architecture: {exc}"
            ) from exc
        return
    # LoRA: TRL keeps no reference model and disables the adapter instead, which gives the input
    # checkpoint. A reference model, when present, takes precedence; prepare it as TRL does its own
    # (grpo_arguments leaves cast_lm_head_to_fp32 off, so the head stays as loaded).
    if isinstance(trainer.args, GRPOConfig) and trainer.args.disable_dropout:
        disable_dropout_in_model(reference)
    add_fused_lm_head(reference, temperature=trainer.temperature, cast_lm_head_to_fp32=False)
    trainer.ref_model = trainer.accelerator.prepare_model(reference, evaluation_mode=True)


def write_trained(model: Any, tokenizer: Any, lora: bool, state: Path | None, folder: Path) -> None:
    """A checkpoint folder of the trained policy: merged weights and tokenizer, with LoRA its adapter too,
    and the trainer state the next step resumes (moved in from ``state``) when the optimizer is carried."""
    if lora:
        model.save_pretrained(folder / ADAPTER_SUBDIR, safe_serialization=True)
        model = model.merge_and_unload()
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    if state is not None:
        shutil.move(state, folder / TRAINER_STATE_SUBDIR)


def save_from_ranks(
    trainer: GRPOTrainer, base: Path, out_dir: Path, tokenizer: Any, lora: LoraConfig | None, state: Path | None
) -> None:
    """Save a checkpoint trained by several ranks: every rank helps gather the weights, rank 0 alone writes them.

    Gathering is a collective (DeepSpeed ZeRO-3 and FSDP hold a shard per rank), so every rank calls it;
    rank 0 then loads the gathered weights into a fresh copy of the model it trained (``base``, with
    LoRA checkpoint 0) and writes the same files as a single-process update, atomically. The trainer
    state (``state``, which every rank wrote before) moves into the checkpoint.
    """
    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped)
    if accelerator.is_main_process:
        trained, _ = load_policy(base)
        if lora is not None:
            trained = get_peft_model(trained, lora)
        trained.load_state_dict({k: v.detach().cpu() for k, v in state_dict.items()})
        save_atomically(out_dir, functools.partial(write_trained, trained, tokenizer, lora is not None, state))
    accelerator.wait_for_everyone()


def summarize_logs(log_history: list[dict[str, Any]], after_step: int = 0) -> dict[str, float]:
    """Mean over this update's optimizer steps (those after ``after_step``) of every numeric value TRL logged."""
    sums: dict[str, list[float]] = defaultdict(list)
    for entry in log_history:
        if entry.get("step", after_step + 1) <= after_step:
            continue  # logged by an earlier step of the run, carried in the resumed state
        for key, value in entry.items():
            if key not in _IGNORED_LOG_KEYS and isinstance(value, (int, float)):
                sums[key].append(float(value))
    return {key: sum(values) / len(values) for key, values in sums.items()}


def train(
    checkpoint_in: Path,
    round_groups: RoundGroups,
    config: PipelineConfig,
    out_dir: Path,
    reference_checkpoint: Path,
    resume_from: Path | None = None,
) -> dict[str, Any]:
    """Train the policy at checkpoint_in on this process's groups of the step; the checkpoint goes to out_dir.

    ``resume_from`` is the trainer state to continue (`agent.checkpoints.trainer_state_to_resume`), None
    for a fresh optimizer. With ``training.carry_optimizer`` the step's own state is saved into out_dir.
    Returns the update's statistics: the per-step means of what TRL logged (kl, clip_ratio/*, reward,
    ...), the step's group counts, loss, steps, global_step, the state resumed, this process's rank
    and the task ids it trained.
    """
    started = time.perf_counter()
    world = world_size()
    slots = round_groups.slots
    if len(slots) % world:
        raise DataError(
            f"{len(slots)} groups (segment slots of {round_groups.task_groups} tasks) cannot be shared evenly by "
            f"{world} training processes: every rank trains on whole groups and the same number of them. Launch a "
            "process count that divides the groups (tasks/training/launch.py does)."
        )
    # Ranks launched beside each other share the cores: one policy.torch_threads each.
    torch.set_num_threads(config.training.torch_threads if world == 1 else config.policy.torch_threads)
    lora = lora_config(config)
    # With LoRA the model trained is checkpoint 0 with the run's one adapter; else the input checkpoint.
    base, adapter = lora_chain(checkpoint_in) if lora is not None else (checkpoint_in, None)
    model, tokenizer = load_policy(base)
    refuse_non_finite_input(model, checkpoint_in)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollouts = StoredRollouts(round_groups, pad_token_id)
    start_step = trainer_state_global_step(resume_from)
    with tempfile.TemporaryDirectory(prefix="grpo-") as scratch:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the rollout hook is flagged experimental on every construction
            trainer = ReplayGRPOTrainer(
                model=model,
                reward_funcs=[stored_reward],
                args=grpo_arguments(config, round_groups, world, scratch, start_step),
                train_dataset=Dataset.from_dict({"prompt": list(slots)}),
                processing_class=tokenizer,
                rollout_func=rollouts,
                peft_config=lora,
            )
        if adapter is not None:
            continue_adapter(trainer, adapter, config)
        # TRL's own reference is the model it was given: full weights, the input checkpoint; LoRA, the
        # adapter disabled, which is checkpoint 0. Another one is loaded only when the penalty is on.
        if config.training.beta > 0 and reference_checkpoint.resolve() != base.resolve():
            use_reference(trainer, reference_checkpoint)
        # The stage returns TRL's logs as statistics; printing every step would bury the round table.
        trainer.remove_callback(PrinterCallback)
        # Each optimizer step's loss, KL, clip ratio and reward at its global step, for MLflow's charts (version stage).
        step_log = OptimizerStepLog(informative_share(round_groups.task_groups, round_groups.dropped["flat"]))
        trainer.add_callback(step_log)
        result = trainer.train(resume_from_checkpoint=None if resume_from is None else str(resume_from))
        # Before the trainer state or the checkpoint is written: a diverged update stops the round here.
        refuse_non_finite(trainer.model, float(result.training_loss), config, trainer.accelerator)
        state = None
        if config.training.carry_optimizer:
            # Beside the checkpoint's staging folder, so that every rank can write its part before rank 0 publishes.
            state = out_dir.with_name(out_dir.name + ".trainer-state")
            if trainer.accelerator.is_main_process:
                shutil.rmtree(state, ignore_errors=True)
            trainer.accelerator.wait_for_everyone()
            save_trainer_state(trainer, state)
            trainer.accelerator.wait_for_everyone()
        if world == 1:
            write = functools.partial(write_trained, trainer.model, tokenizer, lora is not None, state)
            save_atomically(out_dir, write)
        else:
            save_from_ranks(trainer, base, out_dir, tokenizer, lora, state)
    return {
        **summarize_logs(trainer.state.log_history, start_step),
        **round_groups.statistics(),
        "skipped": False,
        "loss": float(result.training_loss),
        "steps": int(result.global_step) - start_step,
        "global_step": int(result.global_step),
        "optimizer_resumed_from": None if resume_from is None else str(resume_from),
        "groups": round_groups.task_groups,
        "segment_groups": len(slots),
        "processes": world,
        "rank": trainer.accelerator.process_index,
        "task_ids": rollouts.task_ids,
        "kl_reference_checkpoint": str(reference_checkpoint),
        "duration_s": round(time.perf_counter() - started, 3),
        "optimizer_steps_log": step_log.rows,
    }
