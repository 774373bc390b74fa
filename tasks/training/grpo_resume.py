"""How a training step continues the run: the trainer state the previous step saved, and the run's one LoRA adapter.

A step's update (tasks/training/grpo_trainer.py) builds a new TRL trainer; what makes its steps one run is
kept beside each checkpoint it writes, in transformers' own checkpoint format and written and read
with the Trainer's own methods (``<checkpoint>/trainer_state``: optimizer.pt, scheduler.pt,
trainer_state.json, rng_state files; `save_trainer_state`, resumed by
``trainer.train(resume_from_checkpoint=...)``), and, with LoRA, the adapter trained on checkpoint 0
across the run (`lora_chain`, `continue_adapter`). A skipped update carries the state forward
(`carry_state`); a state that cannot be resumed is a DataError naming the fix (`unusable_state`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from peft import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers.trainer_callback import TrainerState
from trl import GRPOTrainer

from agent.checkpoints import ADAPTER_SUBDIR, OPTIMIZER_STATE_FIX, TRAINER_STATE_FILE, TRAINER_STATE_SUBDIR
from coevolve.config import PipelineConfig
from coevolve.errors import DataError, disk_full_as_error

# Keys of transformers' logs that measure wall-clock time.
_WALL_CLOCK_LOG_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def unusable_state(folder: str | None, exc: Exception) -> DataError:
    """The error of a trainer state that exists but cannot be resumed, naming the fix."""
    return DataError(
        f"The optimizer state {folder} could not be resumed ({type(exc).__name__}: {str(exc)[:300]}): it is damaged "
        f"or was written for another model or optimizer. To continue, {OPTIMIZER_STATE_FIX}."
    )


def lora_chain(checkpoint_in: Path) -> tuple[Path, Path | None]:
    """The base a LoRA update trains on (checkpoint 0) and the adapter it continues (None at the first update).

    An input with ``adapter/`` is checkpoint 0 plus that adapter; one without is checkpoint 0 itself.
    An adapter whose base holds an adapter of its own comes from a run trained before one adapter was
    carried across the run, which cannot be continued as one adapter: DataError.
    """
    adapter = checkpoint_in / ADAPTER_SUBDIR
    if not (adapter / "adapter_config.json").is_file():
        return checkpoint_in, None
    base = Path(json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"])
    if (base / ADAPTER_SUBDIR).is_dir():
        raise DataError(
            f"The adapter of {checkpoint_in} was trained on {base}, which holds an adapter itself: a chain of "
            "adapters written by an older version, which trained a new adapter every round. The update now trains "
            "one adapter on checkpoint 0 for the whole run; start a new run_id to train this run's way."
        )
    return base, adapter


def continue_adapter(trainer: GRPOTrainer, adapter: Path, config: PipelineConfig) -> None:
    """Put the previous step's adapter weights into the adapter TRL wrapped the base with (peft's own loader)."""
    saved = json.loads((adapter / "adapter_config.json").read_text())
    if int(saved["r"]) != config.training.lora_rank:
        raise DataError(
            f"The adapter {adapter} has rank {saved['r']} but training.lora_rank is {config.training.lora_rank}; one "
            "adapter is trained across the run, so set lora_rank back to its rank or start a new run_id."
        )
    result: Any = set_peft_model_state_dict(trainer.model, load_file(str(adapter / "adapter_model.safetensors")))
    if result.unexpected_keys or any("lora_" in key for key in result.missing_keys):
        raise DataError(f"The adapter {adapter} does not fit the policy: {result}.")


def save_trainer_state(trainer: GRPOTrainer, folder: Path) -> None:
    """Write the trainer state the next step resumes, with transformers' own checkpoint files and methods.

    Every rank calls it (DeepSpeed and FSDP write a shard each, every rank its RNG state); under DDP the
    main process alone writes the optimizer, scheduler and trainer_state.json. A disk that fills up meanwhile
    is a `DiskFullError` naming the checkpoints' folder (torch reports it as a failed zip write); a single
    process then deletes what it wrote, ranks leave their shared folder to the next attempt, which starts
    by deleting it.
    """
    single = trainer.args.world_size == 1
    with disk_full_as_error(folder.parent, remove=folder if single else None):
        folder.mkdir(parents=True, exist_ok=True)
        trainer._save_optimizer_and_scheduler(str(folder))
        trainer._save_scaler(str(folder))
        trainer._save_rng_state(str(folder))
        if trainer.args.should_save:
            # Wall-clock figures would make two identical updates write different checkpoints, whose digests
            # the version stage records; the stage's statistics keep them.
            history = [{k: v for k, v in e.items() if k not in _WALL_CLOCK_LOG_KEYS} for e in trainer.state.log_history]
            dataclasses.replace(trainer.state, log_history=history).save_to_json(str(folder / TRAINER_STATE_FILE))


def carry_state(checkpoint_in: Path, staging: Path) -> None:
    """A skipped update's trainer state: the input's, or one of no step yet (transformers' format) where it has none."""
    if (staging / TRAINER_STATE_SUBDIR).is_dir():
        return  # copied with the input's files
    (staging / TRAINER_STATE_SUBDIR).mkdir()
    TrainerState().save_to_json(str(staging / TRAINER_STATE_SUBDIR / TRAINER_STATE_FILE))
