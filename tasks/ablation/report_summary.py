"""The ablation's figures per arm and its tested families of comparisons, and the mechanism per round.

``summarize`` tests each comparison with seed and held-out task as units (tasks/ablation/inference.py);
``mechanism_rows`` averages each round's mechanism over seeds. tasks/ablation/report.py writes them out.
"""

from __future__ import annotations

import math
import statistics
from itertools import accumulate
from typing import Any

from coevolve.signals import SIGNAL_KINDS
from tasks.ablation.arms import CURRICULUM_BASES, CURRICULUM_SUFFIX
from tasks.ablation.curves import ACCEPTED_KINDS, baseline_of, mean_present, mean_sd, number
from tasks.ablation.inference import holm, two_way_test


def final_heldout(run: dict[str, Any]) -> float:
    return float(run["rounds"][-1]["heldout_success"])


def run_total(run: dict[str, Any], key: str) -> float:
    """A round-summary count summed over the run's rounds; nan when a round did not record it."""
    values = [s.get(key) for s in run["rounds"]]
    return math.nan if any(v is None for v in values) else float(sum(values))


def heldout_outcomes_by_arm(results: list[dict[str, Any]]) -> dict[str, dict[int, Any]]:
    """Each arm's runs' per-task outcomes on the tested held-out split, by seed (``heldout_outcomes``); an arm whose
    runs recorded none maps to an empty dict."""
    arms: dict[str, dict[int, Any]] = {}
    for run in results:
        seeds = arms.setdefault(run["arm"], {})
        if run.get("heldout_outcomes"):
            seeds[run["seed"]] = run["heldout_outcomes"]
    return arms


