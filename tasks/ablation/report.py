"""Ablation report: mean +- sd per arm, tested comparisons, learning curves, signal mix, pool growth.

Up to six families of comparisons, each Holm-corrected on its own: `full` against every arm without
the curriculum, every arm against checkpoint 0 ("learning at all"), `full+learnability` against the
other curriculum arms, each curriculum arm against its base arm ("curriculum on vs off"), `random` against
`static` ("new tasks against replaying D_0"), and the arm-against-arm comparisons again at equal optimizer
steps; each tested with seed and held-out task as units (tasks/ablation/inference.py), with the held-out split's
size and digest and the smallest effect the experiment detects with 80% power. Per arm, the episodes played and
optimizer steps, which differ where an arm skips flat groups. Also the mechanism per arm and round, mean over
seeds: informative GRPO groups, episodes played per informative group, the curriculum's calibration,
held-out tool-pattern coverage of the training pool, signals and accepted candidates by kind, dev and
held-out success (table, mechanism.png, curriculum.png, acceptance_by_kind.png).

Input is what the ablation flow collected: for every (arm, seed) run, its round summaries, the
official-category accuracy of its final checkpoint and its per-task outcomes. Output is a Markdown file with PNG
figures and the outcome files (tasks/ablation/outcomes.py) beside it, also logged to MLflow as one run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from coevolve.signals import SIGNAL_KINDS, letters
from tasks.ablation.curves import ACCEPTED_KINDS
from tasks.ablation.inference import Structure, detectable_effect, estimate_structure, holm, seed_level_array_test
from tasks.ablation.outcomes import write_results
from tasks.ablation.plots import ablation_curves, curriculum_figure, mechanism_figures
from tasks.ablation.report_summary import heldout_outcomes_by_arm, summarize

# Evaluation split of the final held-out split's rows (tasks/splits.build_final_heldout), scored by the ablation flow.
FINAL_SPLIT = "final-heldout"

# Simulated experiments per effect size when the report finds its detectable effect: 400 puts a
# power of 0.8 within about +-0.02 (binomial sd), and the search over effects takes seconds.
POWER_DRAWS = 400
# The largest effect the search tries (in held-out success): beyond it the report says "n/a".
POWER_LARGEST = 0.3
# Significance level a Holm-adjusted p-value is read against.
ALPHA = 0.05


def _cell(value: float, spec: str = ".3f") -> str:
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def _counts(values: dict[str, float], kinds: tuple[str, ...]) -> str:
    """Per-kind means as ``a/b/c`` (one decimal unless whole); n/a when no seed recorded them."""
    if all(math.isnan(values[k]) for k in kinds):
        return "n/a"
    return "/".join(_cell(values[k], ".0f" if float(values[k]).is_integer() else ".1f") for k in kinds)


def official_header(results: list[dict[str, Any]]) -> str:
    """The official-benchmark column's title: the splits the runs were scored on, or that there were none."""
    splits = sorted({split for r in results for split in r["official"]})
    return f"official {', '.join(splits)}" if splits else "official benchmark (none)"


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


def experiment_structure(results: list[dict[str, Any]]) -> Structure | None:
    """The power simulation's structure estimated from the runs' own tested outcomes (``estimate_structure``);
    None where they cannot give one (no per-task outcomes, or fewer than two seeds every arm has)."""
    arms = {arm: seeds for arm, seeds in heldout_outcomes_by_arm(results).items() if seeds}
    baseline = next((r["baseline_outcomes"] for r in results if r.get("baseline_outcomes")), None)
    if not arms or not baseline:
        return None
    try:
        return estimate_structure(arms, baseline)
    except ValueError:
        return None


def _structure_text(structure: Structure | None) -> str:
    if structure is None:
        return (
            "with the default structure of tasks/ablation/inference.py (these runs' outcomes cannot give their own: "
            "fewer than two seeds or no per-task outcomes)"
        )
    spreads = ", ".join(f"{f.name} {getattr(structure, f.name):.2f}" for f in fields(structure)[1:])
    return (
        f"with the structure estimated from these runs' own outcomes (checkpoint 0 solves "
        f"{structure.ckpt0_success:.3f}; spreads in probit units: {spreads})"
    )


