"""The per-round curves the ablation report tabulates and draws: held-out and dev success by round, mean over seeds.

tasks/report.py writes the tables and tasks/plots.py draws the figures from these same numbers.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from coevolve.records import SIGNAL_KINDS

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


def heldout_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Mean held-out success over ``runs`` by round:
    x = 0 is checkpoint 0 (when recorded), x = r + 1 follows round r."""
    rounds = len(runs[0]["rounds"])
    x = list(range(1, rounds + 1))
    y = [statistics.fmean(r["rounds"][i]["heldout_success"] for r in runs) for i in range(rounds)]
    baseline = [r["rounds"][0].get("baseline_heldout_success") for r in runs]
    if all(b is not None for b in baseline):
        x, y = [0, *x], [statistics.fmean(baseline), *y]
    return x, y


def dev_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Mean dev success by round like ``heldout_curve`` (x = 0 when checkpoint 0 was scored);
    nan where no seed was scored."""
    rounds = min(len(r["rounds"]) for r in runs)
    x = list(range(1, rounds + 1))
    y = [mean_present([number(r["rounds"][i].get("dev_success")) for r in runs]) for i in range(rounds)]
    baseline = mean_present([number(baseline_of(r, "baseline_dev_success")) for r in runs])
    if not math.isnan(baseline):
        x, y = [0, *x], [baseline, *y]
    return x, y
