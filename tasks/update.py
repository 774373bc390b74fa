"""The update stage: one training step's GRPO update of the policy on the step's trajectory groups, through TRL.

Read top to bottom, the stage (`update_stage`) for step k of round r is:

1. read round r's trajectories of step k (samples k*group_size ..) and group them, once
   (tasks/training/grpo_groups.py): a task's group_size episodes are one group; groups whose rewards are all
   equal have zero advantage and are dropped;
2. pick the checkpoint the KL penalty is taken against (`kl_reference_checkpoint`):
   checkpoint 0 of the run ('initial') or the round's input checkpoint ('round');
3. find the trainer state the previous step saved beside the input checkpoint (with
   ``training.carry_optimizer``), so optimizer, scheduler and global step continue across steps and rounds;
4. train, or skip: with no group left the input checkpoint is copied, its trainer state too, and the
   stage reports itself skipped (`skip_update`); otherwise TRL's GRPOTrainer trains on the stored
   rollouts, in this process (tasks/training/grpo_trainer.py) or on several ranks (tasks/training/launch.py) when
   ``training.num_processes > 1`` or a launcher is configured;
5. record the step's checkpoint (`PipelineConfig.checkpoint_after`: checkpoint r+1 at the last step),
   the statistics and the lineage (which stored trajectories it trained on).

How the round maps onto TRL's groups, losses and ranks is told in tasks/training/grpo_trainer.py, which
imports torch and trl; it is named here with `optional_module` so that importing the flows stays cheap.
"""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from agent.checkpoints import (
    ADAPTER_SUBDIR,
    TRAINER_STATE_SUBDIR,
    save_atomically,
    trainer_state_global_step,
    trainer_state_to_resume,
)
from agent.transformers_engine import load_policy
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.optional import optional_module
from coevolve.records import Trajectory
from coevolve.stages import UpdateInput, UpdateOutput, step_samples
from tasks.registry import stage
from tasks.training.grpo_groups import RoundGroups, check_segments, group_round
from tasks.training.launch import launch_update

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

# Torch, trl and peft are imported on first use, only where the stage trains.
if TYPE_CHECKING:
    import tasks.training.grpo_resume as grpo_resume
    import tasks.training.grpo_trainer as grpo_trainer
else:
    grpo_trainer = optional_module("tasks.training.grpo_trainer")
    grpo_resume = optional_module("tasks.training.grpo_resume")
peft = optional_module("peft")


def kl_reference_checkpoint(
    config: PipelineConfig, wh: Warehouse, checkpoint: str | Path, round_: int = 0, step: int = 0
) -> Path:
    """The checkpoint step ``step`` of round ``round_``'s KL penalty is taken against.

    'initial': checkpoint 0 of the run. 'round': the round's input checkpoint, which is ``checkpoint``
    (the step's input) at step 0 and checkpoint ``round_`` after (checkpoint 0 in round 0).
    """
    if config.training.beta == 0 or (config.training.kl_reference == "round" and step == 0):
        return Path(checkpoint)
    if config.training.kl_reference == "round" and round_ > 0:
        return config.checkpoint_dir(round_)
    prepared = wh.stage_output(config.run_id, 0, "prepare") or {}
    if not prepared.get("checkpoint"):
        raise DataError(
            f"training.kl_reference is 'initial' but run {config.run_id!r} has no checkpoint 0 recorded by round 0's "
            "prepare stage; run round 0 first or set training.kl_reference=round."
        )
    return Path(prepared["checkpoint"])


def uses_launcher(config: PipelineConfig) -> bool:
    """Whether the update trains in a launched process group (tasks/training/launch.py) rather than in the stage's
    process."""
    return config.training.launcher != "none" or config.training.num_processes > 1


def copy_checkpoint(checkpoint_in: Path, config: PipelineConfig, staging: Path) -> None:
    """A skipped update's checkpoint: the input's files and trainer state, with LoRA an adapter on checkpoint 0.

    An input with an ``adapter/`` folder carries its chain in the copy. An input without one (the
    served base itself) gets a LoRA adapter on it whose B matrices are zero (peft's initialisation),
    so the copy loads as the same weights and LoRA weight sync (agent/weights.py) finds its chain.
    """
    shutil.copytree(checkpoint_in, staging)
    if config.training.carry_optimizer:
        grpo_resume.carry_state(checkpoint_in, staging)
    else:
        shutil.rmtree(staging / TRAINER_STATE_SUBDIR, ignore_errors=True)
    if config.training.use_lora and not (staging / ADAPTER_SUBDIR).is_dir():
        model, _ = load_policy(checkpoint_in)
        rank = config.training.lora_rank
        lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
        peft.get_peft_model(model, lora).save_pretrained(staging / ADAPTER_SUBDIR, safe_serialization=True)


def skip_update(
    checkpoint_in: Path, round_groups: RoundGroups, config: PipelineConfig, out_dir: Path, resume_from: Path | None
) -> dict[str, Any]:
    """No group can teach anything: the step's checkpoint is a copy of the input (trainer state included, so the
    next step resumes it), and the statistics say why."""
    started = time.perf_counter()
    save_atomically(out_dir, functools.partial(copy_checkpoint, checkpoint_in, config))
    return {
        **round_groups.statistics(),
        "skipped": True,
        "reason": "no group with reward variance",
        "loss": 0.0,
        "steps": 0,
        "global_step": trainer_state_global_step(resume_from),  # 0 when no state is resumed (or carried)
        "optimizer_resumed_from": None if resume_from is None else str(resume_from),
        "groups": 0,
        "duration_s": round(time.perf_counter() - started, 3),
    }


