"""The GRPO update of each round: optimizer, clipping, KL, LoRA and how the trainer is launched."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from coevolve.config.base import Section


class TrainingConfig(Section):
    RENAMED: ClassVar[dict[str, str]] = {
        "steps_per_round": (
            "it was split into training.batches_per_round (F: fresh batches a round draws, plays and trains on, one "
            "after another) and training.updates_per_batch (optimizer steps on each batch). steps_per_round: N meant "
            "batches_per_round: 1 and updates_per_batch: N; the paper's schedule is batches_per_round: 10 and "
            "updates_per_batch: 1."
        )
    }

    # At most 0.1: AdamW moves every weight by about the rate each step, and a trained model's weights are mostly
    # smaller than 0.1, so a larger rate rewrites the model in one step (2e-3 already collapsed the builtin policy).
    learning_rate: float = Field(
        5e-4,
        gt=0,
        le=0.1,
        description=(
            "AdamW rate (paper: 1e-6 for 4B-30B models; tiny models need more). With 4 steps a round, 1e-3 made the "
            "builtin policy collapse within 5 rounds and 2e-3 within 1; 5e-4 stayed stable."
        ),
    )
    # At most 1000, a hundred times the paper's 10: every batch is a training step that plays, trains and writes
    # a checkpoint, so a round of more would run for days before it records anything.
    batches_per_round: int = Field(
        3,
        ge=1,
        le=1000,
        description=(
            "Chosen on dev (docs/experiments.md, 'The training schedule'): 3 x 8 tasks x 1 update scored within "
            "noise of the best of four schedules at 144 episodes a round and is the closest to the paper's. "
            "F, the training steps of a round: each step draws a fresh batch of rollout.tasks_per_batch tasks from "
            "the round's pool, plays it with the policy the previous step produced and trains on it; signals are "
            "mined from all of the round's steps before the pool is re-synthesized (paper: F = 10)."
        ),
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description=(
            "Optimizer steps taken on each batch (TRL's num_iterations). 1 is on-policy, as the paper trains; more "
            "re-use a batch for clipped, off-policy steps."
        ),
    )
    carry_optimizer: bool = Field(
        True,
        description=(
            "Resume the optimizer and scheduler state (transformers' trainer state, saved beside each checkpoint) "
            "at every step, across rounds too, as one continuous run does. false starts a fresh AdamW every step, "
            "for comparison: its first update moves every weight by about the learning rate."
        ),
    )
    keep_step_checkpoints: bool = Field(
        False,
        description=(
            "Keep the checkpoint (and optimizer state) of every training step inside a round. Off, a step's folder "
            "is deleted once the next step's update is recorded, since nothing reads it after that; round "
            "checkpoints are always kept. At 4B parameters a full fine-tune's step folder holds about 40 GB."
        ),
    )
    epsilon_low: float = Field(0.20, ge=0, description="Lower clip range (paper: 0.20).")
    epsilon_high: float = Field(0.28, ge=0, description="Upper clip range (paper: 0.28).")
    beta: float = Field(1e-3, ge=0, description="KL coefficient (paper: 1e-3).")
    kl_reference: Literal["initial", "round"] = Field(
        "initial",
        description=(
            "Policy the KL penalty (beta) is taken against. 'initial' is checkpoint 0 for every step of every round: "
            "the paper penalizes KL (1e-3) to the initial policy over a whole run of 120 steps. 'round' is the round's "
            "input checkpoint for all of the round's steps, which makes beta a per-round trust region that no longer "
            "bounds the drift from checkpoint 0. With use_lora one adapter is trained on checkpoint 0 across the run, "
            "so 'initial' is the adapter-disabled model (no extra copy of the weights), while 'round' after round 0 "
            "keeps the round's input checkpoint as a separate reference model in memory (one more copy)."
        ),
    )
    # Off, unlike TRL's default: the gradients are the same either way up to float rounding (weights within 1e-6
    # after an update here: tests/tasks/test_update.py), a policy small enough to train on a CPU has memory to spare,
    # and recomputing every layer's forward in the backward pass cost about a tenth of an update here
    # (benchmarks/STEP.md); off also lets the update run each prompt once for its samples.
    gradient_checkpointing: bool = Field(
        False,
        description=(
            "Recompute each layer's forward pass during the backward pass to hold fewer activations (TRL's default): "
            "for models whose activations do not fit in memory, e.g. configs/paper.yaml's 4B model. Off, the update "
            "also runs each distinct prompt of a micro-batch once for all its samples."
        ),
    )
    # Two, unlike generation's one (policy.torch_threads): an update is arithmetic on the whole batch, its forward and
    # backward passes over every trained row, which two threads took in 0.8-0.9 of one's time here, while a decoding
    # step is per-call overhead that more threads only slow (benchmarks/STEP.md, "Two threads for the update").
    torch_threads: int = Field(
        2,
        ge=1,
        description=(
            "CPU threads for torch while an update trains in the round's own process (launched ranks share the "
            "cores and keep policy.torch_threads each). Like the device, the count changes the last bits of the "
            "update's sums, not the recipe. Configs that run several seeds at once on few cores set 1 "
            "(configs/ablation.yaml)."
        ),
    )
    use_lora: bool = Field(False, description="Train a LoRA adapter (large models) instead of full weights.")
    lora_rank: int = Field(16, ge=1, description="LoRA rank when use_lora is on.")
    num_processes: int = Field(
        1,
        ge=1,
        description=(
            "Training processes (ranks) of the update stage. Above 1 the stage launches its own process group "
            "(torchrun unless 'launcher' names another) and each rank trains on whole groups, never part of one; "
            "when the round's groups do not divide evenly, the largest process count that divides them is used."
        ),
    )
    launcher: Literal["none", "torchrun", "accelerate"] = Field(
        "none",
        description=(
            "How the update stage runs: 'none' trains inside the stage's process (num_processes 1) or under torchrun "
            "(more); 'torchrun' always launches 'torchrun --standalone' (gloo ranks on CPU, NCCL on GPUs); "
            "'accelerate' runs 'accelerate launch --config_file accelerate_config' for DDP, DeepSpeed or FSDP."
        ),
    )
    accelerate_config: Path | None = Field(
        None,
        description=(
            "Accelerate config file for launcher 'accelerate' (deployments/accelerate/ ships DDP, DeepSpeed ZeRO-3 "
            "and FSDP2 ones); num_processes overrides the file's process count so the groups divide evenly."
        ),
    )
