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
training does to each task, per-arm task affinities, per-seed and per-run shifts, 0/1 outcomes), and
``detectable_effect`` finds the smallest effect the experiment's size detects with 80% power under a given
``Structure``. The report estimates that structure from the outcomes it reports (``estimate_structure``:
simulated moments, so the power line fits the experiment at hand, another environment's base rate
included); ``Structure``'s defaults, calibrated by hand to the 30-run ablation in
docs/history/ablation_report_6arms_5seeds.md, are a fallback, and the suite checks every test the report
uses against them (and against an estimated structure) under the null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import numpy as np
import statsmodels.api as sm
from scipy import optimize, special, stats
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
    play the same round 0), a run's own shift, and per-(run, task) noise.

    The defaults are a fallback, calibrated by hand to the 30-run ablation of
    docs/history/ablation_report_6arms_5seeds.md: checkpoint 0 solves 19% of tasks; a final checkpoint differs
    from checkpoint 0 on about 10% of the 100 tasks and from another arm's of the same seed on about 10%;
    final success varies by about 0.03 between seeds of one arm. They need not fit another experiment (another
    environment, a 0.4% base rate): the report estimates the structure from its own outcomes with
    ``estimate_structure``.
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
    null = _latent_offset(structure, structure.ckpt0_success)
    shifted = _latent_offset(structure, structure.ckpt0_success + effect) if effect else null
    finals, ckpt0 = _draw_arms(rng, seeds, tasks, [shifted, null], structure)
    return finals[0], finals[1], ckpt0


def simulate_arms(
    rng: np.random.Generator, arms: int, seeds: int, tasks: int, structure: Structure = Structure()
) -> tuple[np.ndarray, np.ndarray]:
    """``arms`` trained arms under the null, all as good as checkpoint 0: ((arms x seeds x tasks) 0/1 final
    checkpoints, checkpoint 0's 0/1 outcome per task); ``simulate_experiment``'s structure with any number of arms."""
    if arms < 1:
        raise ValueError(f"simulate_arms needs at least one arm, got {arms}")
    return _draw_arms(rng, seeds, tasks, [_latent_offset(structure, structure.ckpt0_success)] * arms, structure)


def _draw_arms(
    rng: np.random.Generator, seeds: int, tasks: int, offsets: list[float], structure: Structure
) -> tuple[np.ndarray, np.ndarray]:
    """One draw of checkpoint 0 and of one arm per latent offset: ((arms x seeds x tasks) 0/1, (tasks,) 0/1)."""
    difficulty = rng.normal(stats.norm.ppf(structure.ckpt0_success), 1.0, tasks)
    ckpt0 = (difficulty > 0).astype(float)
    trained = difficulty + rng.normal(0.0, structure.training_by_task, tasks)
    seed_shift = rng.normal(0.0, structure.seed_shift, (seeds, 1))

    def arm(offset: float) -> np.ndarray:
        affinity = rng.normal(0.0, structure.arm_by_task, tasks)
        latent = trained + affinity + seed_shift + rng.normal(0.0, structure.run_shift, (seeds, 1))
        return (latent + offset + rng.normal(0.0, structure.noise, (seeds, tasks)) > 0).astype(float)

    return np.stack([arm(offset) for offset in offsets]), ckpt0


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


# --- the structure from an experiment's own outcomes -------------------------------------------------

_SPREADS = ("training_by_task", "arm_by_task", "seed_shift", "run_shift", "noise")
STATISTICS = ("differs_from_ckpt0", "arms_differ", "seeds_differ", "seed_var", "run_var")
_SPREAD_LOW, _SPREAD_HIGH = 1e-3, 10.0  # the fit's bounds on a spread (probit units, on a log scale)
_SPREAD_ZERO = 0.01  # a fitted spread under this (a hundredth of the tasks' difficulty spread) is returned as 0
_FIT_TASKS, _FIT_SEEDS, _FIT_RNG_SEED = 1000, 20, 20260102  # the fit's simulated experiment and its fixed draws
_FIT_MAX_STEPS = 40  # least_squares steps (not counting its Jacobians): data that no spreads fit would wander on


