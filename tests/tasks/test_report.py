"""Ablation report: per-arm mean +- sd, paired tests by seed, and the files a reader opens."""

import math

import pytest

from tasks.report import heldout_curve, paired_test, summarize, task_level_test, write_report


def run(arm, seed, heldout, pool=(110, 120), official=0.0):
    rounds = [
        {"round": i, "heldout_success": h, "pool_size": p, "accepted": 5, "rejected": 5, "signals": {"forgetting": 1, "boundary": 2, "rare": 3}}
        for i, (h, p) in enumerate(zip(heldout, pool))
    ]
    return {"arm": arm, "seed": seed, "run_id": f"a-{arm}-s{seed}", "rounds": rounds, "official": {"multi_turn_base": official}}


RESULTS = [
    run("full", 1, [0.1, 0.30]), run("full", 2, [0.1, 0.32]), run("full", 3, [0.1, 0.35]),
    run("static", 1, [0.1, 0.10], pool=(100, 100)), run("static", 2, [0.1, 0.14], pool=(100, 100)), run("static", 3, [0.1, 0.12], pool=(100, 100)),
]


def test_arms_report_mean_and_sd_of_final_heldout_success():
    arms = summarize(RESULTS)["arms"]
    mean, sd = arms["full"]["heldout"]
    assert math.isclose(mean, (0.30 + 0.32 + 0.35) / 3)
    assert math.isclose(sd, 0.025166, rel_tol=1e-3)
    assert arms["static"]["final_pool"][0] == 100


def test_the_same_gap_on_every_seed_has_no_p_value_rather_than_p_zero():
    result = paired_test({1: 0.04, 2: 0.06, 3: 0.04}, {1: 0.06, 2: 0.08, 3: 0.06})
    assert math.isnan(result["p"]) and math.isnan(result["t"])
    assert result["mean_diff"] == pytest.approx(-0.02)


def test_paired_test_pairs_by_seed_and_finds_a_consistent_gap():
    test = summarize(RESULTS)["tests"]["static"]
    assert test["n"] == 3 and test["mean_diff"] > 0.15 and test["p"] < 0.05


def test_identical_arms_give_no_evidence():
    assert paired_test({1: 0.2, 2: 0.3}, {1: 0.2, 2: 0.3})["p"] == 1.0


def test_a_single_seed_cannot_be_tested():
    assert math.isnan(paired_test({1: 0.2}, {1: 0.1})["p"])


def test_the_report_is_markdown_with_its_figures(tmp_path):
    out = write_report(RESULTS, tmp_path, "Ablation test")
    text = (tmp_path / "report.md").read_text()
    assert "| full | 0.323 +- 0.025 |" in text
    assert "| static | 3 | +0.203 |" in text
    for figure in out["figures"]:
        assert figure.endswith(".png") and (tmp_path / figure.split("/")[-1]).stat().st_size > 1000


def test_task_level_test_counts_discordant_pairs_over_seeds():
    full = {1: {"a": True, "b": True, "c": False}, 2: {"a": True, "b": False, "c": False}}
    other = {1: {"a": False, "b": True, "c": False}, 2: {"a": False, "b": False, "c": True}, 3: {"a": True}}
    result = task_level_test(full, other)
    assert (result["pairs"], result["a_only"], result["b_only"]) == (6, 2, 1)
    assert result["p"] == pytest.approx(1.0)


def test_a_one_sided_task_level_gap_is_significant():
    full = {s: {f"t{i}": True for i in range(5)} for s in (1, 2)}
    other = {s: {f"t{i}": False for i in range(5)} for s in (1, 2)}
    assert task_level_test(full, other)["p"] == pytest.approx(2 * 0.5**10)


def test_the_report_adds_the_task_level_table_when_runs_carry_outcomes(tmp_path):
    results = [dict(r, heldout_outcomes={"t1": r["arm"] == "full", "t2": True}) for r in RESULTS]
    out = write_report(results, tmp_path, "Ablation test")
    assert out["task_tests"]["static"]["a_only"] == 3
    assert "| static | 6 | 3 | 0 | 0.250 |" in (tmp_path / "report.md").read_text()


def test_the_learning_curve_starts_at_checkpoint_0_when_its_score_was_recorded():
    runs = [run("full", 1, [0.2, 0.3]), run("full", 2, [0.4, 0.5])]
    assert heldout_curve(runs) == ([1, 2], pytest.approx([0.3, 0.4]))
    for r, baseline in zip(runs, (0.1, 0.2)):
        r["rounds"][0]["baseline_heldout_success"] = baseline
    assert heldout_curve(runs) == ([0, 1, 2], pytest.approx([0.15, 0.3, 0.4]))
