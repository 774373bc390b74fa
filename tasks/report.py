"""Ablation report: mean +- sd per arm, paired tests between arms, learning curves, signal mix, pool growth.

Also each arm against checkpoint 0 ("learning at all": t-test over seeds of the final held-out gain
and McNemar over (seed, task)), and the mechanism per arm and round, mean over seeds: informative
GRPO groups, held-out tool-pattern coverage of the training pool, signals and accepted candidates by
kind, dev and held-out success (table, mechanism.png, acceptance_by_kind.png).

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
from coevolve.records import SIGNAL_KINDS



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
    ckpt0_tests = {arm: checkpoint0_test(runs) for arm, runs in arms.items()}
    ckpt0_task_tests = {}
    for arm, runs in arms.items():
        final = {r["seed"]: r["heldout_outcomes"] for r in runs if r.get("heldout_outcomes") and r.get("baseline_outcomes")}
        if final:
            ckpt0_task_tests[arm] = task_level_test(final, {r["seed"]: r["baseline_outcomes"] for r in runs if r["seed"] in final})
    return {
        "arms": table,
        "tests": tests,
        "task_tests": task_tests,
        "mechanism": {arm: mechanism_rows(runs) for arm, runs in arms.items()},
        "ckpt0_tests": ckpt0_tests,
        "ckpt0_task_tests": ckpt0_task_tests,
    }


# --- mechanism: per arm and round, mean over seeds --------------------------------------------------

ACCEPTED_KINDS = (*SIGNAL_KINDS, "random")


def _number(value: Any) -> float:
    """A summary value as a float; nan when missing (summaries written before the field existed) or None."""
    return math.nan if value is None else float(value)


def _mean(values: list[float]) -> float:
    """Mean of the values that exist; nan when none does."""
    present = [v for v in values if not math.isnan(v)]
    return statistics.fmean(present) if present else math.nan


def baseline_of(run: dict[str, Any], key: str = "baseline_heldout_success") -> float | None:
    """Checkpoint 0's score of a run: on the run itself or on its round 0 summary (as coevolve_round returns it)."""
    value = run.get(key)
    if value is None:
        value = run["rounds"][0].get(key)
    return None if value is None else float(value)


def mechanism_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per round of the arm's runs, each value the mean over seeds (nan where no seed recorded it).

    informative: share of rollout groups with unequal rewards; coverage: held-out tool-pattern coverage
    of pool r; signals and accepted: counts by kind; dev and heldout: success of the checkpoint the round produced.
    """
    rows = []
    for i in range(min(len(r["rounds"]) for r in runs)):
        rounds = [r["rounds"][i] for r in runs]
        rows.append(
            {
                "round": int(rounds[0].get("round", i)),
                "informative": _mean([_number(s.get("informative_groups")) for s in rounds]),
                "coverage": _mean([_number(s.get("heldout_coverage")) for s in rounds]),
                "signals": {k: _mean([float(s["signals"].get(k, 0)) for s in rounds]) for k in SIGNAL_KINDS},
                # Summaries without the field have no per-kind counts: nan, not 0.
                "accepted": {
                    k: _mean([float((s.get("accepted_by_kind") or {}).get(k, 0)) if "accepted_by_kind" in s else math.nan for s in rounds])
                    for k in ACCEPTED_KINDS
                },
                "dev": _mean([_number(s.get("dev_success")) for s in rounds]),
                "heldout": _mean([_number(s.get("heldout_success")) for s in rounds]),
            }
        )
    return rows


def checkpoint0_test(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Final held-out success of one arm against checkpoint 0's, over the seeds that recorded both.

    Paired t-test of (final - ckpt0) by seed; when checkpoint 0 scored the same on every seed (the
    arms share it) that is the one-sample t-test of the gains against 0, and ``kind`` says which.
    """
    final = {r["seed"]: final_heldout(r) for r in runs if baseline_of(r) is not None}
    base = {r["seed"]: baseline_of(r) for r in runs if baseline_of(r) is not None}
    result: dict[str, Any] = dict(paired_test(final, base))
    same = all(math.isclose(b, next(iter(base.values())), abs_tol=1e-9) for b in base.values())
    result["kind"] = "one-sample" if same else "paired"
    result["ckpt0"] = statistics.fmean(base.values()) if base else math.nan
    result["final"] = statistics.fmean(final.values()) if final else math.nan
    return result


