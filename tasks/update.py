"""The update stage: one GRPO update of the policy on a round's trajectory groups, through TRL.

The round's rollouts already exist (the rollout stage wrote them, with behaviour logprobs), so
nothing is generated here: TRL's GRPOTrainer receives them through its ``rollout_func`` hook and does
everything else itself: group-normalized advantages, the clipped objective (epsilon_low/high), the
KL penalty (beta), the optimizer, LoRA through peft.

How a round maps onto TRL:
- an episode is one or more token segments (tasks/rollout.py; the compact prompt style always has
  one). Segment slot j of a task's group_size episodes is one TRL group: one dataset row per slot
  (its "prompt" is the task id for slot 0 and ``<task_id>#<j>`` after, `segment_groups`), which TRL
  repeats group_size times; the rollout hook hands back row i as episode i's segment j, or, where
  episode i has fewer segments, a filler row (a one-token prompt and one padding token with env_mask 0,
  so it holds no trained token). Every row carries its episode's stored reward, so the rewards of
  every slot of a task are the same list and TRL's own group advantage of each slot equals the
  episode-level advantage of that task's group;
- the fillers change no loss: TRL's default loss_type 'dapo' (left as it is) sums the loss over the
  trained tokens (completion mask x env_mask) of a micro-batch and divides by the trained tokens of
  the whole generation batch, so a row without trained tokens adds nothing to either, and the loss
  is the token mean over every produced token of every step. (Under 'grpo', 'bnpo' or 'dr_grpo' the
  per-row or per-micro-batch means would count fillers.) TRL pads each micro-batch's completions to
  its longest; every slot group holds at least one real segment of one token or more, so a filler
  never lengthens a batch (and mask_truncated_completions is off, so its token need not be an EOS);
- one generation batch holds every group; each optimizer step accumulates over all groups, and
  the batch is reused for ``steps_per_round`` steps (TRL's ``num_iterations``);
- under several processes (tasks/launch.py starts them) the generation batch is shared: each rank
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
- the KL penalty is taken against ``training.kl_reference``: checkpoint 0 of the run ("initial",
  loaded into TRL's reference model) or the round's input checkpoint ("round", TRL's default);
- the reward function returns the stored reward.

Task groups whose rewards are all equal have zero advantage, so they are dropped with all their
slots; when none is left the stage copies the input checkpoint and reports itself skipped.

torch, transformers and trl are imported inside the functions so that light workers can import the
flows that reference this module cheaply.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from agent.engine import load_policy
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.records import Segment, Trajectory, digest
from coevolve.stages import UpdateInput, UpdateOutput
from tasks.registry import stage

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

# Keys of TRL's per-step logs that describe bookkeeping rather than training.
_IGNORED_LOG_KEYS = {"epoch", "step", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second"}
# The TRL version whose GRPOTrainer internals (the batch keys below, the reference model) this stage is tested against.
TESTED_TRL = "1.16.0"
# Where TRL 1.16 puts the rollout function's logprobs, and the "old" logprobs its importance ratio divides by.
BEHAVIOUR_KEY = "sampling_per_token_logps"
OLD_KEY = "old_per_token_logps"


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


def kl_reference_checkpoint(config: PipelineConfig, checkpoint: str | Path) -> Path:
    """The checkpoint the round's KL penalty is taken against: checkpoint 0 ('initial') or ``checkpoint`` ('round')."""
    from tasks.common import open_warehouse

    if config.training.kl_reference == "round" or config.training.beta == 0:
        return Path(checkpoint)
    with open_warehouse(config) as wh:
        prepared = wh.stage_output(config.run_id, 0, "prepare") or {}
    if not prepared.get("checkpoint"):
        raise DataError(
            f"training.kl_reference is 'initial' but run {config.run_id!r} has no checkpoint 0 recorded by round 0's "
            "prepare stage; run round 0 first or set training.kl_reference=round."
        )
    return Path(prepared["checkpoint"])


