"""The per-round numbers the ablation report tabulates and draws: held-out and dev success by optimizer step with
its spread over seeds (`success_band`), and the helpers for summaries that lack a field.

tasks/ablation/report_summary.py computes the tables and tasks/ablation/plots.py draws the figures from these
same numbers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from coevolve.signals import SIGNAL_KINDS

# The kinds an accepted task is counted under: one per signal, and the random arm's.
ACCEPTED_KINDS = (*SIGNAL_KINDS, "random")


def number(value: Any) -> float:
    """A summary value as a float; nan when missing (summaries written before the field existed) or None."""
    return math.nan if value is None else float(value)


def mean_present(values: list[float]) -> float:
    """Mean of the values that exist; nan when none does."""
    present = [v for v in values if not math.isnan(v)]
    return statistics.fmean(present) if present else math.nan


def baseline_of(run: dict[str, Any], key: str = "baseline_heldout_success") -> float | None:
    """Checkpoint 0's score of a run: on the run itself or on its round 0 summary (as coevolve_round returns it)."""
    value = run.get(key)
    if value is None:
        value = run["rounds"][0].get(key)
    return None if value is None else float(value)


@dataclass(frozen=True)
class Band:
    """One arm's success after each round, by optimizer steps trained: the mean over its seeds and the sample sd
    over them (0 with one seed). ``x_unit`` is "optimizer steps", or "rounds" for runs whose round summaries
    predate the recorded step counts. The first point is checkpoint 0 (x = 0) when every seed scored it."""

    x: list[float]
    mean: list[float]
    sd: list[float]
    seeds: int
    x_unit: Literal["optimizer steps", "rounds"]


def _steps_after_each_round(runs: list[dict[str, Any]], rounds: int) -> list[float] | None:
    """Optimizer steps trained after rounds 0..rounds-1, mean over ``runs`` (arms train equal steps per seed);
    None when some round did not record its steps."""
    per_run = []
    for r in runs:
        counts = [r["rounds"][i].get("optimizer_steps") for i in range(rounds)]
        if any(c is None for c in counts):
            return None
        total, cumulative = 0, []
        for c in counts:
            total += int(c)
            cumulative.append(total)
        per_run.append(cumulative)
    return [statistics.fmean(column) for column in zip(*per_run, strict=True)]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd of ``values`` (sd 0 for one value); nan for both when there are none."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _present(values: list[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def success_band(runs: list[dict[str, Any]], split: Literal["heldout", "dev"]) -> Band:
    """``split`` success of ``runs`` (one arm's seeds) after each round, with checkpoint 0's first when every
    seed has its score; a seed without a score at a point is left out of that point (nan when none has one)."""
    key, baseline_key = f"{split}_success", f"baseline_{split}_success"
    rounds = min(len(r["rounds"]) for r in runs)
    steps = _steps_after_each_round(runs, rounds)
    x: list[float] = steps if steps is not None else [float(i + 1) for i in range(rounds)]
    points = [mean_sd(_present([number(r["rounds"][i].get(key)) for r in runs])) for i in range(rounds)]
    baselines = [number(baseline_of(r, baseline_key)) for r in runs]
    if not any(math.isnan(b) for b in baselines):
        x, points = [0.0, *x], [mean_sd(baselines), *points]
    return Band(
        x=x,
        mean=[m for m, _ in points],
        sd=[d for _, d in points],
        seeds=len(runs),
        x_unit="optimizer steps" if steps is not None else "rounds",
    )