def _design_lines(
    heldout: dict[str, Any],
    power: dict[str, float],
    seeds: int,
    draws: int,
    families: list[str],
    structure: Structure | None,
) -> list[str]:
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
        "this experiment's structure (tasks/ablation/inference.py), they reject in about 20-30% and 10-20% of "
        "experiments at alpha 0.05, the two-way test in at most 4% "
        "(tests/tasks/test_inference.py).",
        "",
        f"{len(families)} families of comparisons, each Holm-corrected on its own: {'; '.join(families)}. "
        "Both the raw and the adjusted p-value are printed; a claim stands on the adjusted one "
        f"(significant: p (Holm) < {ALPHA}).",
        "",
        f"Power at this size ({seeds} seeds x {size if size is not None else 'n/a'} held-out tasks), "
        f"simulated {_structure_text(structure)} ({draws} experiments per effect, alpha 0.05 before correction): "
        "the smallest difference in held-out "
        f"success the two-way test detects with 80% power is {_cell(power['arm'], '.2f')} between two arms and "
        f"{_cell(power['ckpt0'], '.2f')} between an arm and checkpoint 0 (n/a: not even "
        f"{POWER_LARGEST:.2f}). Smaller true differences are likely to be missed.",
    ]


def _verdict(tests: dict[str, dict[str, Any]], label: Callable[[str], str]) -> str:
    """What a family's Holm-adjusted p-values say, in words: significant, not significant, not tested."""
    tested = {k: t for k, t in tests.items() if not math.isnan(t.get("p_holm", math.nan))}
    significant = [f"{label(k)} ({t['mean_diff']:+.3f}, p (Holm) {t['p_holm']:.3f})" for k, t in tested.items()
                   if t["p_holm"] < ALPHA]  # fmt: skip
    not_significant = [label(k) for k, t in tested.items() if t["p_holm"] >= ALPHA]
    untested = [label(k) for k in tests if k not in tested]
    parts = [
        f"Significant at {ALPHA} after Holm: {', '.join(significant)}."
        if significant
        else f"No comparison of this family is significant at {ALPHA} after Holm.",
    ]
    if not_significant:
        parts.append(f"Not significant: {', '.join(not_significant)}.")
    if untested:
        parts.append(f"Not tested (no p-value): {', '.join(untested)}.")
    return " ".join(parts)


def _arm_family(
    title: str,
    header: str,
    tests: dict[str, dict[str, Any]],
    intro: list[str],
    label: Callable[[str], str],
    steps: bool = False,
) -> list[str]:
    """One family of arm-against-arm comparisons: heading, table and what is significant; ``steps`` adds the optimizer
    steps each comparison was made at."""
    lines = ["", f"### {title} ({len(tests)} comparisons, Holm)", ""]
    if intro:
        lines += [*intro, ""]
    step_header, step_rule = (" steps |", "---|") if steps else ("", "")
    lines += [
        f"| {header} | seeds | tasks |{step_header} mean difference | se | t | p | p (Holm) |",
        f"|---|---|---|{step_rule}---|---|---|---|---|",
    ]
    for other, t in tests.items():
        step_cell = f" {_cell(t['steps'], '.1f')} |" if steps else ""
        lines.append(
            f"| {other} | {t['seeds']} | {t['tasks']} |{step_cell} {_cell(t['mean_diff'], '+.3f')} | "
            f"{_cell(t['se'])} | {_cell(t['t'], '.2f')} | {_p_text(t)} | {_p_text(t, 'p_holm')} |"
        )
    return [*lines, "", _verdict(tests, label)]


def _step_matched_lines(tests: dict[str, dict[str, Any]]) -> list[str]:
    """The arm-against-arm comparisons at equal optimizer steps: an arm that skips flat groups takes fewer steps."""
    intro = (
        "Arms that skip flat GRPO groups end with different step counts. Here each seed's two runs are compared on "
        "the per-round held-out split after the rounds by which both have taken the smaller of their two step "
        "totals (steps: that count, mean over seeds), so neither has trained longer."
    )

    def label(name: str) -> str:
        return f"`{name.replace(' vs ', '` vs `')}` at equal steps"

    return _arm_family("Family 6: at equal optimizer steps", "comparison", tests, [intro], label, steps=True)


