"""What each optimizer step of an update measured, by its global step: a transformers callback that keeps TRL's logs.

The trainer runs with ``report_to="none"`` (nothing leaves the process while it trains); `OptimizerStepLog`
keeps, for every optimizer step, the loss, KL, clip ratios, reward and the rest of `CHARTED` that TRL logged,
with the global step of the run (which continues across training steps and rounds, tasks/training/grpo_resume.py)
and the step's informative share (the share of its groups with reward variance). The update records them in
its statistics (``optimizer_steps_log``); the version stage logs them (`tasks.version.optimizer_step_metrics`) to
the round's MLflow run at their global steps (storage/tracking.py), so MLflow's charts draw one line across the
run's rounds.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

# TRL 1.16's per-step log keys worth a chart: the objective and what moves it.
CHARTED: tuple[str, ...] = (
    "loss", "kl", "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean", "reward", "reward_std",
    "frac_reward_zero_std", "grad_norm", "entropy", "learning_rate",
)  # fmt: skip
# The name the informative share is logged under.
INFORMATIVE_SHARE = "informative_share"


class OptimizerStepLog(TrainerCallback):
    """A transformers callback: one row per optimizer step TRL logged, ``{"global_step": n, <CHARTED>...,
    "informative_share": s}``, in ``rows``. The end-of-training summary (runtime, mean loss) is not a step."""

    def __init__(self, informative_share: float | None = None) -> None:
        self.informative_share = informative_share
        self.rows: list[dict[str, float]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs:
            return
        row = {key: float(logs[key]) for key in CHARTED if isinstance(logs.get(key), (int, float))}
        if not row:
            return
        if self.informative_share is not None:
            row[INFORMATIVE_SHARE] = self.informative_share
        self.rows.append({"global_step": int(state.global_step), **row})


def informative_share(trained_groups: int, flat_groups: int) -> float | None:
    """The share of a step's groups that had reward variance (those it trains on); None when it played none."""
    played = trained_groups + flat_groups
    return trained_groups / played if played else None
