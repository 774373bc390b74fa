"""The report's success curves: by optimizer steps trained, a band of mean +- sd over seeds, one colour per arm,
lines that lie on each other marked, the y-axis from 0."""

import math

import matplotlib
import matplotlib.pyplot as plt
import pytest

from tasks.ablation.curves import success_band
from tasks.ablation.plots import ablation_curves, band_panel


@pytest.fixture(autouse=True)
def files_only():
    """Figures drawn to files, as the report draws them (no display)."""
    matplotlib.use("Agg")


def seed_run(arm, seed, heldout, steps=(10, 10), dev=None, baseline=0.16, baseline_dev=None):
    rounds = [
        {
            "round": i,
            "heldout_success": h,
            "dev_success": None if dev is None else dev[i],
            "optimizer_steps": s,
            "pool_size": 100 + i,
            "signals": {},
        }
        for i, (h, s) in enumerate(zip(heldout, steps, strict=True))
    ]
    rounds[0]["baseline_heldout_success"] = baseline
    return {"arm": arm, "seed": seed, "rounds": rounds, "baseline_dev_success": baseline_dev}


def test_the_band_is_placed_at_the_optimizer_steps_trained_after_each_round_from_checkpoint_0():
    band = success_band([seed_run("full", 1, [0.2, 0.3]), seed_run("full", 2, [0.4, 0.5])], "heldout")
    assert band.x == [0, 10, 20] and band.x_unit == "optimizer steps" and band.seeds == 2
    assert band.mean == pytest.approx([0.16, 0.3, 0.4])
    assert band.sd == pytest.approx([0.0, math.sqrt(0.02), math.sqrt(0.02)])


def test_one_seed_has_no_spread_and_a_seed_without_a_score_is_left_out_of_its_point():
    alone = success_band([seed_run("static", 1, [0.2, 0.3], dev=[0.1, 0.2], baseline_dev=0.1)], "dev")
    assert alone.sd == [0.0, 0.0, 0.0]
    scored, unscored = (seed_run("static", 1, [0.2, 0.3], dev=[0.1, 0.3], baseline_dev=0.1),
                        seed_run("static", 2, [0.2, 0.3], dev=[0.2, None], baseline_dev=0.1))  # fmt: skip
    band = success_band([scored, unscored], "dev")
    assert band.mean == pytest.approx([0.1, 0.15, 0.3]) and band.sd[2] == 0.0


def test_runs_recorded_before_step_counts_are_drawn_by_rounds_and_say_so():
    old = seed_run("full", 1, [0.2, 0.3], steps=(None, None))
    band = success_band([old], "heldout")
    assert band.x == [0, 1, 2] and band.x_unit == "rounds"


def test_an_arm_on_another_arms_line_is_dashed_and_named_in_the_legend_and_the_axis_starts_at_0():
    bands = {
        "full": success_band([seed_run("full", s, [0.2 + s / 10, 0.3]) for s in (1, 2)], "heldout"),
        "random": success_band([seed_run("random", s, [0.2 + s / 10, 0.3]) for s in (1, 2)], "heldout"),
        "static": success_band([seed_run("static", s, [0.25, 0.26]) for s in (1, 2)], "heldout"),
    }
    fig, axis = plt.subplots()
    try:
        band_panel(axis, bands, "held-out")
        labels = [text.get_text() for text in axis.get_legend().get_texts()]
        assert labels == ["full", "random (same line as full)", "static"]
        assert [line.get_linestyle() for line in axis.get_lines()] == ["-", "--", "-"]
        assert [line.get_color() for line in axis.get_lines()] == ["C0", "C1", "C2"]
        assert len(axis.collections) == 3  # one shaded band per arm
        assert axis.get_ylim()[0] == 0
        assert "mean +- sd over 2 seeds" in axis.get_title()
        assert axis.get_xlabel() == "optimizer steps trained (0: checkpoint 0)"
    finally:
        plt.close(fig)


def test_a_split_no_arm_was_scored_on_says_so_with_the_setting_to_change():
    fig, axis = plt.subplots()
    try:
        band_panel(axis, {"full": success_band([seed_run("full", 1, [0.2, 0.3])], "dev")}, "dev")
        assert axis.get_legend() is None
        assert [t.get_text() for t in axis.texts] == ["no dev evaluation\n(rollout.dev_eval_tasks = 0)"]
    finally:
        plt.close(fig)


def test_the_learning_curves_figure_is_written(tmp_path):
    results = [
        seed_run(arm, s, [0.2, 0.3], dev=[0.1, 0.2], baseline_dev=0.1) for arm in ("full", "static") for s in (1, 2)
    ]
    paths = ablation_curves(results, tmp_path)
    assert [p.name for p in paths] == ["learning_curves.png", "signal_mix.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