def _difficulty_lines(mechanism: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The final round's pool by estimated success, per arm with estimates (none: no lines)."""
    final = {arm: rows[-1]["difficulty"] for arm, rows in mechanism.items() if rows and rows[-1]["difficulty"]}
    if not final:
        return []
    bins = list(dict.fromkeys(b for h in final.values() for b in h))
    lines = [
        "",
        "Pool of the final round by the curriculum's estimate of each task's success (tasks, mean over seeds):",
        "",
        "| arm | " + " | ".join(bins) + " |",
        "|---|" + "---|" * len(bins),
    ]
    return lines + [f"| {arm} | " + " | ".join(_cell(h.get(b, 0.0), ".1f") for b in bins) + " |"
                    for arm, h in final.items()]  # fmt: skip


def write_report(
    results: list[dict[str, Any]], out_dir: Path, title: str, power_draws: int = POWER_DRAWS
) -> dict[str, Any]:
    """Write report.md and its figures into ``out_dir``; return the summary with the file paths.

    ``power_draws``: simulated experiments per effect size in the search for the detectable effect.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    figures = [
        *ablation_curves(results, out_dir),
        *mechanism_figures(results, summary["mechanism"], out_dir),
        curriculum_figure(summary["mechanism"], out_dir),
    ]
    lines = [
        f"# {title}",
        "",
        f"{len(results)} runs: arms {', '.join(summary['arms'])}; seeds "
        f"{', '.join(str(s) for s in sorted({r['seed'] for r in results}))}; {len(results[0]['rounds'])} rounds each.",
        "",
        f"| arm | held-out success after the last round, per-round split | {official_header(results)} | final pool "
        f"| acceptance | signals {letters()} | episodes played | optimizer steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, row in summary["arms"].items():
        s = row["signals"]
        lines.append(
            f"| {arm} | {_fmt(row['heldout'])} | {_fmt(row['official'])} | {row['final_pool'][0]:.0f} | "
            f"{'n/a' if math.isnan(row['acceptance']) else format(row['acceptance'], '.2f')} | "
            f"{'/'.join(str(s[kind]) for kind in SIGNAL_KINDS)} | {_cell(row['episodes'], '.0f')} | "
            f"{_cell(row['optimizer_steps'], '.0f')} |"
        )
    lines += [
        "",
        "Compute per arm (mean over seeds of each run's rounds summed): episodes played are the trajectories its "
        "rollouts played (a curriculum arm plays replacement tasks for groups whose rewards were all equal, up to "
        "the most episodes per step a base arm plays); optimizer steps are its updates' steps. n/a: not recorded.",
    ]
    seeds = len({r["seed"] for r in results})
    tested = [t["tasks"] for t in (*summary["tests"].values(), *summary["ckpt0_tests"].values())]
    heldout = {
        "size": results[0].get("heldout_size") or max(tested, default=0) or None,
        "digest": results[0].get("heldout_digest"),
        "split": results[0].get("tested_split"),
    }
    tasks = heldout["size"] or 0
    structure = experiment_structure(results)
    power = (
        detectable_effect(seeds, tasks, draws=power_draws, largest=POWER_LARGEST, structure=structure or Structure())
        if seeds >= 2 and tasks >= 2
        else {"arm": math.nan, "ckpt0": math.nan}
    )
    summary["heldout_split"], summary["detectable_effect"] = heldout, power
    summary["structure"] = structure
    families = [
        text
        for key, text in (
            ("tests", "`full` against each arm without the curriculum"),
            ("ckpt0_tests", "each arm against checkpoint 0"),
            ("curriculum_arm_tests", "`full+learnability` against the other curriculum arms"),
            ("curriculum_tests", "each curriculum arm against its base arm (curriculum on vs off)"),
            ("new_task_tests", "`random` against `static` (new tasks against replaying D_0)"),
            ("step_matched_tests", "the arm-against-arm comparisons again at equal optimizer steps"),
        )
        if summary[key]
    ]
    lines += _design_lines(heldout, power, seeds, power_draws, families, structure)
    if summary["tests"]:
        intro = []
        if any(arm.startswith("no-") for arm in summary["arms"]):
            intro = [
                "Against a `no-<signal>` arm, the mean difference is what leaving that signal out costs "
                "(positive: `full` does better with it)."
            ]
        lines += _arm_family(
            "Family 1: `full` against each arm without the curriculum", "full vs", summary["tests"], intro,
            lambda other: f"`full` vs `{other}`",
        )  # fmt: skip
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
    lines += ["", _verdict(summary["ckpt0_tests"], lambda arm: f"`{arm}` vs checkpoint 0")]
    if summary["curriculum_arm_tests"]:
        lines += _arm_family(
            "Family 3: `full+learnability` against the other curriculum arms", "full+learnability vs",
            summary["curriculum_arm_tests"], [], lambda other: f"`full+learnability` vs `{other}`",
        )  # fmt: skip
    if summary["curriculum_tests"]:
        intro = [
            "Each arm with the learnability curriculum and dynamic sampling against the same arm without them; "
            "the mean difference is what the curriculum adds (positive: better with it)."
        ]
        lines += _arm_family(
            "Family 4: curriculum on vs off", "X+learnability vs X, X =", summary["curriculum_tests"], intro,
            lambda base: f"`{base}+learnability` vs `{base}`",
        )  # fmt: skip
    if summary["new_task_tests"]:
        intro = [
            "Both arms replay their pool on the same schedule; only `random` adds tasks (unguided synthesis), so the "
            "mean difference is what new tasks add over replaying D_0 (positive: better with them)."
        ]
        lines += _arm_family(
            "Family 5: `random` against `static`", "random vs", summary["new_task_tests"], intro,
            lambda other: f"`random` vs `{other}`",
        )  # fmt: skip
    if summary["step_matched_tests"]:
        lines += _step_matched_lines(summary["step_matched_tests"])
    lines += [
        "",
        "## Mechanism per arm and round (mean over seeds)",
        "",
        "informative: share of the round's GRPO groups (one task's rollouts) whose rewards are not all equal; "
        "coverage: share of the held-out split's distinct tool bigrams present in pool r; "
        f"signals {letters()}: {'/'.join(SIGNAL_KINDS)} signals mined; "
        f"accepted {letters()}/random: accepted candidates by the kind of signal they answer; "
        "dev and held-out: success of the checkpoint the round produced; "
        "episodes and groups: what the round's rollouts played; ep./informative: episodes played per informative "
        "group; calibration: mean absolute error of the curriculum's estimate of each played task's success against "
        "its success in the round, weighted by episodes. n/a: not recorded.",
        "",
        f"| arm | round | informative | coverage | signals {letters()} | accepted {letters()}/random | dev | held-out "
        "| episodes | groups | ep./informative | calibration |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, rows in summary["mechanism"].items():
        for row in rows:
            lines.append(
                f"| {arm} | {row['round']} | {_cell(row['informative'])} | {_cell(row['coverage'])} | "
                f"{_counts(row['signals'], SIGNAL_KINDS)} | {_counts(row['accepted'], ACCEPTED_KINDS)} | "
                f"{_cell(row['dev'])} | {_cell(row['heldout'])} | {_cell(row['episodes'], '.1f')} | "
                f"{_cell(row['groups'], '.1f')} | {_cell(row['per_informative'], '.2f')} | "
                f"{_cell(row['calibration'])} |"
            )
    lines += _difficulty_lines(summary["mechanism"])
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
    files = write_results(results, out_dir)
    lines += [
        "",
        f"Per-task outcomes and per-round figures: {', '.join(f'`{p.name}`' for p in files)} beside this report; "
        "`coevolve report <this folder>` recomputes every table, test and Holm adjustment above from them.",
    ]
    lines += ["", *[f"![{p.stem}]({p.name})" for p in figures], ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return {**summary, "report": str(report), "figures": [str(p) for p in figures], "files": [str(p) for p in files]}


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
    checkpoint 0's one draw fixed, so they say nothing about other tasks (tasks/ablation/inference.py).
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


if __name__ == "__main__":
    # python -m tasks.ablation.report REPORT.md: the seed-level recheck of an existing report's per-run table.
    import sys

    print("\n".join(seed_level_recheck(read_per_run_table(Path(sys.argv[1]).read_text()))))
