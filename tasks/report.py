"""Ablation report: mean +- sd per arm, paired tests between arms, learning curves, signal mix, pool growth.

Input is what the ablation flow collected: for every (arm, seed) run, its round summaries and the
official-category accuracy of its final checkpoint. Output is a Markdown file with PNG figures
beside it, also logged to MLflow as one run.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from coevolve.config import PipelineConfig

SIGNAL_KINDS = ("forgetting", "boundary", "rare")


def final_heldout(run: dict[str, Any]) -> float:
    return float(run["rounds"][-1]["heldout_success"])


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def paired_test(a: dict[int, float], b: dict[int, float]) -> dict[str, float]:
    """Paired t-test of arm a against arm b over the seeds both ran (scipy's ttest_rel).

    Identical scores on every seed give no evidence either way: p is reported as 1. The same
    nonzero gap on every seed has no variance to test against: t and p are undefined (nan).
    """
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    if len(seeds) < 2:
        return {"n": len(seeds), "mean_diff": diffs[0] if diffs else math.nan, "t": math.nan, "p": math.nan}
    # Scores are shares of a task count, so equal gaps can differ in the last bits (0.06 - 0.04 vs
    # 0.08 - 0.06); compared exactly, they would give a t of 1e16 and a p of 0.
    if all(math.isclose(d, diffs[0], abs_tol=1e-9) for d in diffs):
        return {"n": len(seeds), "mean_diff": diffs[0], "t": math.nan, "p": 1.0 if abs(diffs[0]) < 1e-9 else math.nan}
    result = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
    return {"n": len(seeds), "mean_diff": statistics.fmean(diffs), "t": float(result.statistic), "p": float(result.pvalue)}


def task_level_test(a: dict[int, dict[str, bool]], b: dict[int, dict[str, bool]]) -> dict[str, float]:
    """Exact McNemar test of arm a against arm b on the same held-out tasks, pooled over the seeds both ran.

    Pairs are (seed, task): ``a_only`` counts tasks that a's final checkpoint solved and b's did not,
    ``b_only`` the reverse; p is the two-sided binomial test of a_only among the discordant pairs.
    It asks whether these trained checkpoints differ, not whether a new seed would: the seed-level
    t-test answers that.
    """
    from scipy import stats

    pairs = [(a[s][t], b[s][t]) for s in sorted(set(a) & set(b)) for t in sorted(set(a[s]) & set(b[s]))]
    a_only = sum(1 for x, y in pairs if x and not y)
    b_only = sum(1 for x, y in pairs if y and not x)
    p = float(stats.binomtest(a_only, a_only + b_only, 0.5).pvalue) if a_only + b_only else 1.0
    return {"pairs": len(pairs), "a_only": a_only, "b_only": b_only, "p": p}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-arm figures and paired tests of 'full' against every other arm.

    Runs that carry ``heldout_outcomes`` (task_id -> success of the final checkpoint) also get the
    task-level test.
    """
    arms: dict[str, list[dict[str, Any]]] = {}
    for run in results:
        arms.setdefault(run["arm"], []).append(run)
    table = {}
    for arm, runs in arms.items():
        heldout = [final_heldout(r) for r in runs]
        official = [float(r["official"].get("multi_turn_base", math.nan)) for r in runs]
        accepted = sum(s["accepted"] for r in runs for s in r["rounds"])
        judged = accepted + sum(s["rejected"] for r in runs for s in r["rounds"])
        signals = {k: sum(s["signals"].get(k, 0) for r in runs for s in r["rounds"]) for k in SIGNAL_KINDS}
        table[arm] = {
            "seeds": [r["seed"] for r in runs],
            "heldout": _mean_sd(heldout),
            "official": _mean_sd(official),
            "final_pool": _mean_sd([float(r["rounds"][-1]["pool_size"]) for r in runs]),
            "acceptance": accepted / judged if judged else math.nan,
            "signals": signals,
        }
    by_seed = {arm: {r["seed"]: final_heldout(r) for r in runs} for arm, runs in arms.items()}
    tests = {other: paired_test(by_seed["full"], by_seed[other]) for other in by_seed if other != "full" and "full" in by_seed}
    outcomes = {arm: {r["seed"]: r["heldout_outcomes"] for r in runs if r.get("heldout_outcomes")} for arm, runs in arms.items()}
    task_tests = {
        other: task_level_test(outcomes["full"], outcomes[other])
        for other in outcomes
        if other != "full" and outcomes.get("full") and outcomes[other]
    }
    return {"arms": table, "tests": tests, "task_tests": task_tests}


def heldout_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Mean held-out success over ``runs`` by round: x = 0 is checkpoint 0 (when recorded), x = r + 1 follows round r."""
    rounds = len(runs[0]["rounds"])
    x = list(range(1, rounds + 1))
    y = [statistics.fmean(r["rounds"][i]["heldout_success"] for r in runs) for i in range(rounds)]
    baseline = [r["rounds"][0].get("baseline_heldout_success") for r in runs]
    if all(b is not None for b in baseline):
        x, y = [0, *x], [statistics.fmean(baseline), *y]
    return x, y


def _curves(results: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

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
        for axis in (heldout, pool):
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        paths.append(out_dir / "learning_curves.png")
        fig.savefig(paths[-1], dpi=110)
    finally:
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    try:
        bottom = [0.0] * len(arms)
        totals = {arm: {k: 0 for k in SIGNAL_KINDS} for arm in arms}
        for r in results:
            for s in r["rounds"]:
                for k in SIGNAL_KINDS:
                    totals[r["arm"]][k] += s["signals"].get(k, 0)
        for kind in SIGNAL_KINDS:
            values = [totals[a][kind] for a in arms]
            ax.bar(arms, values, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set(title="signals mined (all seeds and rounds)", ylabel="signals")
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelrotation=20)
        fig.tight_layout()
        paths.append(out_dir / "signal_mix.png")
        fig.savefig(paths[-1], dpi=110)
    finally:
        plt.close(fig)
    return paths


def _fmt(pair: tuple[float, float]) -> str:
    mean, sd = pair
    return "n/a" if math.isnan(mean) else f"{mean:.3f} +- {sd:.3f}"


def write_report(results: list[dict[str, Any]], out_dir: Path, title: str) -> dict[str, Any]:
    """Write report.md and its figures into ``out_dir``; return the summary with the file paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    figures = _curves(results, out_dir)
    lines = [
        f"# {title}",
        "",
        f"{len(results)} runs: arms {', '.join(summary['arms'])}; seeds "
        f"{', '.join(str(s) for s in sorted({r['seed'] for r in results}))}; {len(results[0]['rounds'])} rounds each.",
        "",
        "| arm | held-out success (final) | BFCL multi_turn_base | final pool | acceptance | signals f/b/r |",
        "|---|---|---|---|---|---|",
    ]
    for arm, row in summary["arms"].items():
        s = row["signals"]
        lines.append(
            f"| {arm} | {_fmt(row['heldout'])} | {_fmt(row['official'])} | {row['final_pool'][0]:.0f} | "
            f"{'n/a' if math.isnan(row['acceptance']) else format(row['acceptance'], '.2f')} | {s['forgetting']}/{s['boundary']}/{s['rare']} |"
        )
    lines += ["", "Paired t-tests of `full` against each arm, final held-out success, paired by seed:", ""]
    lines += ["| full vs | seeds | mean difference | t | p |", "|---|---|---|---|---|"]
    for other, t in summary["tests"].items():
        t_text = "n/a" if math.isnan(t["t"]) else f"{t['t']:.2f}"
        p_text = "n/a (same gap on every seed)" if math.isnan(t["p"]) and t["n"] >= 2 else ("n/a" if math.isnan(t["p"]) else f"{t['p']:.3f}")
        lines.append(f"| {other} | {t['n']} | {t['mean_diff']:+.3f} | {t_text} | {p_text} |")
    if summary["task_tests"]:
        lines += [
            "",
            "Task-level paired comparison of the final checkpoints (exact McNemar test over (seed, held-out task) pairs; "
            "it asks whether these checkpoints differ, not whether another seed would):",
            "",
            "| full vs | pairs | solved by full only | solved by the other only | p |",
            "|---|---|---|---|---|",
        ]
        for other, t in summary["task_tests"].items():
            lines.append(f"| {other} | {t['pairs']} | {t['a_only']} | {t['b_only']} | {t['p']:.3f} |")
    rounds = len(results[0]["rounds"])
    lines += ["", "Per run (held-out success of checkpoint 0, then after each round):", ""]
    lines += ["| run | ckpt 0 | " + " | ".join(f"r{i}" for i in range(rounds)) + " |", "|---|---|" + "---|" * rounds]
    for r in results:
        baseline = r["rounds"][0].get("baseline_heldout_success")
        cells = ["n/a" if baseline is None else f"{baseline:.3f}", *(f"{s['heldout_success']:.3f}" for s in r["rounds"])]
        lines.append(f"| {r['run_id']} | " + " | ".join(cells) + " |")
    lines += ["", *[f"![{p.stem}]({p.name})" for p in figures], ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return {**summary, "report": str(report), "figures": [str(p) for p in figures]}


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402


@task(name="report", cache_policy=NO_CACHE)
def report_task(config: PipelineConfig, name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the ablation report under the state folder and log it to MLflow as one run."""
    from storage.tracking import Tracker

    from tasks.common import open_warehouse
    from tasks.evaluate import HELDOUT_SPLIT

    with open_warehouse(config) as wh:
        results = [
            {**run, "heldout_outcomes": wh.evaluation_outcomes(run["run_id"], run["rounds"][-1]["round"], HELDOUT_SPLIT)}
            for run in results
        ]
    out = write_report(results, config.state_dir / "reports" / name, f"Ablation `{name}`")
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    metrics = {}
    for arm, row in out["arms"].items():
        if not math.isnan(row["heldout"][0]):
            metrics[f"heldout.{arm}.mean"] = row["heldout"][0]
            metrics[f"heldout.{arm}.sd"] = row["heldout"][1]
    for other, t in out["tests"].items():
        if not math.isnan(t["p"]):
            metrics[f"p.full_vs_{other}"] = t["p"]
    for other, t in out["task_tests"].items():
        metrics[f"p_tasks.full_vs_{other}"] = t["p"]
    run_id = tracker.log_evaluation(f"{name}-report", metrics, {"runs": len(results)}, {"coevolve.kind": "ablation"})
    for path in [Path(out["report"]), *map(Path, out["figures"])]:
        tracker.attach_artifact(run_id, path, "report")
    get_run_logger().info("ablation report at %s", out["report"])
    return {**out, "mlflow_run_id": run_id}
