"""Figures: a run's learning curve, and the ablation report's curves, mechanism and curriculum panels.

The version stage draws ``learning_curve`` after every round and logs it to that round's MLflow run,
so the newest run always shows the whole curve so far; the ablation report (tasks/ablation/report.py) draws
the others. Uses matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Literal

from coevolve.optional import optional_module
from coevolve.records import RoundSummary
from coevolve.signals import SIGNAL_KINDS
from tasks.ablation.curves import ACCEPTED_KINDS, Band, success_band

# pyplot takes a while to import and picks a backend when it does: it is loaded on the first figure,
# after the file-only Agg backend is chosen (workers and servers have no display).
matplotlib = optional_module("matplotlib")
matplotlib_pyplot = optional_module("matplotlib.pyplot")
matplotlib_ticker = optional_module("matplotlib.ticker")


def _agg_pyplot():
    """pyplot, drawing to files only."""
    matplotlib.use("Agg")
    return matplotlib_pyplot


def learning_curve(summaries: list[RoundSummary], path: Path) -> Path:
    """Writes a PNG with three panels (success rates, pool size, signals per kind) by round; returns path."""
    plt = _agg_pyplot()

    ordered = sorted(summaries, key=lambda s: s.round)
    rounds = [s.round for s in ordered]
    fig, (rates, pool, signals) = plt.subplots(1, 3, figsize=(12, 3.5))
    try:
        rates.plot(rounds, [s.success_rate for s in ordered], marker="o", label="rollout success")
        rates.plot(rounds, [s.heldout_success for s in ordered], marker="s", label="held-out success")
        rates.set_ylim(-0.02, 1.02)
        rates.set_title("success rate")
        rates.legend(loc="best", fontsize=8)
        pool.plot(rounds, [s.pool_size for s in ordered], marker="o", color="tab:green")
        pool.set_title("pool size (after the round)")
        for kind in SIGNAL_KINDS:
            signals.plot(rounds, [s.signals.get(kind, 0) for s in ordered], marker="o", label=kind)
        signals.set_title("signals")
        signals.legend(loc="best", fontsize=8)
        for axis in (rates, pool, signals):
            axis.set_xlabel("round")
            axis.set_xticks(rounds)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=80)
    finally:
        plt.close(fig)
    return path


# Two arms whose mean lines differ by less than this at every point are drawn as one line that is marked.
SAME_LINE_TOLERANCE = 1e-9


def _same_line(x: list[float], y: list[float], other: tuple[list[float], list[float]]) -> bool:
    ox, oy = other
    return x == ox and all(
        (math.isnan(u) and math.isnan(v)) or abs(u - v) <= SAME_LINE_TOLERANCE for u, v in zip(y, oy, strict=True)
    )


def _arm_line(axis: Any, x: list[float], y: list[float], arm: str, colour: str, drawn: dict) -> None:
    """One arm's line in its colour; a line that lies on an arm's already in ``drawn`` is dashed and named as such
    in the legend, so both stay visible. Adds the line to ``drawn``."""
    same = next((other for other, line in drawn.items() if _same_line(x, y, line)), None)
    label = arm if same is None else f"{arm} (same line as {same})"
    axis.plot(x, y, label=label, color=colour, marker="o", markersize=3, linestyle="-" if same is None else "--")
    drawn[arm] = (x, y)


def band_panel(axis: Any, bands: dict[str, Band], split: str) -> None:
    """One arm per colour (``C0``, ``C1``, ... in ``bands``' order, as in every other panel): the mean over seeds as a
    line with its mean +- sd over seeds shaded, y from 0. An arm whose line lies on an earlier arm's is drawn
    dashed and says so in the legend; a split no arm was scored on says that instead."""
    drawn: dict[str, tuple[list[float], list[float]]] = {}
    for i, (arm, band) in enumerate(bands.items()):
        if all(math.isnan(v) for v in band.mean):
            continue
        _arm_line(axis, band.x, band.mean, arm, f"C{i % 10}", drawn)
        low = [m - d for m, d in zip(band.mean, band.sd, strict=True)]
        high = [m + d for m, d in zip(band.mean, band.sd, strict=True)]
        axis.fill_between(band.x, low, high, color=f"C{i % 10}", alpha=0.15, linewidth=0)
    seeds = sorted({b.seeds for b in bands.values()})
    unit = next(iter(bands.values())).x_unit if bands else "optimizer steps"
    axis.set(
        title=f"{split} success, mean +- sd over {'/'.join(map(str, seeds))} seeds",
        xlabel=f"{unit} trained (0: checkpoint 0)",
        ylabel="success (axis from 0)",
    )
    axis.set_ylim(bottom=0)
    if drawn:
        axis.legend(fontsize=7)
    else:
        hint = "\n(rollout.dev_eval_tasks = 0)" if split == "dev" else ""
        axis.text(0.5, 0.5, f"no {split} evaluation{hint}", ha="center", va="center", transform=axis.transAxes)


def _bands(results: list[dict[str, Any]], arms: list[str], split: Literal["heldout", "dev"]) -> dict[str, Band]:
    return {arm: success_band([r for r in results if r["arm"] == arm], split) for arm in arms}


def ablation_curves(results: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """learning_curves.png (held-out and dev success per arm by optimizer step with their spread over seeds, and
    pool size by round) and signal_mix.png (signals per arm)."""
    plt = _agg_pyplot()

    arms = sorted({r["arm"] for r in results})
    paths = []
    fig, (heldout, dev, pool) = plt.subplots(1, 3, figsize=(15, 4))
    try:
        band_panel(heldout, _bands(results, arms, "heldout"), "held-out")
        band_panel(dev, _bands(results, arms, "dev"), "dev")
        drawn: dict[str, tuple[list[float], list[float]]] = {}
        for k, arm in enumerate(arms):
            runs = [r for r in results if r["arm"] == arm]
            rounds = len(runs[0]["rounds"])
            mean_pool = [statistics.fmean(r["rounds"][i]["pool_size"] for r in runs) for i in range(rounds)]
            _arm_line(pool, [float(i + 1) for i in range(rounds)], mean_pool, arm, f"C{k % 10}", drawn)
        pool.set(title="pool size after each round (mean over seeds)", xlabel="round", ylabel="tasks")
        pool.legend(fontsize=7)
        paths.append(_save_by_round(fig, (pool,), out_dir / "learning_curves.png"))
    finally:
        plt.close(fig)
    totals = _totals_by_arm(results, "signals", SIGNAL_KINDS)
    paths.append(
        _stacked_bars(
            totals, list(SIGNAL_KINDS), "signals mined (all seeds and rounds)", "signals", out_dir / "signal_mix.png"
        )
    )
    return paths


def _save_by_round(fig: Any, axes: Any, path: Path) -> Path:
    """Whole-number round ticks on every axis in ``axes``, then the figure written to ``path``."""
    for axis in axes:
        axis.xaxis.set_major_locator(matplotlib_ticker.MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _totals_by_arm(results: list[dict[str, Any]], field: str, kinds: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per arm, each round summary's ``field`` (a count per kind) summed over seeds and rounds; ``kinds`` start at 0."""
    totals: dict[str, dict[str, float]] = {
        r["arm"]: dict.fromkeys(kinds, 0) for r in sorted(results, key=lambda r: r["arm"])
    }
    for r in results:
        for summary in r["rounds"]:
            for kind, n in (summary.get(field) or {}).items():
                totals[r["arm"]][kind] = totals[r["arm"]].get(kind, 0) + n
    return totals


def _stacked_bars(totals: dict[str, dict[str, float]], kinds: list[str], title: str, ylabel: str, path: Path) -> Path:
    """One bar per arm (``totals``' keys), stacked by ``kinds`` in that order; written to ``path``."""
    plt = _agg_pyplot()

    arms = list(totals)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    try:
        bottom = [0.0] * len(arms)
        for kind in kinds:
            values = [totals[a].get(kind, 0) for a in arms]
            ax.bar(arms, values, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set(title=title, ylabel=ylabel)
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelrotation=20)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def mechanism_figures(
    results: list[dict[str, Any]], mechanism: dict[str, list[dict[str, Any]]], out_dir: Path
) -> list[Path]:
    """mechanism.png (2x2 over rounds, one line per arm) and acceptance_by_kind.png (stacked bars per arm)."""
    plt = _agg_pyplot()

    arms = sorted(mechanism)
    paths = []
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (informative, coverage), (dev, heldout) = axes
    try:
        for i, arm in enumerate(arms):
            style = {"marker": "o", "label": arm, "color": f"C{i % 10}"}  # an arm keeps its colour in every panel
            rows = mechanism[arm]
            x = [row["round"] for row in rows]
            informative.plot(x, [row["informative"] for row in rows], **style)
            coverage.plot(x, [row["coverage"] for row in rows], **style)
        band_panel(dev, _bands(results, arms, "dev"), "dev")
        band_panel(heldout, _bands(results, arms, "heldout"), "held-out")
        informative.set(
            title="informative GRPO groups (rewards not all equal)", xlabel="round", ylabel="share of groups"
        )
        coverage.set(
            title="held-out tool-pattern coverage of pool r",
            xlabel="round (pool trained on)",
            ylabel="share of held-out bigrams",
        )
        informative.legend(fontsize=8)
        paths.append(_save_by_round(fig, (informative, coverage), out_dir / "mechanism.png"))
    finally:
        plt.close(fig)
    totals = _totals_by_arm(results, "accepted_by_kind", ACCEPTED_KINDS)
    kinds = [*ACCEPTED_KINDS, *sorted({k for t in totals.values() for k in t} - set(ACCEPTED_KINDS))]
    title = "accepted candidates by kind (all seeds and rounds)"
    paths.append(_stacked_bars(totals, kinds, title, "candidates", out_dir / "acceptance_by_kind.png"))
    return paths


def curriculum_figure(mechanism: dict[str, list[dict[str, Any]]], out_dir: Path) -> Path:
    """curriculum.png, 2x2, one colour per arm (means over seeds, tasks/ablation/report_summary.mechanism_rows):
    informative share of played groups and episodes per informative group by round, the curriculum's calibration
    error by round, and the final round's pool by estimated success as grouped bars (arms with estimates only)."""
    plt = _agg_pyplot()

    arms = sorted(mechanism)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (informative, cost), (calibration, difficulty) = axes
    try:
        final = {}
        for i, arm in enumerate(arms):
            style = {"marker": "o", "label": arm, "color": f"C{i % 10}"}  # an arm keeps its colour in every panel
            rows = mechanism[arm]
            x = [row["round"] for row in rows]
            informative.plot(x, [row["informative"] for row in rows], **style)
            cost.plot(x, [row["per_informative"] for row in rows], **style)
            calibration.plot(x, [row["calibration"] for row in rows], **style)
            if rows and rows[-1]["difficulty"]:
                final[arm] = (rows[-1]["difficulty"], style["color"])
        informative.set(title="informative share of played groups", xlabel="round", ylabel="share of groups")
        cost.set(title="episodes played per informative group", xlabel="round", ylabel="episodes")
        calibration.set(
            title="calibration: |estimate - observed success|", xlabel="round", ylabel="episode-weighted mean"
        )
        informative.legend(fontsize=8)
        bins = list(dict.fromkeys(b for histogram, _ in final.values() for b in histogram))
        width = 0.8 / max(1, len(final))
        for j, (arm, (histogram, color)) in enumerate(final.items()):
            positions = [k + (j - (len(final) - 1) / 2) * width for k in range(len(bins))]
            difficulty.bar(positions, [histogram.get(b, 0.0) for b in bins], width=width, color=color, label=arm)
        difficulty.set(title="pool of the final round by estimated success", xlabel="estimate", ylabel="tasks")
        difficulty.set_xticks(range(len(bins)), bins)
        if final:
            difficulty.legend(fontsize=8)
        else:
            difficulty.text(0.5, 0.5, "no task estimates recorded", ha="center", va="center",
                            transform=difficulty.transAxes)  # fmt: skip
        return _save_by_round(fig, (informative, cost, calibration), out_dir / "curriculum.png")
    finally:
        plt.close(fig)