def structure_statistics(finals: np.ndarray, ckpt0: np.ndarray) -> dict[str, float]:
    """The observable statistics ``estimate_structure`` matches, of (arms x seeds x tasks) final outcomes and
    checkpoint 0's (tasks,) outcomes.

    ckpt0_success: checkpoint 0's success rate. differs_from_ckpt0: share of (run, task) cells where a final
    checkpoint differs from checkpoint 0. arms_differ: share of cells where two arms of the same seed differ
    (over pairs of arms). seeds_differ: share of cells where two seeds of the same arm differ (over pairs of
    seeds). seed_var: variance over seeds of a seed's success rate averaged over arms, each arm's mean removed;
    run_var: what remains of a run's success rate once its arm's and its seed's are removed (the interaction
    mean square). With one arm, arms_differ and run_var are nan and seed_var is the arm's variance over seeds.
    seed_sd (the SD over seeds of a run's success rate within an arm) and shared_seed_sd (the part of it that
    every arm of a seed shares) are the two variances read as spreads.
    """
    arms, tasks = finals.shape[0], finals.shape[2]
    values = dict(zip(STATISTICS, _moments(finals.astype(float), ckpt0.astype(bool), tasks), strict=True))
    seed_var, run_var = values["seed_var"], values["run_var"]
    within = seed_var if arms < 2 else seed_var + run_var * (arms - 1) / arms
    return {
        "ckpt0_success": float(ckpt0.mean()),
        **values,
        "seed_sd": math.sqrt(max(within, 0.0)),
        "shared_seed_sd": math.nan if arms < 2 else math.sqrt(max(seed_var - run_var / arms, 0.0)),
    }


def _moments(p: np.ndarray, ckpt0: np.ndarray, tasks: int) -> np.ndarray:
    """``STATISTICS`` of (arms x seeds x tasks) success probabilities ``p`` (0/1 for observed outcomes).

    The shares are expected shares, and a run's observed success rate over ``tasks`` tasks adds binomial
    variance to the expected rate's: a mean of p(1 - p) / tasks (0 for observed outcomes). So outcomes and
    the fit's probabilities give the same statistics in expectation whatever the fit's numbers of seeds and tasks.
    """
    arms, seeds = p.shape[:2]
    squares = p * p
    by_task = p.sum(axis=(0, 1))
    differs_from_ckpt0 = float(by_task.sum() + (arms * seeds - 2 * by_task)[ckpt0].sum()) / p.size
    arms_differ = _pair_disagreement(p.sum(axis=0), squares.sum(axis=0), arms) if arms > 1 else math.nan
    seeds_differ = _pair_disagreement(p.sum(axis=1), squares.sum(axis=1), seeds)
    binomial = float(by_task.sum() - squares.sum()) / p.size / tasks
    rates = p.mean(axis=2)
    residual = rates - rates.mean(axis=1, keepdims=True)
    seed_effect = residual.mean(axis=0)
    seed_var = float(seed_effect.var(ddof=1)) + binomial / arms
    run_var = (
        float(((residual - seed_effect) ** 2).sum()) / ((arms - 1) * (seeds - 1)) + binomial if arms > 1 else math.nan
    )
    return np.array([differs_from_ckpt0, arms_differ, seeds_differ, seed_var, run_var])


def _pair_disagreement(total: np.ndarray, squares: np.ndarray, n: int) -> float:
    """Mean over unordered pairs of n draws (and over the other cells) of the chance that the pair differs, from
    the draws' sums ``total`` and sums of squares ``squares`` per cell: the sum over pairs of p(1 - q) + q(1 - p)
    is (n - 1) total - total^2 + squares."""
    return float(((n - 1) * total - total**2 + squares).mean()) / (n * (n - 1) / 2)