def heldout_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Mean held-out success over ``runs`` by round: x = 0 is checkpoint 0 (when recorded), x = r + 1 follows round r."""
    rounds = len(runs[0]["rounds"])
    x = list(range(1, rounds + 1))
    y = [statistics.fmean(r["rounds"][i]["heldout_success"] for r in runs) for i in range(rounds)]
    baseline = [r["rounds"][0].get("baseline_heldout_success") for r in runs]
    if all(b is not None for b in baseline):
        x, y = [0, *x], [statistics.fmean(baseline), *y]
    return x, y


def dev_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Mean dev success by round like ``heldout_curve`` (x = 0 when checkpoint 0 was scored); nan where no seed was scored."""
    rounds = min(len(r["rounds"]) for r in runs)
    x = list(range(1, rounds + 1))
    y = [_mean([_number(r["rounds"][i].get("dev_success")) for r in runs]) for i in range(rounds)]
    baseline = _mean([_number(baseline_of(r, "baseline_dev_success")) for r in runs])
    if not math.isnan(baseline):
        x, y = [0, *x], [baseline, *y]
    return x, y


def _cell(value: float, spec: str = ".3f") -> str:
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def _counts(values: dict[str, float], kinds: tuple[str, ...]) -> str:
    """Per-kind means as ``a/b/c`` (one decimal unless whole); n/a when no seed recorded them."""
    if all(math.isnan(values[k]) for k in kinds):
        return "n/a"
    return "/".join(_cell(values[k], ".0f" if float(values[k]).is_integer() else ".1f") for k in kinds)


def _fmt(pair: tuple[float, float]) -> str:
    mean, sd = pair
    return "n/a" if math.isnan(mean) else f"{mean:.3f} +- {sd:.3f}"


def _task_level_table(tests: dict[str, dict[str, Any]], intro: str, headers: tuple[str, str, str]) -> list[str]:
    """Markdown lines of one McNemar table (``task_level_test`` results by row name); none when there are no tests.

    ``headers``: the row-name column, then the two "solved by one side only" columns.
    """
    if not tests:
        return []
    name, a_only, b_only = headers
    lines = ["", intro, "", f"| {name} | pairs | {a_only} | {b_only} | p |", "|---|---|---|---|---|"]
    lines += [f"| {row} | {t['pairs']} | {t['a_only']} | {t['b_only']} | {t['p']:.3f} |" for row, t in tests.items()]
    return lines