def _use_reference(trainer: Any, reference_checkpoint: Path) -> None:
    """Make ``reference_checkpoint`` the model TRL's KL penalty is taken against, prepared the way TRL prepares its own."""
    from agent.engine import load_policy

    reference, _ = load_policy(reference_checkpoint)
    if trainer.ref_model is not None:
        # Full weights: TRL built its reference from the input checkpoint and prepared it (dropout off,
        # fused log-prob head, accelerator placement); only the weights change.
        target = trainer.accelerator.unwrap_model(trainer.ref_model)
        try:
            target.load_state_dict(reference.state_dict())
        except RuntimeError as exc:
            raise DataError(f"The KL reference {reference_checkpoint} does not fit the policy's architecture: {exc}") from exc
        return
    # LoRA: TRL keeps no reference model and disables the adapter instead, which gives the input
    # checkpoint. A reference model, when present, takes precedence; prepare it as TRL does its own
    # (grpo_update leaves cast_lm_head_to_fp32 off, so the head stays as loaded).
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    if trainer.args.disable_dropout:
        disable_dropout_in_model(reference)
    add_fused_lm_head(reference, temperature=trainer.temperature, cast_lm_head_to_fp32=False)
    trainer.ref_model = trainer.accelerator.prepare_model(reference, evaluation_mode=True)


def group_trajectories(trajectories: list[Trajectory], group_size: int) -> tuple[dict[str, list[Trajectory]], dict[str, int]]:
    """Split a round's trajectories into GRPO groups that can teach something.

    Returns the kept groups (task id -> trajectories ordered by sample) and counts of dropped ones:
    ``malformed`` (not exactly group_size samples) and ``flat`` (every reward equal).
    """
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.task_id].append(trajectory)
    kept: dict[str, list[Trajectory]] = {}
    dropped = {"malformed": 0, "flat": 0}
    for task_id, group in by_task.items():
        group.sort(key=lambda t: t.sample)
        if len(group) != group_size:
            dropped["malformed"] += 1
        elif len({t.reward for t in group}) < 2:
            dropped["flat"] += 1
        else:
            kept[task_id] = group
    return kept, dropped


def trained_on(trajectories: list[Trajectory], group_size: int) -> dict[str, Any]:
    """The lineage record of an update: which stored trajectories its groups hold (run, round, count, id digest)."""
    groups, _ = group_trajectories(trajectories, group_size)
    ids = sorted(t.trajectory_id for group in groups.values() for t in group)
    first = trajectories[0] if trajectories else None
    return {
        "run_id": first.run_id if first else None,
        "round": first.round if first else None,
        "count": len(ids),
        "ids_digest": digest(ids),
    }


def segment_groups(groups: dict[str, list[Trajectory]]) -> dict[str, tuple[str, int]]:
    """TRL's groups for the kept task groups: "prompt" -> (task id, segment slot), task by task.

    Slot 0 of a task is its id; slot j > 0 is ``<task_id>#<j>``. A task has as many slots as its
    episode with the most segments.
    """
    slots: dict[str, tuple[str, int]] = {}
    for task_id, group in groups.items():
        for slot in range(max(len(t.segments) for t in group)):
            key = task_id if slot == 0 else f"{task_id}#{slot}"
            if key in slots:
                raise DataError(f"Task ids {task_id!r} and {slots[key][0]!r} both name the GRPO group {key!r}; task ids must not end in '#<number>'.")
            slots[key] = (task_id, slot)
    return slots


def _check(trajectory: Trajectory) -> None:
    for index, segment in enumerate(trajectory.segments):
        n = len(segment.completion_ids)
        if not segment.prompt_ids or n == 0:
            raise DataError(f"Trajectory {trajectory.trajectory_id} has no prompt or no completion tokens in segment {index}.")
        if len(segment.completion_mask) != n or len(segment.logprobs) != n:
            raise DataError(
                f"Trajectory {trajectory.trajectory_id}, segment {index}: completion_ids ({n}), completion_mask "
                f"({len(segment.completion_mask)}) and logprobs ({len(segment.logprobs)}) must have equal lengths."
            )