def official_score(run: dict[str, Any]) -> float:
    """A run's final checkpoint on its environment's official splits (their mean); nan where it has none."""
    scores = [float(v) for v in run["official"].values()]
    return statistics.fmean(scores) if scores else math.nan


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-arm figures and the report's families of comparisons, each tested with seed and task as units.

    ``tests`` (family 1): `full` against every other arm without the curriculum suffix. ``ckpt0_tests``
    (family 2): every arm's final checkpoint against checkpoint 0. ``curriculum_arm_tests`` (family 3):
    `full+learnability` against `static+learnability` and `random+learnability`. ``curriculum_tests``
    (family 4, keyed by the base arm X): `X+learnability` against `X`. A family holds only the comparisons
    whose arms are present. Each comparison is ``two_way_test`` on the runs' per-task held-out outcomes
    (``heldout_outcomes``, and ``baseline_outcomes`` for checkpoint 0), Holm-adjusted within its family
    (``p_holm``). Runs without per-task outcomes get the mean difference over seeds and no p-value.
    Per arm, ``episodes`` and ``optimizer_steps``: each run's rounds summed, mean over seeds.
    """
    arms: dict[str, list[dict[str, Any]]] = {}
    for run in results:
        arms.setdefault(run["arm"], []).append(run)
    table = {}
    for arm, runs in arms.items():
        heldout = [final_heldout(r) for r in runs]
        official = [score for score in map(official_score, runs) if not math.isnan(score)]
        accepted = sum(s["accepted"] for r in runs for s in r["rounds"])
        judged = accepted + sum(s["rejected"] for r in runs for s in r["rounds"])
        signals = {k: sum(s["signals"].get(k, 0) for r in runs for s in r["rounds"]) for k in SIGNAL_KINDS}
        table[arm] = {
            "seeds": [r["seed"] for r in runs],
            "heldout": mean_sd(heldout),
            "official": mean_sd(official),
            "final_pool": mean_sd([float(r["rounds"][-1]["pool_size"]) for r in runs]),
            "acceptance": accepted / judged if judged else math.nan,
            "signals": signals,
            "episodes": mean_present([run_total(r, "episodes_played") for r in runs]),
            "optimizer_steps": mean_present([run_total(r, "optimizer_steps") for r in runs]),
        }
    by_seed = {arm: {r["seed"]: final_heldout(r) for r in runs} for arm, runs in arms.items()}
    outcomes = heldout_outcomes_by_arm(results)

    def compare(a: str, b: str) -> dict[str, Any]:
        return _comparison(outcomes[a], outcomes[b], by_seed[a], by_seed[b])

    tests = {}
    if "full" in arms:
        tests = {other: compare("full", other) for other in arms if other != "full" and CURRICULUM_SUFFIX not in other}
    full_curriculum = f"full{CURRICULUM_SUFFIX}"
    curriculum_arm_tests = {}
    if full_curriculum in arms:
        curriculum_arm_tests = {
            other: compare(full_curriculum, other)
            for other in (f"{base}{CURRICULUM_SUFFIX}" for base in CURRICULUM_BASES if base != "full")
            if other in arms
        }
    curriculum_tests = {
        base: compare(f"{base}{CURRICULUM_SUFFIX}", base)
        for base in CURRICULUM_BASES
        if base in arms and f"{base}{CURRICULUM_SUFFIX}" in arms
    }
    # New tasks against replaying D_0 alone: both arms train on the same schedule, only `random` adds tasks.
    new_task_tests = {"static": compare("random", "static")} if {"random", "static"} <= arms.keys() else {}
    pairs = [("full", other) for other in tests] + [("random", "static") for _ in new_task_tests]
    # Only where the runs carry per-round outcomes (reports of older runs have none).
    step_matched_tests = {
        f"{a} vs {b}": matched for a, b in pairs if (matched := step_matched(arms[a], arms[b]))["seeds"]
    }
    ckpt0_tests = {}
    for arm, runs in arms.items():
        # Checkpoint 0 shared by every seed: one outcome per task; else each seed against its own.
        by_seed_baseline = {r["seed"]: r["baseline_outcomes"] for r in runs if r.get("baseline_outcomes")}
        shared = len({tuple(sorted(b.items())) for b in by_seed_baseline.values()}) == 1
        baseline = next(iter(by_seed_baseline.values())) if shared else by_seed_baseline
        base_by_seed = {r["seed"]: b for r in runs if (b := baseline_of(r)) is not None}
        result = _comparison(outcomes[arm] if baseline else {}, baseline, by_seed[arm], base_by_seed)
        if result["tasks"]:  # the rates on the tested split
            result["ckpt0"], result["final"] = result["b_mean"], result["a_mean"]
        else:
            result["ckpt0"] = statistics.fmean(base_by_seed.values()) if base_by_seed else math.nan
            result["final"] = statistics.fmean(by_seed[arm][s] for s in base_by_seed) if base_by_seed else math.nan
        ckpt0_tests[arm] = result
    for family in (tests, ckpt0_tests, curriculum_arm_tests, curriculum_tests, new_task_tests, step_matched_tests):
        for name, p_holm in holm({k: t["p"] for k, t in family.items()}).items():
            family[name]["p_holm"] = p_holm
    return {
        "arms": table,
        "tests": tests,
        "mechanism": {arm: mechanism_rows(runs) for arm, runs in arms.items()},
        "ckpt0_tests": ckpt0_tests,
        "curriculum_arm_tests": curriculum_arm_tests,
        "curriculum_tests": curriculum_tests,
        "new_task_tests": new_task_tests,
        "step_matched_tests": step_matched_tests,
    }


def matched_rounds(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, int, int] | None:
    """The rounds after which runs ``a`` and ``b`` of one seed have trained equal optimizer steps, as nearly as whole
    rounds allow: S, the smaller of the two runs' totals, and for each run the first round by which it has taken S
    steps. (round of a, round of b, S); None when a round did not record its steps."""
    totals = []
    for run in (a, b):
        steps = [s.get("optimizer_steps") for s in run["rounds"]]
        if any(v is None for v in steps):
            return None
        totals.append(list(accumulate(steps)))
    matched = min(totals[0][-1], totals[1][-1])
    first = [next(i for i, total in enumerate(run) if total >= matched) for run in totals]
    return a["rounds"][first[0]]["round"], b["rounds"][first[1]]["round"], matched


def step_matched(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> dict[str, Any]:
    """``two_way_test`` of arm a against arm b on the per-round held-out split, each seed's pair of runs compared
    after the rounds where they have trained equal optimizer steps (``matched_rounds``): what the arms' difference is
    with the steps that skipped flat groups took out of it. ``steps``: the matched steps, mean over seeds."""
    by_seed_b = {r["seed"]: r for r in runs_b}
    left, right, steps = {}, {}, []
    for run_a in runs_a:
        run_b = by_seed_b.get(run_a["seed"])
        if run_b is None or not run_a.get("round_heldout_outcomes") or not run_b.get("round_heldout_outcomes"):
            continue
        matched = matched_rounds(run_a, run_b)
        if matched is None:
            continue
        round_a, round_b, step_count = matched
        left[run_a["seed"]] = run_a["round_heldout_outcomes"][round_a]
        right[run_a["seed"]] = run_b["round_heldout_outcomes"][round_b]
        steps.append(step_count)
    if not left:
        return {"seeds": 0, "tasks": 0, "mean_diff": math.nan, "se": math.nan, "t": math.nan, "p": math.nan,
                "steps": math.nan}  # fmt: skip
    return {**two_way_test(left, right), "steps": statistics.fmean(steps)}


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
    of pool r; signals and accepted: counts by kind; dev and heldout: success of the checkpoint the round produced;
    episodes and groups: what the round played; per_informative: episodes per informative group; calibration:
    the curriculum's estimate error; difficulty: pool r's tasks per estimate bin (empty when no seed had estimates).
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
                "episodes": mean_present([number(s.get("episodes_played")) for s in rounds]),
                "groups": mean_present([number(s.get("groups_played")) for s in rounds]),
                "per_informative": mean_present([number(s.get("episodes_per_informative_group")) for s in rounds]),
                "calibration": mean_present([number(s.get("calibration")) for s in rounds]),
                "difficulty": _mean_histogram([s.get("difficulty_histogram") or {} for s in rounds]),
            }
        )
    return rows


def _mean_histogram(histograms: list[dict[str, int]]) -> dict[str, float]:
    """Per bin, the mean count over the seeds that recorded a histogram; empty when none did."""
    recorded = [h for h in histograms if h]
    bins = list(dict.fromkeys(b for h in recorded for b in h))
    return {b: statistics.fmean(float(h.get(b, 0)) for h in recorded) for b in bins}