def write_report(results: list[dict[str, Any]], out_dir: Path, title: str) -> dict[str, Any]:
    """Write report.md and its figures into ``out_dir``; return the summary with the file paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    from tasks.plots import ablation_curves, mechanism_figures

    figures = ablation_curves(results, out_dir) + mechanism_figures(results, summary["mechanism"], out_dir)
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
    if any(arm.startswith("no-") for arm in summary["arms"]):
        lines += [
            "Against a `no-<signal>` arm, the mean difference is what leaving that signal out costs "
            "(positive: `full` does better with it).",
            "",
        ]
    lines += ["| full vs | seeds | mean difference | t | p |", "|---|---|---|---|---|"]
    for other, t in summary["tests"].items():
        t_text = "n/a" if math.isnan(t["t"]) else f"{t['t']:.2f}"
        p_text = "n/a (same gap on every seed)" if math.isnan(t["p"]) and t["n"] >= 2 else ("n/a" if math.isnan(t["p"]) else f"{t['p']:.3f}")
        lines.append(f"| {other} | {t['n']} | {t['mean_diff']:+.3f} | {t_text} | {p_text} |")
    lines += _task_level_table(
        summary["task_tests"],
        "Task-level paired comparison of the final checkpoints (exact McNemar test over (seed, held-out task) pairs; "
        "it asks whether these checkpoints differ, not whether another seed would):",
        ("full vs", "solved by full only", "solved by the other only"),
    )
    lines += [
        "",
        "## Learning at all: each arm against checkpoint 0",
        "",
        "Final held-out success against checkpoint 0's, t-test over seeds of (final - ckpt 0) (one-sample when "
        "checkpoint 0 scored the same on every seed, paired otherwise):",
        "",
        "| arm | test | seeds | ckpt 0 | final | mean gain | t | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, t in summary["ckpt0_tests"].items():
        p_text = "n/a (same gain on every seed)" if math.isnan(t["p"]) and t["n"] >= 2 else _cell(t["p"])
        lines.append(
            f"| {arm} | {t['kind'] if t['n'] else 'n/a'} | {t['n']} | {_cell(t['ckpt0'])} | {_cell(t['final'])} | "
            f"{_cell(t['mean_diff'], '+.3f')} | {_cell(t['t'], '.2f')} | {p_text} |"
        )
    lines += _task_level_table(
        summary["ckpt0_task_tests"],
        "Task-level: exact McNemar test over (seed, held-out task) pairs of the final checkpoint against checkpoint 0:",
        ("arm", "solved by final only", "solved by ckpt 0 only"),
    )
    lines += [
        "",
        "## Mechanism per arm and round (mean over seeds)",
        "",
        "informative: share of the round's GRPO groups (one task's rollouts) whose rewards are not all equal; coverage: "
        "share of the held-out split's distinct tool bigrams present in pool r; signals f/b/r: forgetting/boundary/rare "
        "signals mined; accepted f/b/r/random: accepted candidates by the kind of signal they answer; dev and held-out: "
        "success of the checkpoint the round produced. n/a: not recorded.",
        "",
        "| arm | round | informative | coverage | signals f/b/r | accepted f/b/r/random | dev | held-out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, rows in summary["mechanism"].items():
        for row in rows:
            lines.append(
                f"| {arm} | {row['round']} | {_cell(row['informative'])} | {_cell(row['coverage'])} | "
                f"{_counts(row['signals'], SIGNAL_KINDS)} | {_counts(row['accepted'], ACCEPTED_KINDS)} | "
                f"{_cell(row['dev'])} | {_cell(row['heldout'])} |"
            )
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

    from tasks.common import HELDOUT_ROUND, open_warehouse
    from tasks.evaluate import HELDOUT_SPLIT

    with open_warehouse(config) as wh:
        results = [
            {
                **run,
                "heldout_outcomes": wh.evaluation_outcomes(run["run_id"], run["rounds"][-1]["round"], HELDOUT_SPLIT),
                # Checkpoint 0's held-out rows (the prepare stage stores them under HELDOUT_ROUND) and dev score.
                "baseline_outcomes": wh.evaluation_outcomes(run["run_id"], HELDOUT_ROUND, HELDOUT_SPLIT),
                "baseline_dev_success": (wh.stage_output(run["run_id"], 0, "prepare") or {}).get("baseline_dev_success"),
            }
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
    for arm, t in out["ckpt0_tests"].items():
        if not math.isnan(t["p"]):
            metrics[f"p.{arm}_vs_ckpt0"] = t["p"]
    for arm, t in out["ckpt0_task_tests"].items():
        metrics[f"p_tasks.{arm}_vs_ckpt0"] = t["p"]
    run_id = tracker.log_evaluation(f"{name}-report", metrics, {"runs": len(results)}, {"coevolve.kind": "ablation"})
    for path in [Path(out["report"]), *map(Path, out["figures"])]:
        tracker.attach_artifact(run_id, path, "report")
    get_run_logger().info("ablation report at %s", out["report"])
    return {**out, "mlflow_run_id": run_id}