def _filler(trajectory: Trajectory, pad_token_id: int) -> Segment:
    """A row for a segment slot the episode does not reach: no trained token (env_mask 0), one token long."""
    return Segment(trajectory.prompt_ids[:1], [pad_token_id], [0], [0.0])


def replay_rows(prompts: list[str], groups: dict[str, list[Trajectory]], slots: dict[str, tuple[str, int]], pad_token_id: int) -> dict[str, list]:
    """The rollout rows TRL asks for: the i-th request of a group's "prompt" is episode i's segment of that slot."""
    handed: dict[str, int] = defaultdict(int)
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "stored_reward")}
    for key in prompts:
        task_id, slot = slots[key]
        group = groups[task_id]
        trajectory = group[handed[key] % len(group)]
        handed[key] += 1
        segments = trajectory.segments
        segment = segments[slot] if slot < len(segments) else _filler(trajectory, pad_token_id)
        out["prompt_ids"].append(list(segment.prompt_ids))
        out["completion_ids"].append(list(segment.completion_ids))
        out["logprobs"].append([float(x) for x in segment.logprobs])
        out["env_mask"].append([int(m) for m in segment.completion_mask])
        out["stored_reward"].append(float(trajectory.reward))
    return out


def save_atomically(out_dir: Path, write: Any) -> None:
    """Publish a checkpoint folder whole: ``write(staging)`` fills a folder beside ``out_dir``, which then replaces it."""
    # Write beside the target and swap it in, so a retried or interrupted update never leaves half a checkpoint.
    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    write(staging)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)


def uses_launcher(config: PipelineConfig) -> bool:
    """Whether the update trains in a launched process group (tasks/launch.py) rather than in the stage's process."""
    return config.training.launcher != "none" or config.training.num_processes > 1


def world_size() -> int:
    """Training processes of this process group: WORLD_SIZE, which torchrun and accelerate launch set; 1 otherwise."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def _save_from_ranks(trainer: Any, checkpoint_in: Path, out_dir: Path, tokenizer: Any, peft_config: Any) -> None:
    """Save a checkpoint trained by several ranks: every rank helps gather the weights, rank 0 alone writes them.

    Gathering is a collective (DeepSpeed ZeRO-3 and FSDP hold a shard per rank), so every rank calls it;
    rank 0 then loads the gathered weights into a fresh copy of the input checkpoint and writes the
    same files as a single-process update, atomically.
    """
    from agent.engine import load_policy

    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped)
    if accelerator.is_main_process:

        def write(staging: Path) -> None:
            trained, _ = load_policy(checkpoint_in)
            if peft_config is not None:
                from peft import get_peft_model

                trained = get_peft_model(trained, peft_config)
            trained.load_state_dict({k: v.detach().cpu() for k, v in state_dict.items()})
            if peft_config is not None:
                trained.save_pretrained(staging / "adapter", safe_serialization=True)
                trained = trained.merge_and_unload()
            trained.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)

        save_atomically(out_dir, write)
    accelerator.wait_for_everyone()


def _summarize_logs(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over optimizer steps of every numeric value TRL logged (loss, kl, clip ratios, rewards...)."""
    sums: dict[str, list[float]] = defaultdict(list)
    for entry in log_history:
        for key, value in entry.items():
            if key not in _IGNORED_LOG_KEYS and isinstance(value, (int, float)):
                sums[key].append(float(value))
    return {key: sum(values) / len(values) for key, values in sums.items()}


