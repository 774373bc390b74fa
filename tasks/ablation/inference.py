"""The ablation's statistics: tests whose unit is both the seed and the held-out task, Holm per family, power.

The design: every (arm, seed) run's final checkpoint and checkpoint 0 are scored on the same held-out
tasks, so an outcome is one (run, task) cell. Two things vary between repetitions of the experiment:
the seeds of the loop (a run can be luckier on every task) and which tasks the held-out split drew
(training can help some tasks and hurt others). A test that pools (seed, task) pairs as if they were
independent (the exact McNemar test the report used before) or that holds the tasks fixed (a t-test
over seeds) reads either kind of luck as an effect.

``two_way_test`` regresses the per-(seed, task) difference on a constant and takes its standard error
clustered by seed and by task at once (Cameron, Gelbach and Miller's two-way clustering, as statsmodels
implements it), with a t reference on (number of seeds - 1) degrees of freedom. The mean difference is
the same number the report prints; the standard error counts both sources of variation, and against
checkpoint 0 (one outcome per task, repeated for every seed) the repetition adds nothing.

``simulate_experiment`` draws outcomes with the structure the ablation has (per-task difficulty, what
training does to each task, per-arm task affinities, per-seed and per-run shifts, 0/1 outcomes),
calibrated to the 30-run ablation in docs/history/ablation_report_6arms_5seeds.md; the suite checks every
test the report uses against it under the null, and ``detectable_effect`` finds the smallest effect the experiment's
size detects with 80% power.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import numpy as np
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.multitest import multipletests

Outcomes = Mapping[int, Mapping[str, bool]]  # seed -> task id -> success of that run's checkpoint


def outcome_matrix(a: Outcomes, b: Outcomes | Mapping[str, bool]) -> tuple[np.ndarray, np.ndarray]:
    """(seeds x tasks) 0/1 arrays of a and b on the seeds and tasks both have, in sorted order.

    ``b`` is either outcomes by seed (another arm) or one outcome per task (checkpoint 0, shared by
    every seed), which is repeated for each seed.
    """
    if b and isinstance(next(iter(b.values())), Mapping):
        per_seed = cast(Outcomes, b)
        seeds = sorted(set(a) & set(per_seed))
    else:
        seeds = sorted(a)
        per_seed = dict.fromkeys(seeds, cast(Mapping[str, bool], b))
    if not seeds:
        return np.zeros((0, 0)), np.zeros((0, 0))
    tasks = sorted(set.intersection(*(set(a[s]) & set(per_seed[s]) for s in seeds)))
    left = np.array([[float(a[s][t]) for t in tasks] for s in seeds])
    right = np.array([[float(per_seed[s][t]) for t in tasks] for s in seeds])
    return left, right


def two_way_array_test(left: np.ndarray, right: np.ndarray) -> dict[str, float]:
    """``two_way_test`` on (seeds x tasks) arrays; what the simulation calls.
    Also returns each side's mean (a_mean, b_mean)."""
    seeds, tasks = left.shape if left.ndim == 2 else (0, 0)
    result = {"seeds": seeds, "tasks": tasks, "mean_diff": math.nan, "se": math.nan, "t": math.nan, "p": math.nan}
    if left.size:
        result.update(a_mean=float(left.mean()), b_mean=float(right.mean()), mean_diff=float((left - right).mean()))
    if seeds < 2 or tasks < 2:
        return result
    diff = (left - right).ravel()
    if np.all(diff == diff[0]):
        # No variation at all: identical outcomes are no evidence (p = 1); the same nonzero gap in
        # every cell has no variance to test against (p undefined).
        result["p"] = 1.0 if diff[0] == 0 else math.nan
        return result
    seed_of, task_of = np.repeat(np.arange(seeds), tasks), np.tile(np.arange(tasks), seeds)
    fit = _clustered_mean(diff, np.column_stack([seed_of, task_of]))
    if not fit.cov_params()[0, 0] > 0:
        # Two-way clustering subtracts the cell-level variance from the two one-way ones and can come out
        # negative in a small design; then the larger of the two one-way clustered results stands.
        fit = max((_clustered_mean(diff, seed_of), _clustered_mean(diff, task_of)), key=lambda f: f.pvalues[0])
        if not fit.cov_params()[0, 0] > 0:
            return result
    result.update(se=float(fit.bse[0]), t=float(fit.tvalues[0]), p=float(fit.pvalues[0]))
    return result


