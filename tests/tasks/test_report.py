"""Ablation report: per-arm mean +- sd, two families of tested comparisons with Holm, and the files a reader opens."""

import math
from pathlib import Path

import pytest
from statsmodels.stats.multitest import multipletests

from tasks.ablation.curves import success_band
from tasks.ablation.inference import two_way_test
from tasks.ablation.report import read_per_run_table, seed_level_recheck, write_report
from tasks.ablation.report_summary import summarize


def run(arm, seed, heldout, pool=(110, 120), official=0.0):
    rounds = [
        {
            "round": i,
            "heldout_success": h,
            "pool_size": p,
            "accepted": 5,
            "rejected": 5,
            "signals": {"forgetting": 1, "boundary": 2, "rare": 3},
        }
        for i, (h, p) in enumerate(zip(heldout, pool, strict=True))
    ]
    return {
        "arm": arm,
        "seed": seed,
        "run_id": f"a-{arm}-s{seed}",
        "rounds": rounds,
        "official": {"multi_turn_base": official},
    }


RESULTS = [
    run("full", 1, [0.1, 0.30]),
    run("full", 2, [0.1, 0.32]),
    run("full", 3, [0.1, 0.35]),
    run("static", 1, [0.1, 0.10], pool=(100, 100)),
    run("static", 2, [0.1, 0.14], pool=(100, 100)),
    run("static", 3, [0.1, 0.12], pool=(100, 100)),
]


def test_arms_report_mean_and_sd_of_final_heldout_success():
    arms = summarize(RESULTS)["arms"]
    mean, sd = arms["full"]["heldout"]
    assert math.isclose(mean, (0.30 + 0.32 + 0.35) / 3)
    assert math.isclose(sd, 0.025166, rel_tol=1e-3)
    assert arms["static"]["final_pool"][0] == 100


def test_runs_without_per_task_outcomes_get_the_mean_difference_over_seeds_and_no_p_value():
    test = summarize(RESULTS)["tests"]["static"]
    assert test["seeds"] == 3 and test["tasks"] == 0 and test["mean_diff"] == pytest.approx((0.20 + 0.18 + 0.23) / 3)
    assert math.isnan(test["p"]) and math.isnan(test["p_holm"])


def test_the_report_is_markdown_with_its_figures(tmp_path):
    out = write_report(RESULTS, tmp_path, "Ablation test")
    text = (tmp_path / "report.md").read_text()
    assert "| full | 0.323 +- 0.025 |" in text
    assert "| static | 3 | 0 | +0.203 | n/a | n/a | n/a (no per-task outcomes) | n/a (no per-task outcomes) |" in text
    for figure in out["figures"]:
        assert figure.endswith(".png") and (tmp_path / figure.split("/")[-1]).stat().st_size > 1000


def test_an_environment_without_an_official_benchmark_gets_a_report_that_says_so(tmp_path):
    """The workplace has no official splits: its runs carry no official scores, and the column says there are none."""
    results = [{**r, "official": {}} for r in RESULTS]
    write_report(results, tmp_path, "Ablation test")
    text = (tmp_path / "report.md").read_text()
    assert "| official benchmark (none) |" in text
    assert "| full | 0.323 +- 0.025 | n/a |" in text
    write_report(RESULTS, tmp_path, "Ablation test")
    assert "| official multi_turn_base |" in (tmp_path / "report.md").read_text()


def test_a_left_out_signal_is_reported_as_the_cost_of_leaving_it_out(tmp_path):
    without_rare = [run("no-rare", seed, [0.1, 0.25]) for seed in (1, 2, 3)]
    write_report(RESULTS + without_rare, tmp_path, "Ablation test")
    text = (tmp_path / "report.md").read_text()
    assert "what leaving that signal out costs" in text and "| no-rare | 3 | 0 | +0.073 |" in text
    write_report(RESULTS, tmp_path, "Ablation test")
    assert "leaving that signal out" not in (tmp_path / "report.md").read_text()


