"""An update whose loss or weights are not finite is never saved, registered or played.

An AdamW step moves every weight by about the learning rate whatever the gradient's size, so a rate too large for
the model (or an input checkpoint with outsized weights) can leave weights at inf or NaN while the logged loss is
still an ordinary number. Such a checkpoint scores 0 everywhere, and once registered the run's aliases could point at
it. `refuse_non_finite` runs after the optimizer steps and before anything is written: the round stops with one line
naming the setting to change.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from coevolve.config import PipelineConfig
from coevolve.errors import PipelineError


class DivergedUpdateError(PipelineError):
    """An update that made the loss or weights non-finite (or started from non-finite weights); nothing was saved."""


def non_finite_weights(model: Any) -> tuple[int, int, str | None]:
    """(non-finite values, all values, the first parameter holding one) of ``model``'s parameters."""
    bad = total = 0
    first = None
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            count = int((~torch.isfinite(parameter)).sum())
            if count and first is None:
                first = name
            bad += count
            total += parameter.numel()
    return bad, total, first


def _across_ranks(accelerator: Any, count: int) -> int:
    """``count`` summed over the training processes, so every rank stops together (a collective follows)."""
    if accelerator is None or accelerator.num_processes == 1:
        return count
    summed = accelerator.reduce(torch.tensor([count], device=accelerator.device), reduction="sum")
    return int(summed.item())


def refuse_non_finite_input(model: Any, checkpoint: Path, accelerator: Any = None) -> None:
    """DivergedUpdateError when the checkpoint an update starts from already holds non-finite weights."""
    bad, total, first = non_finite_weights(model)
    if _across_ranks(accelerator, bad):
        raise DivergedUpdateError(
            f"the update's input checkpoint {checkpoint} holds {bad} non-finite weights of {total} (first in "
            f"{first}); nothing was trained. Restore it (coevolve lineage shows MLflow's copy of each round's), or "
            "start a new run_id from a checkpoint with finite weights."
        )


def refuse_non_finite(model: Any, loss: float, config: PipelineConfig, accelerator: Any = None) -> None:
    """DivergedUpdateError, naming the setting, when the update made the loss or any weight non-finite."""
    bad, total, first = non_finite_weights(model)
    bad = _across_ranks(accelerator, bad)
    if not bad and math.isfinite(loss):
        return
    what = f"{bad} of {total} weights non-finite (first in {first})" if bad else f"the loss {loss}"
    training = config.training
    raise DivergedUpdateError(
        f"the update diverged: its optimizer steps left {what}, so nothing was saved or registered. Lower "
        f"training.learning_rate (now {training.learning_rate:g}; AdamW moves every weight by about that much each "
        f"step) or training.updates_per_batch (now {training.updates_per_batch}), and start again under a new "
        "run_id (--set run_id=NAME): a round keeps the settings it was started with."
    )
