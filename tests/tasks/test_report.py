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


def test_a_left_out_signal_is_reported_as_the_cost_of_leaving_it_out(tmp_path):
    without_rare = [run("no-rare", seed, [0.1, 0.25]) for seed in (1, 2, 3)]
    write_report(RESULTS + without_rare, tmp_path, "Ablation test")
    text = (tmp_path / "report.md").read_text()
    assert "what leaving that signal out costs" in text and "| no-rare | 3 | +0.073 |" in text
    write_report(RESULTS, tmp_path, "Ablation test")
    assert "leaving that signal out" not in (tmp_path / "report.md").read_text()


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


# --- mechanism per arm and round, and each arm against checkpoint 0 ---------------------------------


def mech_run(arm, seed, informative, coverage, accepted, dev=None, baseline=0.1, baseline_dev=None, heldout=(0.2, 0.3)):
    """A run whose round summaries carry the mechanism fields the version stage records."""
    r = run(arm, seed, list(heldout))
    for i, s in enumerate(r["rounds"]):
        s.update(informative_groups=informative[i], heldout_coverage=coverage[i], accepted_by_kind=accepted[i],
                 dev_success=None if dev is None else dev[i], baseline_heldout_success=baseline)
    r["baseline_dev_success"] = baseline_dev
    return r


MECH = [
    mech_run("full", 1, [0.5, 0.25], [0.4, 0.6], [{"boundary": 2, "random": 0}, {"rare": 1}], dev=[0.2, 0.4], baseline_dev=0.1),
    mech_run("full", 2, [0.25, 0.75], [0.4, 0.8], [{"boundary": 4}, {}], dev=[0.4, 0.6], baseline_dev=0.1),
    mech_run("random", 1, [0.0, 0.0], [0.4, 0.4], [{"random": 3}, {"random": 1}], heldout=(0.1, 0.1)),
    mech_run("random", 2, [0.5, float("nan")], [0.4, 0.4], [{"random": 5}, {"random": 1}], heldout=(0.1, 0.15)),
]


def test_mechanism_rows_are_means_over_seeds_per_round():
    rows = summarize(MECH)["mechanism"]["full"]
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[0]["informative"] == pytest.approx(0.375) and rows[1]["coverage"] == pytest.approx(0.7)
    assert rows[0]["accepted"] == {"forgetting": 0, "boundary": 3, "rare": 0, "random": 0}
    assert rows[1]["dev"] == pytest.approx(0.5) and rows[1]["heldout"] == pytest.approx(0.3)


def test_a_seed_without_a_measurement_is_left_out_of_the_mean():
    rows = summarize(MECH)["mechanism"]["random"]
    assert rows[1]["informative"] == 0.0
    assert math.isnan(rows[0]["dev"])


def test_summaries_written_before_the_mechanism_fields_render_as_not_available(tmp_path):
    write_report(RESULTS, tmp_path, "Old summaries")
    text = (tmp_path / "report.md").read_text()
    assert "| full | 0 | n/a | n/a | 1/2/3 | n/a | n/a | 0.100 |" in text
    assert (tmp_path / "mechanism.png").stat().st_size > 1000


def test_the_report_has_the_mechanism_table_and_figures(tmp_path):
    out = write_report(MECH, tmp_path, "Mechanism")
    text = (tmp_path / "report.md").read_text()
    assert "| full | 0 | 0.375 | 0.400 | 1/2/3 | 0/3/0/0 | 0.300 | 0.200 |" in text
    assert "| random | 1 | 0.000 | 0.400 | 1/2/3 | 0/0/0/1 | n/a | 0.125 |" in text
    names = {figure.split("/")[-1] for figure in out["figures"]}
    assert {"mechanism.png", "acceptance_by_kind.png"} <= names
    assert "![mechanism](mechanism.png)" in text


def test_the_dev_curve_starts_at_checkpoint_0_when_it_was_scored():
    from tasks.report import dev_curve

    assert dev_curve(MECH[:2]) == ([0, 1, 2], pytest.approx([0.1, 0.3, 0.5]))
    x, y = dev_curve(MECH[2:])
    assert x == [1, 2] and all(math.isnan(v) for v in y)


def test_each_arm_is_tested_against_checkpoint_0_one_sample_when_it_is_shared():
    tests = summarize(MECH)["ckpt0_tests"]
    assert tests["full"]["kind"] == "one-sample" and tests["full"]["n"] == 2
    assert tests["full"]["mean_diff"] == pytest.approx(0.2) and tests["full"]["ckpt0"] == pytest.approx(0.1)
    assert tests["random"]["mean_diff"] == pytest.approx(0.025)


def test_the_checkpoint_0_test_is_the_seed_paired_t_test_of_the_gains():
    from scipy import stats

    runs = [mech_run("full", s, [0.5] * 2, [0.5] * 2, [{}] * 2, baseline=b, heldout=(0.3, f)) for s, b, f in ((1, 0.1, 0.3), (2, 0.2, 0.35), (3, 0.1, 0.2))]
    test = summarize(runs)["ckpt0_tests"]["full"]
    assert test["kind"] == "paired"
    assert test["p"] == pytest.approx(stats.ttest_1samp([0.2, 0.15, 0.1], 0.0).pvalue)


def test_runs_without_a_checkpoint_0_score_are_not_tested_against_it(tmp_path):
    test = summarize(RESULTS)["ckpt0_tests"]["full"]
    assert test["n"] == 0 and math.isnan(test["p"])
    write_report(RESULTS, tmp_path, "No baseline")
    assert "| full | n/a | 0 | n/a | n/a | n/a | n/a | n/a |" in (tmp_path / "report.md").read_text()


def test_checkpoint_0_is_compared_task_by_task_when_its_outcomes_are_stored(tmp_path):
    results = [dict(r, heldout_outcomes={"t1": True, "t2": True, "t3": False}, baseline_outcomes={"t1": False, "t2": True, "t3": True}) for r in MECH]
    summary = summarize(results)
    assert summary["ckpt0_task_tests"]["full"] == {"pairs": 6, "a_only": 2, "b_only": 2, "p": pytest.approx(1.0)}
    write_report(results, tmp_path, "Task level")
    text = (tmp_path / "report.md").read_text()
    assert "## Learning at all: each arm against checkpoint 0" in text
    assert "| random | 6 | 2 | 2 | 1.000 |" in text