def outcomes_run(arm, seed, solved, baseline_solved, tasks=12):
    """A run scored task by task: its final checkpoint solves the first ``solved`` tasks, checkpoint 0 the first
    ``baseline_solved``."""
    r = run(arm, seed, [0.1, solved / tasks])
    r["rounds"][0]["baseline_heldout_success"] = baseline_solved / tasks
    r |= {
        "heldout_outcomes": {f"t{i:02d}": i < solved for i in range(tasks)},
        "baseline_outcomes": {f"t{i:02d}": i < baseline_solved for i in range(tasks)},
        "heldout_size": tasks,
        "heldout_digest": "abc123",
        "tested_split": "final-heldout",
    }
    return r


SCORED = [
    *(outcomes_run("full", s, 6 + s % 2, 3) for s in (1, 2, 3)),
    *(outcomes_run("static", s, 3 + s % 2, 3) for s in (1, 2, 3)),
    *(outcomes_run("random", s, 5 + s % 3, 3) for s in (1, 2, 3)),
]


def test_each_comparison_is_the_two_way_test_on_the_runs_task_outcomes():
    summary = summarize(SCORED)
    full = {r["seed"]: r["heldout_outcomes"] for r in SCORED if r["arm"] == "full"}
    static = {r["seed"]: r["heldout_outcomes"] for r in SCORED if r["arm"] == "static"}
    assert summary["tests"]["static"]["p"] == pytest.approx(two_way_test(full, static)["p"])
    assert summary["tests"]["static"]["tasks"] == 12 and summary["tests"]["static"]["mean_diff"] == pytest.approx(
        3 / 12
    )
    assert summary["ckpt0_tests"]["full"]["p"] == pytest.approx(two_way_test(full, SCORED[0]["baseline_outcomes"])["p"])


def test_every_family_is_holm_corrected_on_its_own():
    summary = summarize(SCORED)
    for family in (summary["tests"], summary["ckpt0_tests"]):
        raw = [t["p"] for t in family.values()]
        assert [t["p_holm"] for t in family.values()] == pytest.approx(list(multipletests(raw, method="holm")[1]))
    assert len(summary["tests"]) == 2 and len(summary["ckpt0_tests"]) == 3


def test_the_report_prints_raw_and_adjusted_p_values_the_split_and_the_detectable_effect(tmp_path):
    out = write_report(SCORED, tmp_path, "Scored", power_draws=20)
    text = (tmp_path / "report.md").read_text()
    static, full0 = out["tests"]["static"], out["ckpt0_tests"]["full"]
    static_row = (
        f"| static | 3 | 12 | {static['mean_diff']:+.3f} | {static['se']:.3f} | {static['t']:.2f} "
        f"| {static['p']:.3f} | {static['p_holm']:.3f} |"
    )
    assert static_row in text
    assert f"| full | 3 | 12 | 0.250 | {full0['final']:.3f} | {full0['mean_diff']:+.3f} |" in text
    assert "### Family 1: `full` against each arm without the curriculum (2 comparisons, Holm)" in text
    assert "### Family 2: each arm against checkpoint 0 (3 comparisons, Holm)" in text
    assert "final held-out split: 12 tasks, pool digest `abc123`" in text
    assert out["heldout_split"] == {"size": 12, "digest": "abc123", "split": "final-heldout"}
    assert "detects with 80% power is" in text and set(out["detectable_effect"]) == {"arm", "ckpt0"}


def test_the_learning_curve_starts_at_checkpoint_0_when_its_score_was_recorded():
    runs = [run("full", 1, [0.2, 0.3]), run("full", 2, [0.4, 0.5])]
    band = success_band(runs, "heldout")
    assert (band.x, band.mean) == ([1, 2], pytest.approx([0.3, 0.4]))
    for r, baseline in zip(runs, (0.1, 0.2), strict=True):
        r["rounds"][0]["baseline_heldout_success"] = baseline
    band = success_band(runs, "heldout")
    assert (band.x, band.mean) == ([0, 1, 2], pytest.approx([0.15, 0.3, 0.4]))


# --- mechanism per arm and round, and each arm against checkpoint 0 ---------------------------------