def estimate_structure(arms: Mapping[str, Outcomes], ckpt0: Mapping[str, bool]) -> Structure:
    """The ``Structure`` of an experiment, estimated from its own outcomes by the method of simulated moments.

    ``arms``: arm name -> that arm's outcomes (seed -> task id -> success of the run's final checkpoint);
    ``ckpt0``: checkpoint 0's one outcome per task, shared by every seed. Only the seeds every arm has and
    the tasks every run and checkpoint 0 have count. Raises ValueError with fewer than 2 such seeds (nothing
    varies between seeds to measure) or no such task.

    Checkpoint 0's success rate is ``ckpt0_success`` directly, clamped into [0.5 / tasks, 1 - 0.5 / tasks] so
    that a 0% or 100% rate stays a probability. The spreads are fitted (on a log scale, between 0.001 and
    10; one under 0.01 is returned as 0) so that the expected ``structure_statistics`` of ``simulate_arms``'s
    model, with as many arms as observed, equal the observed ones. Each statistic identifies mainly one spread:

    - run_var (runs' success rates, arm and seed effects removed): ``run_shift``;
    - seed_var (seeds' success rates averaged over arms): ``seed_shift``, the part every arm of a seed shares;
    - seeds_differ (two seeds of one arm differ on a task): ``noise``, given the two shifts;
    - arms_differ (two arms of one seed differ on a task): ``arm_by_task``, given run_shift and noise;
    - differs_from_ckpt0 (a final checkpoint differs from checkpoint 0 on a task): ``training_by_task``,
      given the rest.

    With a single arm, arm_by_task cannot be identified (no two arms of a seed) and is 0, and a seed's shift
    cannot be told from its run's: all of the variation between seeds goes to run_shift and seed_shift is 0,
    which for a comparison of two arms of a seed is the conservative reading (a seed's shift cancels there).

    In the fit every arm keeps its own observed success rate (a trained arm that is better than checkpoint 0
    is not read as spread), the cell noise is integrated out (probabilities instead of 0/1 draws, so the
    objective is smooth), and the standard normal draws (Latin hypercube, moment-matched, from one fixed seed)
    are the same at every evaluation: the estimate is deterministic. The expected statistics do not depend on
    the numbers of seeds and tasks except through the binomial variance of a run's rate, which is added for
    the observed number of tasks, so the fit simulates a fixed 20 seeds x 1000 tasks per arm.
    """
    finals, base = _outcome_arrays(arms, ckpt0)
    return _fit_structure(finals, base)


def _outcome_arrays(arms: Mapping[str, Outcomes], ckpt0: Mapping[str, bool]) -> tuple[np.ndarray, np.ndarray]:
    """(arms x seeds x tasks) 0/1 final outcomes and (tasks,) checkpoint 0 outcomes on the seeds every arm has
    and the tasks every run and checkpoint 0 have, in sorted order."""
    if not arms:
        raise ValueError("estimate_structure needs at least one arm")
    seeds = sorted(set.intersection(*(set(outcomes) for outcomes in arms.values())))
    if len(seeds) < 2:
        raise ValueError(f"estimate_structure needs at least 2 seeds that every arm has, got {len(seeds)}")
    tasks = sorted(set(ckpt0).intersection(*(set(o[s]) for o in arms.values() for s in seeds)))
    if not tasks:
        raise ValueError("estimate_structure needs at least one task that every run and checkpoint 0 have")
    finals = np.array([[[float(o[s][t]) for t in tasks] for s in seeds] for o in arms.values()])
    return finals, np.array([float(ckpt0[t]) for t in tasks])


@dataclass(frozen=True)
class _FitDraws:
    """The fit's common random numbers: standard normal draws, each set with mean 0 and variance 1."""

    difficulty: np.ndarray  # (tasks,)
    training: np.ndarray  # (tasks,)
    affinity: np.ndarray  # (arms, tasks)
    seed: np.ndarray  # (seeds,)
    run: np.ndarray  # (arms, seeds): the seed means' variance exactly 1 / arms, the interaction's mean square 1


def _fit_draws(arms: int) -> _FitDraws:
    rng = np.random.default_rng(_FIT_RNG_SEED)

    def latin(n: int) -> np.ndarray:
        draw = stats.norm.ppf((rng.permutation(n) + 0.5) / n)
        return draw / draw.std()

    seed = latin(_FIT_SEEDS)
    raw = rng.normal(size=(arms, _FIT_SEEDS))
    seed_part = raw.mean(axis=0) - raw.mean()
    seed_part -= (seed_part @ seed) / (seed @ seed) * seed  # uncorrelated with the seed shifts
    seed_part *= math.sqrt(1.0 / arms / seed_part.var(ddof=1))
    interaction = raw - raw.mean(axis=0) - raw.mean(axis=1, keepdims=True) + raw.mean()
    if arms > 1:
        interaction *= math.sqrt((arms - 1) * (_FIT_SEEDS - 1) / float((interaction**2).sum()))
    return _FitDraws(
        difficulty=latin(_FIT_TASKS),
        training=latin(_FIT_TASKS),
        affinity=np.stack([latin(_FIT_TASKS) for _ in range(arms)]),
        seed=seed,
        run=seed_part + interaction,
    )


