"""Ablation report: mean +- sd per arm, tested comparisons, learning curves, signal mix, pool growth.

Two families of comparisons, each Holm-corrected: `full` against every other arm, and every arm
against checkpoint 0 ("learning at all"), each tested with seed and held-out task as units
(tasks/inference.py), with the held-out split's size and digest and the smallest effect the
experiment detects with 80% power. Also the mechanism per arm and round, mean over seeds: informative
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

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from coevolve.config import PipelineConfig
from coevolve.records import SIGNAL_KINDS
from storage.pool import pool_digest
from storage.tracking import Tracker
from tasks.common import open_warehouse
from tasks.curves import ACCEPTED_KINDS, baseline_of, mean_present, number
from tasks.inference import detectable_effect, holm, seed_level_array_test, two_way_test
from tasks.plots import ablation_curves, mechanism_figures
from tasks.splits import HELDOUT_ROUND, HELDOUT_SPLIT

# Evaluation split of the final held-out split's rows (tasks/splits.build_final_heldout), scored by the ablation flow.
FINAL_SPLIT = "final-heldout"

# Simulated experiments per effect size when the report finds its detectable effect: 400 puts a
# power of 0.8 within about +-0.02 (binomial sd), and the search over effects takes seconds.
POWER_DRAWS = 400
# The largest effect the search tries (in held-out success): beyond it the report says "n/a".
POWER_LARGEST = 0.3


def final_heldout(run: dict[str, Any]) -> float:
    return float(run["rounds"][-1]["heldout_success"])


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-arm figures and the report's two families of comparisons, each tested with seed and task as units.

    Family "full vs arm": `full` against every other arm. Family "arm vs checkpoint 0": every arm's final
    checkpoint against checkpoint 0. Each comparison is ``two_way_test`` on the runs' per-task held-out
    outcomes (``heldout_outcomes``, and ``baseline_outcomes`` for checkpoint 0), Holm-adjusted within its
    family (``p_holm``). Runs without per-task outcomes get the mean difference over seeds and no p-value.
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
    outcomes = {
        arm: {r["seed"]: r["heldout_outcomes"] for r in runs if r.get("heldout_outcomes")} for arm, runs in arms.items()
    }
    tests = {}
    if "full" in arms:
        for other in arms:
            if other != "full":
                tests[other] = _comparison(outcomes["full"], outcomes[other], by_seed["full"], by_seed[other])
    ckpt0_tests = {}
    for arm, runs in arms.items():
        # Checkpoint 0 shared by every seed: one outcome per task; else each seed against its own.
        by_seed_baseline = {r["seed"]: r["baseline_outcomes"] for r in runs if r.get("baseline_outcomes")}
        shared = len({tuple(sorted(b.items())) for b in by_seed_baseline.values()}) == 1
        baseline = next(iter(by_seed_baseline.values())) if shared else by_seed_baseline
        base_by_seed = {r["seed"]: baseline_of(r) for r in runs if baseline_of(r) is not None}
        result = _comparison(outcomes[arm] if baseline else {}, baseline, by_seed[arm], base_by_seed)
        if result["tasks"]:  # the rates on the tested split
            result["ckpt0"], result["final"] = result["b_mean"], result["a_mean"]
        else:
            result["ckpt0"] = statistics.fmean(base_by_seed.values()) if base_by_seed else math.nan
            result["final"] = statistics.fmean(by_seed[arm][s] for s in base_by_seed) if base_by_seed else math.nan
        ckpt0_tests[arm] = result
    for family in (tests, ckpt0_tests):
        for name, p_holm in holm({k: t["p"] for k, t in family.items()}).items():
            family[name]["p_holm"] = p_holm
    return {
        "arms": table,
        "tests": tests,
        "mechanism": {arm: mechanism_rows(runs) for arm, runs in arms.items()},
        "ckpt0_tests": ckpt0_tests,
    }


def _comparison(a: dict[int, Any], b: Any, a_by_seed: dict[int, float], b_by_seed: dict[int, float]) -> dict[str, Any]:
    """``two_way_test`` of a against b when both have per-task outcomes.

    Else the seed-level mean difference, untested.
    """
    if a and b:
        return dict(two_way_test(a, b))
    seeds = sorted(set(a_by_seed) & set(b_by_seed))
    diff = statistics.fmean(a_by_seed[s] - b_by_seed[s] for s in seeds) if seeds else math.nan
    return {"seeds": len(seeds), "tasks": 0, "mean_diff": diff, "se": math.nan, "t": math.nan, "p": math.nan}


# --- mechanism: per arm and round, mean over seeds --------------------------------------------------


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
                "informative": mean_present([number(s.get("informative_groups")) for s in rounds]),
                "coverage": mean_present([number(s.get("heldout_coverage")) for s in rounds]),
                "signals": {k: mean_present([float(s["signals"].get(k, 0)) for s in rounds]) for k in SIGNAL_KINDS},
                # Summaries without the field have no per-kind counts: nan, not 0.
                "accepted": {
                    k: mean_present(
                        [
                            float((s.get("accepted_by_kind") or {}).get(k, 0)) if "accepted_by_kind" in s else math.nan
                            for s in rounds
                        ]
                    )
                    for k in ACCEPTED_KINDS
                },
                "dev": mean_present([number(s.get("dev_success")) for s in rounds]),
                "heldout": mean_present([number(s.get("heldout_success")) for s in rounds]),
            }
        )
    return rows


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


def _p_text(t: dict[str, Any], key: str = "p") -> str:
    """A p-value cell: the value, or why there is none."""
    if not math.isnan(t[key]):
        return f"{t[key]:.3f}"
    if not t["tasks"]:
        return "n/a (no per-task outcomes)"
    return "n/a (same gap everywhere)" if t["seeds"] >= 2 else "n/a (one seed)"


def _design_lines(heldout: dict[str, Any], power: dict[str, float], seeds: int, draws: int) -> list[str]:
    """The held-out split, the tests, the families and the detectable effect, as the report states them."""
    size, split_digest = heldout.get("size"), heldout.get("digest")
    return [
        "",
        "## How the comparisons are tested",
        "",
        f"Tested on the {'final held-out split' if heldout.get('split') == FINAL_SPLIT else 'held-out split'}: "
        f"{size if size is not None else 'n/a'} tasks, pool digest `{split_digest or 'n/a'}`. "
        "Every run's final checkpoint and checkpoint 0 are scored on the same tasks; "
        "the tables and curves above and below use the per-round held-out split.",
        "",
        "Two things vary between repetitions of this experiment: the loop's seed and which tasks the held-out split "
        "drew. Each comparison is a two-way test with both as units: the per-(seed, task) difference in success, "
        "regressed on a constant with its standard error clustered by seed and by task at once (statsmodels OLS, "
        "two-way cluster-robust covariance; t reference with seeds - 1 degrees of freedom). A test over pooled "
        "(seed, task) pairs (the exact McNemar test this report used before) or over seeds with the tasks held fixed "
        "(a paired t-test) reads a lucky seed or a lucky draw of tasks as an effect: simulated under the null with "
        "this experiment's structure (tasks/inference.py), they reject in about 20-30% and 10-20% of experiments at "
        "alpha 0.05, the two-way test in at most 4% "
        "(tests/tasks/test_inference.py).",
        "",
        "Two families of comparisons, each Holm-corrected on its own: `full` against every other arm, "
        "and every arm against checkpoint 0. "
        "Both the raw and the adjusted p-value are printed; a claim stands on the adjusted one.",
        "",
        f"Power at this size ({seeds} seeds x {size if size is not None else 'n/a'} held-out tasks), "
        f"simulated with the same structure ({draws} experiments per effect, alpha 0.05 before correction): "
        "the smallest difference in held-out "
        f"success the two-way test detects with 80% power is {_cell(power['arm'], '.2f')} between two arms and "
        f"{_cell(power['ckpt0'], '.2f')} between an arm and checkpoint 0 (n/a: not even "
        f"{POWER_LARGEST:.2f}). Smaller true differences are likely to be missed.",
    ]


def write_report(
    results: list[dict[str, Any]], out_dir: Path, title: str, power_draws: int = POWER_DRAWS
) -> dict[str, Any]:
    """Write report.md and its figures into ``out_dir``; return the summary with the file paths.

    ``power_draws``: simulated experiments per effect size in the search for the detectable effect.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
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
            f"{'n/a' if math.isnan(row['acceptance']) else format(row['acceptance'], '.2f')} | "
            f"{s['forgetting']}/{s['boundary']}/{s['rare']} |"
        )
    seeds = len({r["seed"] for r in results})
    tested = [t["tasks"] for t in (*summary["tests"].values(), *summary["ckpt0_tests"].values())]
    heldout = {
        "size": results[0].get("heldout_size") or max(tested, default=0) or None,
        "digest": results[0].get("heldout_digest"),
        "split": results[0].get("tested_split"),
    }
    tasks = heldout["size"] or 0
    power = (
        detectable_effect(seeds, tasks, draws=power_draws, largest=POWER_LARGEST)
        if seeds >= 2 and tasks >= 2
        else {"arm": math.nan, "ckpt0": math.nan}
    )
    summary["heldout_split"], summary["detectable_effect"] = heldout, power
    lines += _design_lines(heldout, power, seeds, power_draws)
    lines += ["", f"### Family 1: `full` against each arm ({len(summary['tests'])} comparisons, Holm)", ""]
    if any(arm.startswith("no-") for arm in summary["arms"]):
        lines += [
            "Against a `no-<signal>` arm, the mean difference is what leaving that signal out costs "
            "(positive: `full` does better with it).",
            "",
        ]
    lines += [
        "| full vs | seeds | tasks | mean difference | se | t | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for other, t in summary["tests"].items():
        lines.append(
            f"| {other} | {t['seeds']} | {t['tasks']} | {_cell(t['mean_diff'], '+.3f')} | {_cell(t['se'])} | "
            f"{_cell(t['t'], '.2f')} | {_p_text(t)} | {_p_text(t, 'p_holm')} |"
        )
    lines += [
        "",
        f"### Family 2: each arm against checkpoint 0 ({len(summary['ckpt0_tests'])} comparisons, Holm)",
        "",
        "Final held-out success against checkpoint 0's on the same tasks "
        "(checkpoint 0 is shared by every seed: one outcome per task).",
        "",
        "| arm | seeds | tasks | ckpt 0 | final | mean gain | se | t | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, t in summary["ckpt0_tests"].items():
        lines.append(
            f"| {arm} | {t['seeds']} | {t['tasks']} | {_cell(t['ckpt0'])} | {_cell(t['final'])} | "
            f"{_cell(t['mean_diff'], '+.3f')} | "
            f"{_cell(t['se'])} | {_cell(t['t'], '.2f')} | {_p_text(t)} | {_p_text(t, 'p_holm')} |"
        )
    lines += [
        "",
        "## Mechanism per arm and round (mean over seeds)",
        "",
        "informative: share of the round's GRPO groups (one task's rollouts) whose rewards are not all equal; "
        "coverage: share of the held-out split's distinct tool bigrams present in pool r; "
        "signals f/b/r: forgetting/boundary/rare signals mined; "
        "accepted f/b/r/random: accepted candidates by the kind of signal they answer; "
        "dev and held-out: success of the checkpoint the round produced. n/a: not recorded.",
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
        cells = [
            "n/a" if baseline is None else f"{baseline:.3f}",
            *(f"{s['heldout_success']:.3f}" for s in r["rounds"]),
        ]
        lines.append(f"| {r['run_id']} | " + " | ".join(cells) + " |")
    lines += ["", *[f"![{p.stem}]({p.name})" for p in figures], ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return {**summary, "report": str(report), "figures": [str(p) for p in figures]}


# --- recheck of a report written before per-task outcomes were tested ------------------------------


def read_per_run_table(text: str) -> dict[tuple[str, int], tuple[float, float]]:
    """(arm, seed) -> (checkpoint 0's, the final round's held-out success) from a report's per-run table."""
    runs = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or "-s" not in cells[0] or cells[1] in ("ckpt 0", "n/a"):
            continue
        name, _, seed = cells[0].rpartition("-s")
        try:
            runs[(name.split("-", 1)[1], int(seed))] = (float(cells[1]), float(cells[-1]))
        except (ValueError, IndexError):
            continue
    return runs


def seed_level_recheck(runs: dict[tuple[str, int], tuple[float, float]]) -> list[str]:
    """Markdown tables of the seed-level t-tests (tasks and checkpoint 0 held fixed) of both families, Holm per family.

    For reports whose runs lack stored per-task outcomes: these tests hold the held-out tasks and
    checkpoint 0's one draw fixed, so they say nothing about other tasks (tasks/inference.py).
    """
    arms = sorted({arm for arm, _ in runs}, key=lambda a: (a != "full", a))
    seeds = sorted({seed for _, seed in runs})
    final = {arm: np.array([[runs[(arm, s)][1]] for s in seeds]) for arm in arms}
    ckpt0 = np.array([[runs[(arms[0], s)][0]] for s in seeds])
    families = {
        "full vs": {arm: seed_level_array_test(final["full"], final[arm]) for arm in arms if arm != "full"},
        "arm vs ckpt 0": {arm: seed_level_array_test(final[arm], ckpt0) for arm in arms},
    }
    lines = []
    for title, tests in families.items():
        adjusted = holm({k: t["p"] for k, t in tests.items()})
        lines += [
            "",
            f"| {title} | seeds | mean difference | t | p | p (Holm, {len(tests)}) |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {t['n']} | {t['mean_diff']:+.3f} | {_cell(t['t'], '.2f')} | {_cell(t['p'])} | "
            f"{_cell(adjusted[k])} |"
            for k, t in tests.items()
        ]
    return lines


# --- Prefect task -------------------------------------------------------------------------------


def _tested_outcomes(wh: Any, run: dict[str, Any]) -> dict[str, Any]:
    """A run with the per-task outcomes its tests use.

    The final held-out split's outcomes when the ablation scored it, else the held-out split's.
    """
    prepared = wh.stage_output(run["run_id"], 0, "prepare") or {}
    tested = {"baseline_dev_success": prepared.get("baseline_dev_success")}
    if run.get("final_heldout_outcomes"):
        tested |= {
            "heldout_outcomes": run["final_heldout_outcomes"],
            "baseline_outcomes": run["final_baseline_outcomes"],
            "heldout_size": run["final_heldout_size"],
            "heldout_digest": run["final_heldout_digest"],
            "tested_split": FINAL_SPLIT,
        }
    else:
        # Checkpoint 0's held-out rows: the prepare stage stores them under HELDOUT_ROUND.
        tasks = wh.pool(run["run_id"], HELDOUT_ROUND)
        tested |= {
            "heldout_outcomes": wh.evaluation_outcomes(run["run_id"], run["rounds"][-1]["round"], HELDOUT_SPLIT),
            "baseline_outcomes": wh.evaluation_outcomes(run["run_id"], HELDOUT_ROUND, HELDOUT_SPLIT),
            "heldout_size": len(tasks),
            "heldout_digest": pool_digest(tasks) if tasks else None,
            "tested_split": HELDOUT_SPLIT,
        }
    return {**run, **tested}


@task(name="report", cache_policy=NO_CACHE)
def report_task(config: PipelineConfig, name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the ablation report under the state folder and log it to MLflow as one run."""
    with open_warehouse(config) as wh:
        results = [_tested_outcomes(wh, run) for run in results]
    out = write_report(results, config.state_dir / "reports" / name, f"Ablation `{name}`")
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    metrics = {}
    for arm, row in out["arms"].items():
        if not math.isnan(row["heldout"][0]):
            metrics[f"heldout.{arm}.mean"] = row["heldout"][0]
            metrics[f"heldout.{arm}.sd"] = row["heldout"][1]
    for family, label in ((out["tests"], "full_vs_{}"), (out["ckpt0_tests"], "{}_vs_ckpt0")):
        for name_, t in family.items():
            for key in ("p", "p_holm"):
                if not math.isnan(t[key]):
                    metrics[f"{key}.{label.format(name_)}"] = t[key]
    for comparison, effect in out["detectable_effect"].items():
        if not math.isnan(effect):
            metrics[f"detectable_effect.{comparison}"] = effect
    params = {
        "runs": len(results),
        "heldout_split.size": out["heldout_split"]["size"],
        "heldout_split.digest": out["heldout_split"]["digest"],
    }
    run_id = tracker.log_evaluation(f"{name}-report", metrics, params, {"coevolve.kind": "ablation"})
    for path in [Path(out["report"]), *map(Path, out["figures"])]:
        tracker.attach_artifact(run_id, path, "report")
    get_run_logger().info("ablation report at %s", out["report"])
    return {**out, "mlflow_run_id": run_id}


if __name__ == "__main__":
    # python -m tasks.report REPORT.md: the seed-level recheck of an existing report's per-run table.
    import sys

    print("\n".join(seed_level_recheck(read_per_run_table(Path(sys.argv[1]).read_text()))))
