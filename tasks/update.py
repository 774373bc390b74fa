"""The update stage: one GRPO update of the policy on a round's trajectory groups, through TRL.

Read top to bottom, the stage (`update_stage`) is:

1. read round r's trajectories and group them, once (tasks/grpo_groups.py): a task's group_size
   episodes are one group; groups whose rewards are all equal have zero advantage and are dropped;
2. pick the checkpoint the KL penalty is taken against (`kl_reference_checkpoint`):
   checkpoint 0 of the run ('initial') or the round's input checkpoint ('round');
3. train, or skip: with no group left the input checkpoint is copied and the stage reports itself
   skipped (`skip_update`); otherwise TRL's GRPOTrainer trains on the stored rollouts, in this
   process (tasks/grpo_trainer.py) or on several ranks (tasks/launch.py) when
   ``training.num_processes > 1`` or a launcher is configured;
4. record checkpoint r+1, the statistics and the lineage (which stored trajectories it trained on).

How the round maps onto TRL's groups, losses and ranks is told in tasks/grpo_trainer.py, which
imports torch and trl; it is named here with `optional_module` so that importing the flows stays cheap.
"""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from agent.checkpoints import ADAPTER_SUBDIR, save_atomically
from agent.transformers_engine import load_policy
from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.optional import optional_module
from coevolve.records import Trajectory
from coevolve.stages import UpdateInput, UpdateOutput
from tasks.grpo_groups import RoundGroups, check_segments, group_round
from tasks.launch import launch_update
from tasks.registry import stage

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

# Torch, trl and peft are imported on first use, only where the stage trains.
grpo_trainer = optional_module("tasks.grpo_trainer")
peft = optional_module("peft")


def kl_reference_checkpoint(config: PipelineConfig, wh: Warehouse, checkpoint: str | Path) -> Path:
    """The checkpoint the round's KL penalty is taken against: checkpoint 0 ('initial') or ``checkpoint`` ('round')."""
    if config.training.kl_reference == "round" or config.training.beta == 0:
        return Path(checkpoint)
    prepared = wh.stage_output(config.run_id, 0, "prepare") or {}
    if not prepared.get("checkpoint"):
        raise DataError(
            f"training.kl_reference is 'initial' but run {config.run_id!r} has no checkpoint 0 recorded by round 0's "
            "prepare stage; run round 0 first or set training.kl_reference=round."
        )
    return Path(prepared["checkpoint"])


def uses_launcher(config: PipelineConfig) -> bool:
    """Whether the update trains in a launched process group (tasks/launch.py) rather than in the stage's process."""
    return config.training.launcher != "none" or config.training.num_processes > 1


def copy_checkpoint(checkpoint_in: Path, config: PipelineConfig, staging: Path) -> None:
    """A skipped update's checkpoint: the input's files, and with LoRA an adapter chain that reaches its base.

    An input with an ``adapter/`` folder carries its chain in the copy. An input without one (the
    served base itself) gets a LoRA adapter on it whose B matrices are zero (peft's initialisation),
    so the copy loads as the same weights and LoRA weight sync (agent/weights.py) finds its chain.
    """
    shutil.copytree(checkpoint_in, staging)
    if config.training.use_lora and not (staging / ADAPTER_SUBDIR).is_dir():
        model, _ = load_policy(checkpoint_in)
        rank = config.training.lora_rank
        lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
        peft.get_peft_model(model, lora).save_pretrained(staging / ADAPTER_SUBDIR, safe_serialization=True)


def skip_update(
    checkpoint_in: Path, round_groups: RoundGroups, config: PipelineConfig, out_dir: Path
) -> dict[str, Any]:
    """No group can teach anything: checkpoint r+1 is a copy of the input, and the statistics say why."""
    started = time.perf_counter()
    save_atomically(out_dir, functools.partial(copy_checkpoint, checkpoint_in, config))
    return {
        **round_groups.statistics(),
        "skipped": True,
        "reason": "no group with reward variance",
        "loss": 0.0,
        "steps": 0,
        "groups": 0,
        "duration_s": round(time.perf_counter() - started, 3),
    }


def update_policy(
    checkpoint_in: Path,
    round_groups: RoundGroups,
    config: PipelineConfig,
    out_dir: Path,
    reference: Path,
    launched_round: int | None = None,
) -> dict[str, Any]:
    """Checkpoint r+1 from the grouped round: a copy when nothing can be learned, else trained.

    Training runs in this process, or on ranks launched for round ``launched_round`` when one is given.
    """
    if not round_groups.groups:
        return skip_update(checkpoint_in, round_groups, config, out_dir)
    for group in round_groups.groups.values():
        for trajectory in group:
            check_segments(trajectory)
    if launched_round is not None:
        return launch_update(
            checkpoint_in, round_groups, config, launched_round, out_dir, reference_checkpoint=reference
        )
    return grpo_trainer.train(checkpoint_in, round_groups, config, out_dir, reference)


def grpo_update(
    checkpoint_in: Path,
    trajectories: list[Trajectory],
    config: PipelineConfig,
    out_dir: Path,
    reference_checkpoint: Path | None = None,
) -> dict:
    """Train the policy at checkpoint_in on the round's groups with TRL's GRPOTrainer, in this process; save to out_dir.

    ``reference_checkpoint`` holds the weights the KL penalty (beta > 0) is taken against, e.g.
    checkpoint 0 of the run (`kl_reference_checkpoint`); None takes checkpoint_in.
    Returns statistics: loss, steps, groups, duration_s, skipped, dropped group counts, and the
    per-step means of what TRL logs (kl, clip_ratio/*, reward, reward_std, ...).
    """
    checkpoint_in, out_dir = Path(checkpoint_in), Path(out_dir)
    reference = checkpoint_in if reference_checkpoint is None else Path(reference_checkpoint)
    round_groups = group_round(trajectories, config.rollout.group_size)
    return update_policy(checkpoint_in, round_groups, config, out_dir, reference)


@stage("update", retries=1)
def update_stage(config: PipelineConfig, wh: Warehouse, inputs: UpdateInput) -> UpdateOutput:
    """Train checkpoint ``round_`` on the round's stored groups; checkpoint ``round_ + 1`` goes to the run folder."""
    round_, checkpoint = inputs.round_, inputs.checkpoint
    round_groups = group_round(
        wh.trajectories(config.run_id, round_), config.rollout.group_size
    )  # the round's only grouping
    out_dir = config.checkpoint_dir(round_ + 1)
    reference = kl_reference_checkpoint(config, wh, checkpoint)
    # The line that decides where training runs: ranks launched for this round, or this process.
    launched_round = round_ if uses_launcher(config) else None
    stats = update_policy(Path(checkpoint), round_groups, config, out_dir, reference, launched_round)
    get_run_logger().info(
        "round %d: GRPO %s", round_, {k: stats[k] for k in ("groups", "steps", "loss", "skipped") if k in stats}
    )
    return UpdateOutput(checkpoint=str(out_dir), stats=stats, trained_on=round_groups.trained_on)