def _clustered_mean(diff: np.ndarray, groups: np.ndarray):
    """statsmodels' OLS of ``diff`` on a constant with cluster-robust covariance over ``groups``
    (one or two columns), t reference."""
    return sm.OLS(diff, np.ones_like(diff)).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)


def two_way_test(a: Outcomes, b: Outcomes | Mapping[str, bool]) -> dict[str, float]:
    """Mean difference in held-out success of a over b, tested with seed and task as units (two-way clustered).

    Returns seeds, tasks, mean_diff, se, t and p (two-sided; t reference with seeds - 1 degrees of freedom).
    Fewer than two seeds or tasks cannot be tested (p nan).
    """
    return two_way_array_test(*outcome_matrix(a, b))


def pooled_mcnemar_array_test(left: np.ndarray, right: np.ndarray) -> dict[str, float]:
    """The exact McNemar test over pooled (seed, task) pairs: anti-conservative here, kept to show why.

    It treats the pairs as independent; they are not (a seed's run, a task's difficulty and checkpoint
    0's one outcome per task are shared), and the null simulation rejects far more than alpha with it.
    """
    a_only = int(((left == 1) & (right == 0)).sum())
    b_only = int(((left == 0) & (right == 1)).sum())
    p = float(stats.binomtest(a_only, a_only + b_only, 0.5).pvalue) if a_only + b_only else 1.0
    return {"pairs": int(left.size), "a_only": a_only, "b_only": b_only, "p": p}


def seed_level_array_test(left: np.ndarray, right: np.ndarray) -> dict[str, float]:
    """Paired t-test over seeds of the runs' success rates (scipy's ttest_rel): the held-out tasks held fixed."""
    a, b = left.mean(axis=1), right.mean(axis=1)
    diffs = a - b
    if len(diffs) < 2 or np.allclose(diffs, diffs[0], atol=1e-9):
        p = 1.0 if len(diffs) >= 2 and abs(diffs[0]) < 1e-9 else math.nan
        return {"n": len(diffs), "mean_diff": float(diffs.mean()) if len(diffs) else math.nan, "t": math.nan, "p": p}
    result = stats.ttest_rel(a, b)
    return {"n": len(diffs), "mean_diff": float(diffs.mean()), "t": float(result.statistic), "p": float(result.pvalue)}


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values of one family (statsmodels' multipletests);
    untestable (nan) entries stay nan and do not count."""
    names = [k for k, p in pvalues.items() if not math.isnan(p)]
    adjusted = dict.fromkeys(pvalues, math.nan)
    if names:
        adjusted.update(
            zip(names, (float(p) for p in multipletests([pvalues[k] for k in names], method="holm")[1]), strict=True)
        )
    return adjusted


# --- simulation: the experiment's structure, under the null and with a known effect ----------------


@dataclass(frozen=True)
class Structure:
    """Spreads (in probit units) of what varies between repetitions of the ablation.

    A task's difficulty sets checkpoint 0's outcome; training moves each task's latent score by a
    task effect shared by every trained run (``training_by_task``), an arm's own affinity for the
    task shared by its seeds (``arm_by_task``), a seed's shift shared by every arm of that seed (they
    play the same round 0), a run's own shift, and per-(run, task) noise. Calibrated to the 30-run
    ablation of docs/history/ablation_report_6arms_5seeds.md: checkpoint 0 solves 19% of tasks; a final
    checkpoint differs from checkpoint 0 on about 10% of the 100 tasks and from another arm's of the same seed on about
    10%; final success varies by about 0.03 between seeds of one arm.
    """

    ckpt0_success: float = 0.19
    training_by_task: float = 0.3
    arm_by_task: float = 0.2
    seed_shift: float = 0.05
    run_shift: float = 0.08
    noise: float = 0.3


@lru_cache(maxsize=64)
def _latent_offset(structure: Structure, target: float) -> float:
    """The shift of a trained run's latent score that makes its expected success over tasks ``target``.

    Noise on a latent score moves a success rate toward 0.5, so the null (trained runs succeed as
    often as checkpoint 0) needs an offset; found by bisection over a large fixed draw.
    """
    rng = np.random.default_rng(20260101)
    base = stats.norm.ppf(structure.ckpt0_success)
    spread = math.sqrt(
        structure.training_by_task**2
        + structure.arm_by_task**2
        + structure.seed_shift**2
        + structure.run_shift**2
        + structure.noise**2
    )
    latent = rng.normal(base, 1.0, 400_000) + rng.normal(0.0, spread, 400_000)
    low, high = -3.0, 3.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if np.mean(latent + mid > 0) < target else (low, mid)
    return (low + high) / 2


def simulate_experiment(
    rng: np.random.Generator, seeds: int, tasks: int, effect: float = 0.0, structure: Structure = Structure()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One repetition of the ablation's held-out scoring: (arm A, arm B, checkpoint 0) outcomes.

    A and B are (seeds x tasks) 0/1 arrays of two arms' final checkpoints, checkpoint 0 one 0/1 outcome
    per task. Arm B and checkpoint 0 have the same expected success; arm A's is ``effect`` higher, so
    ``effect = 0`` is the null for both comparisons (A vs B, A vs checkpoint 0).
    """
    difficulty = rng.normal(stats.norm.ppf(structure.ckpt0_success), 1.0, tasks)
    ckpt0 = (difficulty > 0).astype(float)
    trained = difficulty + rng.normal(0.0, structure.training_by_task, tasks)
    seed_shift = rng.normal(0.0, structure.seed_shift, (seeds, 1))

    def arm(offset: float) -> np.ndarray:
        affinity = rng.normal(0.0, structure.arm_by_task, tasks)
        latent = trained + affinity + seed_shift + rng.normal(0.0, structure.run_shift, (seeds, 1))
        return (latent + offset + rng.normal(0.0, structure.noise, (seeds, tasks)) > 0).astype(float)

    null = _latent_offset(structure, structure.ckpt0_success)
    shifted = _latent_offset(structure, structure.ckpt0_success + effect) if effect else null
    return arm(shifted), arm(null), ckpt0