def mech_run(arm, seed, informative, coverage, accepted, dev=None, baseline=0.1, baseline_dev=None, heldout=(0.2, 0.3)):
    """A run whose round summaries carry the mechanism fields the version stage records."""
    r = run(arm, seed, list(heldout))
    for i, s in enumerate(r["rounds"]):
        s.update(
            informative_groups=informative[i],
            heldout_coverage=coverage[i],
            accepted_by_kind=accepted[i],
            dev_success=None if dev is None else dev[i],
            baseline_heldout_success=baseline,
        )
    r["baseline_dev_success"] = baseline_dev
    return r


MECH = [
    mech_run(
        "full",
        1,
        [0.5, 0.25],
        [0.4, 0.6],
        [{"boundary": 2, "random": 0}, {"rare": 1}],
        dev=[0.2, 0.4],
        baseline_dev=0.1,
    ),
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
    band = success_band(MECH[:2], "dev")
    assert (band.x, band.mean) == ([0, 1, 2], pytest.approx([0.1, 0.3, 0.5]))
    unscored = success_band(MECH[2:], "dev")
    assert unscored.x == [1, 2] and all(math.isnan(v) for v in unscored.mean)


def test_each_arm_is_compared_with_checkpoint_0_by_its_mean_gain():
    tests = summarize(MECH)["ckpt0_tests"]
    assert tests["full"]["seeds"] == 2 and tests["full"]["ckpt0"] == pytest.approx(0.1)
    assert tests["full"]["mean_diff"] == pytest.approx(0.2) and tests["random"]["mean_diff"] == pytest.approx(0.025)
    assert math.isnan(tests["full"]["p"])  # no per-task outcomes stored


def test_runs_without_a_checkpoint_0_score_are_not_compared_with_it(tmp_path):
    test = summarize(RESULTS)["ckpt0_tests"]["full"]
    assert test["seeds"] == 0 and math.isnan(test["p"])
    write_report(RESULTS, tmp_path, "No baseline")
    assert (
        "| full | 0 | 0 | n/a | n/a | n/a | n/a | n/a | n/a (no per-task outcomes) |"
        in (tmp_path / "report.md").read_text()
    )


def test_the_seed_level_recheck_of_the_30_run_report_holm_corrects_both_families():
    text = (Path(__file__).parents[2] / "docs" / "history" / "ablation_report_6arms_5seeds.md").read_text()
    runs = read_per_run_table(text)
    assert len(runs) == 30 and runs[("no-boundary", 4)] == (0.19, 0.25)
    lines = seed_level_recheck(runs)
    assert "| static | 5 | +0.036 | 3.67 | 0.021 | 0.107 |" in lines  # against checkpoint 0, Holm over six arms
    assert "| no-boundary | 5 | +0.040 | 5.66 | 0.005 | 0.029 |" in lines
    assert "| no-boundary | 5 | -0.022 | -3.32 | 0.029 | 0.147 |" in lines  # full against it, Holm over five


# --- the curriculum arms: their families, compute per arm, and the curriculum's mechanism -----------------


CURRICULUM = [
    outcomes_run(arm, s, solved + s % 2, 3)
    for arm, solved in (("static+learnability", 2), ("random+learnability", 8), ("full+learnability", 9))
    for s in (1, 2, 3, 4, 5)
]


def test_full_is_compared_with_arms_without_the_curriculum_and_full_learnability_with_the_curriculum_arms():
    summary = summarize(SCORED + [outcomes_run(r["arm"], r["seed"], 6, 3) for r in CURRICULUM if r["seed"] <= 3])
    assert list(summary["tests"]) == ["static", "random"]
    assert list(summary["curriculum_arm_tests"]) == ["static+learnability", "random+learnability"]
    assert list(summary["curriculum_tests"]) == ["static", "random", "full"]
    assert len(summary["ckpt0_tests"]) == 6


def test_curriculum_on_vs_off_tests_each_curriculum_arm_against_its_base_arm_holm_over_that_family():
    on = [outcomes_run(f"{r['arm']}+learnability", r["seed"], 9, 3) for r in SCORED]
    family = summarize(SCORED + on)["curriculum_tests"]
    by_seed = {arm: {r["seed"]: r["heldout_outcomes"] for r in SCORED + on if r["arm"] == arm} for arm in ("full",
               "full+learnability")}  # fmt: skip
    assert family["full"]["p"] == pytest.approx(two_way_test(by_seed["full+learnability"], by_seed["full"])["p"])
    assert [t["p_holm"] for t in family.values()] == pytest.approx(
        list(multipletests([t["p"] for t in family.values()], method="holm")[1])
    )


def test_families_whose_arms_are_absent_are_left_out(tmp_path):
    summary = summarize(CURRICULUM)
    assert summary["tests"] == {} and summary["curriculum_tests"] == {}
    write_report(SCORED, tmp_path, "No curriculum", power_draws=20)
    text = (tmp_path / "report.md").read_text()
    # Families 1, 2 and 5 (random against static); no per-round outcomes, so no step-matched family 6.
    assert "3 families of comparisons" in text and "Family 5" in text
    assert not any(f"Family {n}" in text for n in (3, 4, 6))


def test_the_report_states_which_comparisons_are_significant_after_holm(tmp_path):
    out = write_report(CURRICULUM, tmp_path, "Curriculum", power_draws=20)
    text = (tmp_path / "report.md").read_text()
    family = out["curriculum_arm_tests"]
    assert family["static+learnability"]["p_holm"] < 0.05 <= family["random+learnability"]["p_holm"]
    assert "### Family 3: `full+learnability` against the other curriculum arms (2 comparisons, Holm)" in text
    assert (
        "Significant at 0.05 after Holm: `full+learnability` vs `static+learnability` (+0.583, p (Holm) 0.016). "
        "Not significant: `full+learnability` vs `random+learnability`." in text
    )


def test_each_arm_prints_its_episodes_played_and_optimizer_steps_summed_over_rounds_mean_over_seeds(tmp_path):
    runs = [run("full", 1, [0.1, 0.3]), run("full", 2, [0.1, 0.3]), run("static", 1, [0.1, 0.1])]
    for r, episodes in zip(runs, (140, 144, 144), strict=True):
        for s in r["rounds"]:
            s.update(episodes_played=episodes, optimizer_steps=4)
    del runs[2]["rounds"][1]["optimizer_steps"]  # a round that did not record it: the run's total is unknown
    arms = summarize(runs)["arms"]
    assert arms["full"]["episodes"] == 284 and arms["full"]["optimizer_steps"] == 8
    assert arms["static"]["episodes"] == 288 and math.isnan(arms["static"]["optimizer_steps"])
    write_report(runs, tmp_path, "Compute")
    text = (tmp_path / "report.md").read_text()
    assert "| 4/8/12 | 284 | 8 |" in text and "| 2/4/6 | 288 | n/a |" in text


def test_the_curriculum_mechanism_is_tabulated_per_round_and_drawn(tmp_path):
    histogram = {"0.0-0.2": 2, "0.2-0.4": 1, "0.4-0.6": 0, "0.6-0.8": 0, "0.8-1.0": 1}
    runs = [run("full+learnability", s, [0.1, 0.3]) for s in (1, 2)]
    for r, calibration in zip(runs, (0.1, 0.3), strict=True):
        for s in r["rounds"]:
            s.update(informative_groups=0.5, episodes_played=144, groups_played=24,
                     episodes_per_informative_group=12.0, calibration=calibration,
                     difficulty_histogram={**histogram, "0.0-0.2": histogram["0.0-0.2"] + r["seed"]})  # fmt: skip
    out = write_report(runs + [run("full", 1, [0.1, 0.2])], tmp_path, "Curriculum mechanism")
    text = (tmp_path / "report.md").read_text()
    assert "| full+learnability | 1 | 0.500 | n/a | 1/2/3 | n/a | n/a | 0.300 | 144.0 | 24.0 | 12.00 | 0.200 |" in text
    assert "| full+learnability | 3.5 | 1.0 | 0.0 | 0.0 | 1.0 |" in text  # the final round's pool, mean over seeds
    assert "| full | " not in text.split("Pool of the final round")[1]  # no estimates: no row
    assert (tmp_path / "curriculum.png").stat().st_size > 1000 and str(tmp_path / "curriculum.png") in out["figures"]