def _copy_checkpoint(checkpoint_in: Path, staging: Path, config: PipelineConfig) -> None:
    """A skipped update's checkpoint: the input's files, and with LoRA an adapter chain that reaches its base.

    An input with an ``adapter/`` folder carries its chain in the copy. An input without one (the
    served base itself) gets a LoRA adapter on it whose B matrices are zero (peft's initialisation),
    so the copy loads as the same weights and LoRA weight sync (agent/weights.py) finds its chain.
    """
    shutil.copytree(checkpoint_in, staging)
    if config.training.use_lora and not (staging / "adapter").is_dir():
        from peft import LoraConfig, get_peft_model

        model, _ = load_policy(checkpoint_in)
        lora = LoraConfig(r=config.training.lora_rank, lora_alpha=2 * config.training.lora_rank, target_modules="all-linear", task_type="CAUSAL_LM")
        get_peft_model(model, lora).save_pretrained(staging / "adapter", safe_serialization=True)


def grpo_update(
    checkpoint_in: Path,
    trajectories: list[Trajectory],
    config: PipelineConfig,
    out_dir: Path,
    reference_checkpoint: Path | None = None,
) -> dict:
    """Train the policy at checkpoint_in on the round's groups with TRL's GRPOTrainer; save to out_dir.

    ``reference_checkpoint`` holds the weights the KL penalty (beta > 0) is taken against, e.g.
    checkpoint 0 of the run (`kl_reference_checkpoint`); None takes checkpoint_in.
    Returns statistics: loss, steps, groups, duration_s, skipped, dropped group counts, and the
    per-step means of what TRL logs (kl, clip_ratio/*, reward, reward_std, ...).
    """
    started = time.perf_counter()
    checkpoint_in, out_dir = Path(checkpoint_in), Path(out_dir)
    reference_checkpoint = checkpoint_in if reference_checkpoint is None else Path(reference_checkpoint)
    group_size = config.rollout.group_size
    groups, dropped = group_trajectories(trajectories, group_size)
    base_stats = {"groups_flat": dropped["flat"], "groups_malformed": dropped["malformed"], "trajectories": len(trajectories)}
    if not groups:
        save_atomically(out_dir, lambda staging: _copy_checkpoint(checkpoint_in, staging, config))
        return {
            **base_stats,
            "skipped": True,
            "reason": "no group with reward variance",
            "loss": 0.0,
            "steps": 0,
            "groups": 0,
            "duration_s": round(time.perf_counter() - started, 3),
        }
    for group in groups.values():
        for trajectory in group:
            _check(trajectory)

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from agent.engine import load_policy

    torch.set_num_threads(config.policy.torch_threads)
    model, tokenizer = load_policy(checkpoint_in)
    cuda = torch.cuda.is_available()
    slots = segment_groups(groups)
    world = world_size()
    if len(slots) % world:
        raise DataError(
            f"{len(slots)} groups (segment slots of {len(groups)} tasks) cannot be shared evenly by {world} training "
            "processes: every rank trains on whole groups and the same number of them. Launch a process count that "
            "divides the groups (tasks/launch.py does)."
        )
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    trained_here: list[str] = []

    def replay_rollouts(prompts: list[str], trainer: Any) -> dict[str, list]:
        # TRL asks for group_size completions of each group; hand back the stored ones in sample order.
        # Under several processes TRL calls this on every rank with that rank's share of the prompts.
        trained_here.extend(t for t in dict.fromkeys(slots[key][0] for key in prompts) if t not in trained_here)
        return replay_rows(prompts, groups, slots, pad_token_id)

    def stored_reward(prompts: list[str], completions: list[Any], stored_reward: list[float], **_: Any) -> list[float]:
        return list(stored_reward)

    class ReplayGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose "old" logprobs are the behaviour logprobs stored with the rollouts."""

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            return use_behaviour_logprobs(super()._generate_and_score_completions(inputs))

    peft_config = None
    if config.training.use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=config.training.lora_rank, lora_alpha=2 * config.training.lora_rank, target_modules="all-linear", task_type="CAUSAL_LM"
        )

    with tempfile.TemporaryDirectory(prefix="grpo-") as scratch:
        # One generation batch holds every group once: each rank takes len(slots) / world whole groups
        # (TRL hands each rank a consecutive block of the repeated prompts) in micro-batches of group_size
        # rows, and each optimizer step accumulates over all of them: every group enters every step on one rank.
        args = GRPOConfig(
            output_dir=scratch,
            per_device_train_batch_size=group_size,
            gradient_accumulation_steps=len(slots) // world,
            steps_per_generation=len(slots) // world,
            num_generations=group_size,
            num_iterations=config.training.steps_per_round,
            max_steps=config.training.steps_per_round,
            learning_rate=config.training.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            beta=config.training.beta,
            epsilon=config.training.epsilon_low,
            epsilon_high=config.training.epsilon_high,
            # TRL scales logits by this before taking logprobs: it must match the sampling temperature.
            temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0,
            max_completion_length=max(len(s.completion_ids) for g in groups.values() for t in g for s in t.segments),
            mask_truncated_completions=False,
            shuffle_dataset=False,
            use_cpu=not cuda,
            bf16=cuda and torch.cuda.is_bf16_supported(),
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=config.seed,
            dataloader_num_workers=0,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the rollout hook is flagged experimental on every construction
            trainer = ReplayGRPOTrainer(
                model=model,
                reward_funcs=[stored_reward],
                args=args,
                train_dataset=Dataset.from_dict({"prompt": list(slots)}),
                processing_class=tokenizer,
                rollout_func=replay_rollouts,
                peft_config=peft_config,
            )
        if config.training.beta > 0 and reference_checkpoint.resolve() != checkpoint_in.resolve():
            _use_reference(trainer, reference_checkpoint)
        from transformers.trainer_callback import PrinterCallback

        # The stage returns TRL's logs as statistics; printing every step would bury the round table.
        trainer.remove_callback(PrinterCallback)
        result = trainer.train()
        logged = _summarize_logs(trainer.state.log_history)

        def write(staging: Path) -> None:
            trained = trainer.model
            if peft_config is not None:
                trained.save_pretrained(staging / "adapter", safe_serialization=True)
                trained = trained.merge_and_unload()
            trained.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)

        if world == 1:
            save_atomically(out_dir, write)
        else:
            _save_from_ranks(trainer, checkpoint_in, out_dir, tokenizer, peft_config)

    return {
        **logged,
        **base_stats,
        "skipped": False,
        "loss": float(result.training_loss),
        "steps": int(result.global_step),
        "groups": len(groups),
        "segment_groups": len(slots),
        "processes": world,
        "rank": trainer.accelerator.process_index,
        "task_ids": trained_here,
        "kl_reference_checkpoint": str(reference_checkpoint),
        "duration_s": round(time.perf_counter() - started, 3),
    }


@stage("update", retries=1)
def update_stage(config: PipelineConfig, wh: Warehouse, inputs: UpdateInput) -> UpdateOutput:
    """Train checkpoint ``round_`` on the round's stored groups; checkpoint ``round_ + 1`` goes to the run folder."""
    from tasks.launch import launch_update  # tasks/launch.py imports this module

    round_, checkpoint = inputs.round_, inputs.checkpoint
    trajectories = wh.trajectories(config.run_id, round_)
    out_dir = config.checkpoint_dir(round_ + 1)
    reference = kl_reference_checkpoint(config, checkpoint)
    if uses_launcher(config):
        stats = launch_update(Path(checkpoint), trajectories, config, round_, out_dir, reference_checkpoint=reference)
    else:
        stats = grpo_update(Path(checkpoint), trajectories, config, out_dir, reference_checkpoint=reference)
    get_run_logger().info("round %d: GRPO %s", round_, {k: stats[k] for k in ("groups", "steps", "loss", "skipped") if k in stats})
    return UpdateOutput(checkpoint=str(out_dir), stats=stats, trained_on=trained_on(trajectories, config.rollout.group_size))
