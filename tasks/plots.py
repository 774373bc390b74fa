"""Figures: a run's learning curve, and the ablation report's curves, mechanism and curriculum panels.

The version stage draws ``learning_curve`` after every round and logs it to that round's MLflow run,
so the newest run always shows the whole curve so far; the ablation report (tasks/report.py) draws
the others. Uses matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from coevolve.optional import optional_module
from coevolve.records import SIGNAL_KINDS, RoundSummary
from tasks.curves import ACCEPTED_KINDS, dev_curve, heldout_curve

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


def ablation_curves(results: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """learning_curves.png (held-out success and pool size per arm by round) and signal_mix.png (signals per arm)."""
    plt = _agg_pyplot()

    arms = sorted({r["arm"] for r in results})
    paths = []
    fig, (heldout, pool) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        for arm in arms:
            runs = [r for r in results if r["arm"] == arm]
            rounds = len(runs[0]["rounds"])
            mean_pool = [statistics.fmean(r["rounds"][i]["pool_size"] for r in runs) for i in range(rounds)]
            heldout.plot(*heldout_curve(runs), marker="o", label=arm)
            pool.plot(list(range(1, rounds + 1)), mean_pool, marker="o", label=arm)
        heldout.set(
            title="held-out success (mean over seeds)", xlabel="rounds trained (0: checkpoint 0)", ylabel="success"
        )
        pool.set(title="pool size after each round", xlabel="round", ylabel="tasks")
        heldout.legend(fontsize=8)
        paths.append(_save_by_round(fig, (heldout, pool), out_dir / "learning_curves.png"))
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
        any_dev = False
        for i, arm in enumerate(arms):
            style = {"marker": "o", "label": arm, "color": f"C{i % 10}"}  # an arm keeps its colour in every panel
            rows = mechanism[arm]
            runs = [r for r in results if r["arm"] == arm]
            x = [row["round"] for row in rows]
            informative.plot(x, [row["informative"] for row in rows], **style)
            coverage.plot(x, [row["coverage"] for row in rows], **style)
            dev_x, dev_y = dev_curve(runs)
            if any(not math.isnan(v) for v in dev_y):
                any_dev = True
                dev.plot(dev_x, dev_y, **style)
            heldout.plot(*heldout_curve(runs), **style)
        informative.set(
            title="informative GRPO groups (rewards not all equal)", xlabel="round", ylabel="share of groups"
        )
        coverage.set(
            title="held-out tool-pattern coverage of pool r",
            xlabel="round (pool trained on)",
            ylabel="share of held-out bigrams",
        )
        dev.set(title="dev success (mean over seeds)", xlabel="rounds trained (0: checkpoint 0)", ylabel="success")
        heldout.set(
            title="held-out success (mean over seeds)", xlabel="rounds trained (0: checkpoint 0)", ylabel="success"
        )
        if not any_dev:
            dev.text(
                0.5,
                0.5,
                "no dev evaluation\n(rollout.dev_eval_tasks = 0)",
                ha="center",
                va="center",
                transform=dev.transAxes,
            )
        informative.legend(fontsize=8)
        paths.append(_save_by_round(fig, axes.flat, out_dir / "mechanism.png"))
    finally:
        plt.close(fig)
    totals = _totals_by_arm(results, "accepted_by_kind", ACCEPTED_KINDS)
    kinds = [*ACCEPTED_KINDS, *sorted({k for t in totals.values() for k in t} - set(ACCEPTED_KINDS))]
    title = "accepted candidates by kind (all seeds and rounds)"
    paths.append(_stacked_bars(totals, kinds, title, "candidates", out_dir / "acceptance_by_kind.png"))
    return paths


def curriculum_figure(mechanism: dict[str, list[dict[str, Any]]], out_dir: Path) -> Path:
    """curriculum.png, 2x2, one colour per arm (means over seeds, tasks/report_summary.mechanism_rows): informative
    share of played groups and episodes per informative group by round, the curriculum's calibration error by
    round, and the final round's pool by estimated success as grouped bars (arms with estimates only)."""
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
