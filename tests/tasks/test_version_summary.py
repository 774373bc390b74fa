"""The round summary carries the round's mechanism measurements, and MLflow gets them as metrics."""

import math

import pytest

from coevolve.config import PipelineConfig
from coevolve.records import RoundSummary
from coevolve.stages import VersionInput
from storage.warehouse import Warehouse
from tasks.version import build_summary, mechanism_metrics

OUTPUTS = {
    "round_": 0,
    "rollout": {"trajectories": 8, "tasks": 4, "success_rate": 0.5, "finish_reasons": {"stop": 8}},
    "mine": {"signals": {"boundary": 2, "rare": 1}, "selected": []},
    "validate": {"pool_size": 14, "accepted": 3, "rejected": 1, "rejections": {}},
    "update": {"checkpoint": "/ckpt/1", "stats": {"steps": 4}, "trained_on": {}},
    "evaluate": {"heldout_success": 0.25, "heldout_tasks": 4},
}
MECHANISM = {"informative_groups": 0.75, "heldout_coverage": 0.5, "accepted_by_kind": {"boundary": 2, "random": 1}}
CURRICULUM = {
    "episodes_played": 12,
    "groups_played": 4,
    "episodes_per_informative_group": 4.0,
    "calibration": 0.125,
    "difficulty_histogram": {"0.0-0.2": 1, "0.2-0.4": 0, "0.4-0.6": 3, "0.6-0.8": 0, "0.8-1.0": 0},
}


def summary(evaluate=None, mechanism=MECHANISM):
    outputs = {**OUTPUTS, "evaluate": {**OUTPUTS["evaluate"], **(evaluate or {})}}
    return build_summary(PipelineConfig(run_id="r"), VersionInput.model_validate(outputs), "flow-1", mechanism)


def test_the_summary_holds_the_mechanism_measurements_and_dev_success():
    s = summary({"dev_success": 0.4, "dev_tasks": 5})
    assert (s.informative_groups, s.heldout_coverage, s.accepted_by_kind, s.dev_success) == (
        0.75,
        0.5,
        {"boundary": 2, "random": 1},
        0.4,
    )


def test_without_a_dev_evaluation_or_measurements_the_fields_say_so():
    s = summary(mechanism=None)
    assert s.dev_success is None and s.accepted_by_kind == {}
    assert s.informative_groups is None and s.heldout_coverage is None
    assert s.episodes_played is None and s.calibration is None and s.difficulty_histogram == {}


def test_the_summary_holds_what_the_round_played_trained_and_estimated():
    s = summary(mechanism={**MECHANISM, **CURRICULUM})
    assert (s.episodes_played, s.groups_played, s.episodes_per_informative_group, s.optimizer_steps) == (12, 4, 4.0, 4)
    assert s.calibration == 0.125 and s.difficulty_histogram == CURRICULUM["difficulty_histogram"]


def test_mlflow_gets_the_curriculum_measurements_and_each_difficulty_bin():
    metrics = mechanism_metrics(summary(mechanism={**MECHANISM, **CURRICULUM, "calibration": math.nan}))
    assert metrics["mechanism.episodes_played"] == 12 and metrics["mechanism.optimizer_steps"] == 4
    assert metrics["mechanism.episodes_per_informative_group"] == 4.0 and "mechanism.calibration" not in metrics
    assert metrics["mechanism.difficulty.0.4-0.6"] == 3 and metrics["mechanism.difficulty.0.8-1.0"] == 0


def test_mlflow_gets_every_kind_of_accepted_candidate_and_the_mechanism_shares():
    assert mechanism_metrics(summary({"dev_success": 0.4})) == {
        "mechanism.informative_groups": 0.75,
        "mechanism.heldout_coverage": 0.5,
        "mechanism.optimizer_steps": 4.0,
        "dev_success": 0.4,
        "accepted.forgetting": 0.0,
        "accepted.boundary": 2.0,
        "accepted.rare": 0.0,
        "accepted.random": 1.0,
    }


def test_unmeasured_values_are_not_logged_as_metrics():
    metrics = mechanism_metrics(summary(mechanism={"informative_groups": math.nan, "heldout_coverage": 0.5}))
    assert "mechanism.informative_groups" not in metrics and "dev_success" not in metrics
    assert metrics["mechanism.heldout_coverage"] == 0.5


def test_summaries_round_trip_through_the_warehouse_and_old_ones_still_load(tmp_path):
    with Warehouse(tmp_path / "wh") as wh:
        wh.finish_round("r", 0, summary({"dev_success": 0.4}))
        wh.finish_round("r", 1, RoundSummary("r", 1, 14, 8, 0.5, {}, 0, 0, 0.3))  # measured nothing: None
        loaded = wh.rounds("r")
    assert loaded[0].accepted_by_kind == {"boundary": 2, "random": 1} and loaded[0].dev_success == pytest.approx(0.4)
    assert loaded[1].informative_groups is None and loaded[1].dev_success is None
    assert loaded[0] == summary({"dev_success": 0.4})  # records compare equal after a round trip
    old = {
        k: v
        for k, v in summary().to_dict().items()
        if k not in ("informative_groups", "heldout_coverage", "accepted_by_kind", "dev_success")
        and k not in CURRICULUM
        and k != "optimizer_steps"
    }
    assert RoundSummary(**old).heldout_coverage is None and RoundSummary(**old).optimizer_steps is None
