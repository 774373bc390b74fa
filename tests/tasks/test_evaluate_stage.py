"""Plain functions of the evaluation stage: split names, split contents, where rows are stored."""

from pathlib import Path

import pytest

from coevolve.config import EnvironmentConfig, PipelineConfig
from coevolve.errors import ConfigError
from envs.bfcl.explorer import build_tasks
from tasks.common import open_warehouse
from tasks.evaluate import (
    category_name,
    default_categories,
    evaluate_checkpoint,
    evaluate_splits,
    evaluation_round,
    split_tasks,
)
from tasks.splits import DEV_SPLIT, EXTERNAL_ROUND, HELDOUT_ROUND, HELDOUT_SPLIT

SHIPPED_CHECKPOINT = Path(__file__).resolve().parents[2] / "envs" / "bfcl" / "checkpoint0"


def test_short_and_full_category_names_are_accepted():
    bfcl = EnvironmentConfig()
    assert category_name(bfcl, "base") == category_name(bfcl, "multi_turn_base") == "multi_turn_base"
    assert category_name(bfcl, "long_context") == "multi_turn_long_context"


def test_the_environment_names_the_categories_scored_by_default():
    # BFCL's: the paper's protocol, all of multi_turn_base.
    assert default_categories(EnvironmentConfig()) == ("multi_turn_base",)


def test_unknown_category_fails_naming_the_choices():
    with pytest.raises(ConfigError, match="multi_turn_miss_func"):
        category_name(EnvironmentConfig(), "simple")


def test_official_split_holds_every_entry_of_the_category_in_order(tmp_path):
    config = PipelineConfig(state_dir=tmp_path)
    with open_warehouse(config) as wh:
        tasks = split_tasks(config, wh, "multi_turn_miss_param")
        first_two = split_tasks(config, wh, "multi_turn_base", limit=2)
    assert len(tasks) == 200 and tasks[0].description == "multi_turn_miss_param_0"
    assert [t.description for t in first_two] == ["multi_turn_base_0", "multi_turn_base_1"]


def test_checkpoint_from_outside_the_run_is_stored_under_the_external_round(tmp_path):
    config = PipelineConfig(state_dir=tmp_path)
    with open_warehouse(config) as wh:
        assert evaluation_round(config, wh, str(tmp_path / "elsewhere")) == EXTERNAL_ROUND


def test_checkpoint_zero_is_stored_under_the_heldout_round(tmp_path):
    config = PipelineConfig(state_dir=tmp_path)
    with open_warehouse(config) as wh:
        wh.mark_stage(config.run_id, 0, "prepare", {"checkpoint": str(tmp_path / "ckpt0")})
        assert evaluation_round(config, wh, str(tmp_path / "ckpt0")) == HELDOUT_ROUND


def test_a_run_without_heldout_or_dev_tasks_loads_no_model(tmp_path):
    """Every split empty: nothing is played, so no model load (nor a managed server start) is paid for."""
    config = PipelineConfig(state_dir=tmp_path)
    missing = str(tmp_path / "no-such-checkpoint")
    with open_warehouse(config) as wh:
        assert evaluate_splits(config, wh, missing, {HELDOUT_SPLIT: [], DEV_SPLIT: []}, 0) == {
            HELDOUT_SPLIT: 0.0,
            DEV_SPLIT: 0.0,
        }
        with pytest.raises(OSError):  # with a task to play, the missing checkpoint is loaded and fails
            evaluate_splits(config, wh, missing, {HELDOUT_SPLIT: build_tasks(1, seed=0)}, 0)


def test_splits_played_together_store_what_each_split_played_alone_stores(tmp_path):
    config = PipelineConfig(state_dir=tmp_path, rollout={"eval_generate_batch": 8})
    splits = {HELDOUT_SPLIT: build_tasks(3, seed=0), DEV_SPLIT: build_tasks(2, seed=1)}
    with open_warehouse(config) as wh:
        together = evaluate_splits(config, wh, str(SHIPPED_CHECKPOINT), splits, 0)
        alone = {
            split: evaluate_checkpoint(config, wh, str(SHIPPED_CHECKPOINT), tasks, 1, split)
            for split, tasks in splits.items()
        }
        for split, tasks in splits.items():
            outcomes = wh.evaluation_outcomes(config.run_id, 0, split)
            assert list(outcomes) == [task.task_id for task in tasks]
            assert outcomes == wh.evaluation_outcomes(config.run_id, 1, split)
    assert together == alone