def update_policy(
    checkpoint_in: Path,
    round_groups: RoundGroups,
    config: PipelineConfig,
    out_dir: Path,
    reference: Path,
    launched: tuple[int, int] | None = None,
    state_expected: bool = False,
) -> dict[str, Any]:
    """The step's checkpoint from its grouped batch: a copy when nothing can be learned, else trained.

    Training runs in this process, or on ranks launched for (round, step) ``launched`` when one is given.
    With ``training.carry_optimizer`` it resumes the trainer state saved beside ``checkpoint_in``; one
    that is ``state_expected`` (every input but checkpoint 0) and missing, or damaged, is a DataError.
    """
    resume_from = None
    if config.training.carry_optimizer:
        resume_from = trainer_state_to_resume(checkpoint_in, state_expected)
    if not round_groups.groups:
        return skip_update(checkpoint_in, round_groups, config, out_dir, resume_from)
    for group in round_groups.groups.values():
        for trajectory in group:
            check_segments(trajectory)
    if launched is not None:
        round_, step = launched
        return launch_update(
            checkpoint_in, round_groups, config, round_, out_dir, reference, step=step, resume_from=resume_from
        )
    return grpo_trainer.train(checkpoint_in, round_groups, config, out_dir, reference, resume_from)


def grpo_update(
    checkpoint_in: Path,
    trajectories: list[Trajectory],
    config: PipelineConfig,
    out_dir: Path,
    reference_checkpoint: Path | None = None,
    state_expected: bool = False,
) -> dict:
    """Train the policy at checkpoint_in on one batch's groups with TRL's GRPOTrainer, in this process; save to out_dir.

    ``reference_checkpoint`` holds the weights the KL penalty (beta > 0) is taken against, e.g.
    checkpoint 0 of the run (`kl_reference_checkpoint`); None takes checkpoint_in.
    Returns statistics: loss, steps, groups, duration_s, skipped, dropped group counts, and the
    per-step means of what TRL logs (kl, clip_ratio/*, reward, reward_std, ...). With
    ``training.carry_optimizer`` the trainer state saved beside checkpoint_in is resumed (DataError when
    ``state_expected`` and it is missing) and out_dir gets its own.
    """
    checkpoint_in, out_dir = Path(checkpoint_in), Path(out_dir)
    reference = checkpoint_in if reference_checkpoint is None else Path(reference_checkpoint)
    round_groups = group_round(trajectories, config.rollout.group_size)
    return update_policy(checkpoint_in, round_groups, config, out_dir, reference, state_expected=state_expected)


def release_step_checkpoint(config: PipelineConfig, round_: int, step: int) -> None:
    """Delete the folder training step ``step`` of round ``round_`` wrote, once the next step's update is recorded.

    Nothing reads it after that (the next step trained from it and saved its own optimizer state), so
    unless ``training.keep_step_checkpoints`` only round checkpoints stay: at 4B parameters a full
    fine-tune's step folder holds about 40 GB. Its record keeps the path for the lineage. Safe to call
    again after a crash: a folder already gone is left alone.
    """
    if config.training.keep_step_checkpoints or step >= config.training.batches_per_round - 1:
        return
    shutil.rmtree(config.checkpoint_after(round_, step), ignore_errors=True)


@stage("update", retries=1)
def update_stage(config: PipelineConfig, wh: Warehouse, inputs: UpdateInput) -> UpdateOutput:
    """Train ``inputs.checkpoint`` on the groups of batch ``inputs.step`` of the round; the step's checkpoint
    (`PipelineConfig.checkpoint_after`) goes to the run folder."""
    round_, step, checkpoint = inputs.round_, inputs.step, inputs.checkpoint
    group_size = config.rollout.group_size
    # The step's only grouping, of its own episodes only (read as such from the warehouse).
    # With dynamic sampling, only the groups the rollout counted (inputs.tasks): the first tasks_per_batch with reward
    # variance, so every step trains on a batch of the same size.
    round_groups = group_round(
        wh.trajectories(config.run_id, round_, task_ids=inputs.tasks, samples=step_samples(step, group_size)),
        group_size,
    )
    out_dir = config.checkpoint_after(round_, step)
    reference = kl_reference_checkpoint(config, wh, checkpoint, round_, step)
    # The line that decides where training runs: ranks launched for this step, or this process.
    launched = (round_, step) if uses_launcher(config) else None
    # Every update after the run's first resumes the state the previous one saved.
    state_expected = (round_, step) != (0, 0)
    stats = update_policy(Path(checkpoint), round_groups, config, out_dir, reference, launched, state_expected)
    stats["step"] = step
    get_run_logger().info(
        "round %d step %d: GRPO %s",
        round_,
        step,
        {k: stats[k] for k in ("groups", "steps", "global_step", "loss", "skipped") if k in stats},
    )
    return UpdateOutput(
        checkpoint=str(out_dir), stats=stats, trained_on=round_groups.trained_on, step=step, trained_from=checkpoint
    )