def _expected_moments(
    draws: _FitDraws, ckpt0_success: float, levels: np.ndarray, tasks: int, spreads: Mapping[str, float]
) -> np.ndarray:
    """``_moments`` of the model with ``spreads``, checkpoint 0 at ``ckpt0_success`` and each arm at its ``levels``."""
    base = float(stats.norm.ppf(ckpt0_success))
    difficulty = base + draws.difficulty
    training, affinity = spreads.get("training_by_task", 0.0), spreads.get("arm_by_task", 0.0)
    seed_shift, run_shift, noise = (spreads.get(k, 0.0) for k in ("seed_shift", "run_shift", "noise"))
    latent = (
        (difficulty + training * draws.training)[None, None, :]
        + affinity * draws.affinity[:, None, :]
        + (seed_shift * draws.seed)[None, :, None]
        + (run_shift * draws.run)[:, :, None]
    )
    # Each arm's offset: exact for normal latent scores, then two Newton steps on the draws themselves.
    spread = math.sqrt(1.0 + training**2 + affinity**2 + seed_shift**2 + run_shift**2 + noise**2)
    offset = stats.norm.ppf(levels) * spread - base
    for _ in range(2):
        scaled = (latent + offset[:, None, None]) / noise
        gap = special.ndtr(scaled).mean(axis=(1, 2)) - levels
        slope = np.exp(-0.5 * scaled**2).mean(axis=(1, 2)) / (math.sqrt(2 * math.pi) * noise)
        offset -= np.where(slope > 1e-9, gap / np.maximum(slope, 1e-9), 0.0)
    p = special.ndtr((latent + offset[:, None, None]) / noise)
    return _moments(p, difficulty > 0, tasks)


def _fit_structure(finals: np.ndarray, ckpt0: np.ndarray) -> Structure:
    arms, seeds, tasks = finals.shape
    ckpt0_success = float(np.clip(ckpt0.mean(), 0.5 / tasks, 1 - 0.5 / tasks))
    cells = seeds * tasks
    levels = np.clip(finals.mean(axis=(1, 2)), 0.5 / cells, 1 - 0.5 / cells)
    if arms > 1:
        free, used = list(_SPREADS), [0, 1, 2, 3, 4]
    else:
        free, used = ["training_by_task", "run_shift", "noise"], [0, 2, 3]
    observed = _moments(finals, ckpt0.astype(bool), tasks)[used]
    # Floors keep the log ratios finite when a statistic is 0: a share of one cell, a rate's binomial variance.
    level = float(levels.mean())
    floor = np.array([1.0 / (arms * cells)] * 3 + [level * (1 - level) / tasks] * 2)[used]
    draws = _fit_draws(arms)

    def residuals(x: np.ndarray) -> np.ndarray:
        spreads = dict(zip(free, np.exp(x), strict=True))
        simulated = _expected_moments(draws, ckpt0_success, levels, tasks, spreads)[used]
        return np.log((simulated + floor) / (observed + floor))

    default = Structure()
    start = np.log([max(getattr(default, name), 2 * _SPREAD_LOW) for name in free])
    bounds = (math.log(_SPREAD_LOW), math.log(_SPREAD_HIGH))
    fit = optimize.least_squares(residuals, start, bounds=bounds, xtol=1e-4, ftol=1e-6, max_nfev=_FIT_MAX_STEPS)
    spreads = {name: float(v) if v >= _SPREAD_ZERO else 0.0 for name, v in zip(free, np.exp(fit.x), strict=True)}
    return Structure(ckpt0_success=ckpt0_success, **{name: spreads.get(name, 0.0) for name in _SPREADS})
