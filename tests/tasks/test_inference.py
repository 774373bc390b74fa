"""The ablation's tests: calibrated under a simulated null with the experiment's structure, with known power, Holm
per family."""

import math

import numpy as np
import pytest

from tasks.ablation.inference import (
    Structure,
    detectable_effect,
    holm,
    outcome_matrix,
    pooled_mcnemar_array_test,
    rejection_rates,
    seed_level_array_test,
    simulate_experiment,
    two_way_array_test,
    two_way_test,
)

# The size of the 30-run ablation in docs/history/ablation_report_6arms_5seeds.md: 5 seeds, 100 held-out tasks.
SEEDS, TASKS = 5, 100
NULL_DRAWS = 2000


def test_the_simulation_has_the_structure_of_the_measured_ablation():
    """Checkpoint 0 near 0.19; a final checkpoint differs from it, and from another arm's, on about 10% of tasks;
    seeds vary by about 0.03."""
    rng = np.random.default_rng(7)
    draws = [simulate_experiment(rng, SEEDS, TASKS) for _ in range(300)]
    assert np.mean([ckpt0.mean() for _, _, ckpt0 in draws]) == pytest.approx(0.19, abs=0.02)
    assert np.mean([b.mean() for _, b, _ in draws]) == pytest.approx(
        0.19, abs=0.02
    )  # trained arms as good as checkpoint 0: the null
    assert np.mean([(a != ckpt0).mean() for a, _, ckpt0 in draws]) == pytest.approx(0.10, abs=0.02)
    assert np.mean([(a != b).mean() for a, b, _ in draws]) == pytest.approx(0.10, abs=0.02)
    assert np.mean([a.mean(axis=1).std(ddof=1) for a, _, _ in draws]) == pytest.approx(0.03, abs=0.01)


@pytest.mark.parametrize(
    "structure",
    [
        Structure(),
        pytest.param(Structure(seed_shift=0.1, run_shift=0.2), marks=pytest.mark.slow),
    ],
    ids=["measured", "larger-seed-shifts"],
)
def test_the_two_way_test_rejects_at_most_6_percent_under_the_null(structure):
    rates = rejection_rates(two_way_array_test, NULL_DRAWS, SEEDS, TASKS, structure=structure)
    assert rates["arm"] <= 0.06 and rates["ckpt0"] <= 0.06, rates


def test_the_pooled_mcnemar_test_the_report_used_before_rejects_far_more_than_alpha_under_the_null():
    rates = rejection_rates(pooled_mcnemar_array_test, NULL_DRAWS, SEEDS, TASKS)
    assert rates["arm"] > 0.12 and rates["ckpt0"] > 0.2, rates  # measured: 0.20 and 0.32


@pytest.mark.slow
def test_a_t_test_over_seeds_with_the_tasks_held_fixed_rejects_too_often_against_checkpoint_0():
    rates = rejection_rates(seed_level_array_test, NULL_DRAWS, SEEDS, TASKS)
    assert rates["ckpt0"] > 0.12, rates  # measured: 0.19; the report does not use it


def test_power_against_a_known_effect_grows_with_the_held_out_split():
    small = rejection_rates(two_way_array_test, 300, SEEDS, TASKS, effect=0.06, seed=1)
    large = rejection_rates(two_way_array_test, 300, SEEDS, 500, effect=0.06, seed=1)
    assert large["arm"] >= 0.75 and large["ckpt0"] >= 0.75, large
    assert small["arm"] < large["arm"] - 0.2 and small["ckpt0"] < large["ckpt0"] - 0.2, small


def test_the_detectable_effect_is_the_smallest_effect_with_80_percent_power():
    found = detectable_effect(SEEDS, 500, draws=200, step=0.02)
    assert 0.02 < found["arm"] <= 0.1 and 0.02 < found["ckpt0"] <= 0.1
    below = rejection_rates(
        two_way_array_test, 200, SEEDS, 500, effect=found["arm"] - 0.02, seed=int(round((found["arm"] - 0.02) * 1000))
    )
    assert below["arm"] < 0.8


def test_two_seeds_of_four_tasks_detect_nothing_up_to_the_largest_effect_tried():
    assert all(math.isnan(v) for v in detectable_effect(2, 4, draws=20, step=0.1).values())


def test_a_difference_on_every_seed_and_many_tasks_is_significant_and_identical_arms_are_not():
    tasks = [f"t{i}" for i in range(40)]
    full = {s: {t: i % 2 == 0 or i == s for i, t in enumerate(tasks)} for s in range(1, 6)}
    other = {s: {t: i % 4 == 0 for i, t in enumerate(tasks)} for s in range(1, 6)}
    result = two_way_test(full, other)
    assert (result["seeds"], result["tasks"]) == (5, 40) and result["mean_diff"] == pytest.approx(0.25 + 3 / 200)
    assert result["p"] < 0.05
    assert two_way_test(full, full)["p"] == 1.0


def test_checkpoint_0_is_one_outcome_per_task_repeated_for_every_seed():
    final = {1: {"a": True, "b": False}, 2: {"a": True, "b": True}}
    left, right = outcome_matrix(final, {"a": False, "b": False, "c": True})
    assert left.tolist() == [[1.0, 0.0], [1.0, 1.0]] and right.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_only_seeds_and_tasks_both_sides_have_are_compared():
    left, right = outcome_matrix(
        {1: {"a": True, "b": True}, 2: {"a": False}}, {1: {"a": False}, 2: {"a": True}, 3: {"a": True}}
    )
    assert left.tolist() == [[1.0], [0.0]] and right.tolist() == [[0.0], [1.0]]


def test_a_single_seed_cannot_be_tested():
    assert math.isnan(two_way_test({1: {"a": True, "b": False}}, {1: {"a": False, "b": False}})["p"])


def test_holm_adjusts_within_a_family_and_leaves_untestable_comparisons_out():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan})
    assert (
        adjusted["a"] == pytest.approx(0.03)
        and adjusted["c"] == pytest.approx(0.06)
        and adjusted["b"] == pytest.approx(0.06)
    )
    assert math.isnan(adjusted["d"])