ArrayTest = Callable[[np.ndarray, np.ndarray], dict[str, float]]


def rejection_rates(
    test: ArrayTest,
    draws: int,
    seeds: int,
    tasks: int,
    effect: float = 0.0,
    alpha: float = 0.05,
    seed: int = 0,
    structure: Structure = Structure(),
) -> dict[str, float]:
    """Share of ``draws`` simulated experiments in which ``test`` rejects at ``alpha``,
    arm vs arm and arm vs checkpoint 0."""
    rng = np.random.default_rng(seed)
    hits = {"arm": 0, "ckpt0": 0}
    for _ in range(draws):
        a, b, ckpt0 = simulate_experiment(rng, seeds, tasks, effect, structure)
        hits["arm"] += test(a, b)["p"] < alpha
        hits["ckpt0"] += test(a, np.broadcast_to(ckpt0, a.shape))["p"] < alpha
    return {k: v / draws for k, v in hits.items()}


def detectable_effect(
    seeds: int,
    tasks: int,
    power: float = 0.8,
    alpha: float = 0.05,
    draws: int = 400,
    step: float = 0.01,
    largest: float = 0.3,
    test: ArrayTest = two_way_array_test,
    structure: Structure = Structure(),
) -> dict[str, float]:
    """Smallest effect on held-out success (in steps of ``step``) that ``test`` detects with ``power``, per comparison.

    nan when even ``largest`` is not detected that often (tried first, so a design too small for any
    effect costs one step of the search).
    """
    at_largest = rejection_rates(
        test, draws, seeds, tasks, largest, alpha, seed=int(round(largest * 1000)), structure=structure
    )
    found: dict[str, float] = {k: math.nan for k, rate in at_largest.items() if rate < power}
    effect = step
    while len(found) < 2 and effect <= largest + 1e-9:
        rates = rejection_rates(
            test, draws, seeds, tasks, effect, alpha, seed=int(round(effect * 1000)), structure=structure
        )
        for comparison, rate in rates.items():
            if comparison not in found and rate >= power:
                found[comparison] = round(effect, 4)
        effect += step
    return {k: found.get(k, largest) for k in ("arm", "ckpt0")}
