"""Plain functions of the evaluation stage: split names, split contents, where rows are stored."""

import pytest

from coevolve.errors import ConfigError


def test_short_and_full_category_names_are_accepted():
    from tasks.evaluate import category_name

    assert category_name("base") == category_name("multi_turn_base") == "multi_turn_base"
    assert category_name("long_context") == "multi_turn_long_context"


def test_unknown_category_fails_naming_the_choices():
    from tasks.evaluate import category_name

    with pytest.raises(ConfigError, match="multi_turn_miss_func"):
        category_name("simple")


def test_official_split_holds_every_entry_of_the_category_in_order(tmp_path):
    from coevolve.config import PipelineConfig
    from tasks.evaluate import split_tasks

    config = PipelineConfig(state_dir=tmp_path)
    tasks = split_tasks(config, "multi_turn_miss_param")
    assert len(tasks) == 200 and tasks[0].description == "multi_turn_miss_param_0"
    assert [t.description for t in split_tasks(config, "multi_turn_base", limit=2)] == ["multi_turn_base_0", "multi_turn_base_1"]


def test_checkpoint_from_outside_the_run_is_stored_under_the_external_round(tmp_path):
    from coevolve.config import PipelineConfig
    from tasks.evaluate import EXTERNAL_ROUND, evaluation_round

    assert evaluation_round(PipelineConfig(state_dir=tmp_path), str(tmp_path / "elsewhere")) == EXTERNAL_ROUND


def test_checkpoint_zero_is_stored_under_the_heldout_round(tmp_path):
    from coevolve.config import PipelineConfig
    from tasks.common import HELDOUT_ROUND, open_warehouse
    from tasks.evaluate import evaluation_round

    config = PipelineConfig(state_dir=tmp_path)
    with open_warehouse(config) as wh:
        wh.mark_stage(config.run_id, 0, "prepare", {"checkpoint": str(tmp_path / "ckpt0")})
    assert evaluation_round(config, str(tmp_path / "ckpt0")) == HELDOUT_ROUND


def test_no_dev_tasks_are_scored_unless_asked_for(tmp_path):
    from coevolve.config import PipelineConfig
    from tasks.common import open_warehouse
    from tasks.evaluate import dev_eval_tasks

    config = PipelineConfig(state_dir=tmp_path)
    assert config.rollout.dev_eval_tasks == 0
    with open_warehouse(config) as wh:
        assert dev_eval_tasks(config, wh) == []


def test_dev_evaluation_takes_the_first_tasks_of_the_stored_dev_split(tmp_path):
    from coevolve.config import load_config
    from tasks.common import DEV_ROUND, open_warehouse
    from tasks.evaluate import dev_eval_tasks
    from tasks.splits import build_dev_split

    config = load_config(data={"state_dir": str(tmp_path), "policy": {"sft_tasks": 8}, "pool": {"seed_size": 4},
                               "rollout": {"heldout_tasks": 2, "dev_eval_tasks": 3}}, environ={})
    with open_warehouse(config) as wh:
        first = dev_eval_tasks(config, wh)  # not stored yet: built and stored where validation reads it
        stored = wh.pool(config.run_id, DEV_ROUND)
        again = dev_eval_tasks(config, wh)
    assert [t.task_id for t in first] == [t.task_id for t in build_dev_split(config)[:3]]
    assert [t.task_id for t in stored[:3]] == [t.task_id for t in first] == [t.task_id for t in again]


def test_a_run_without_heldout_or_dev_tasks_loads_no_model(tmp_path):
    """Every split empty: nothing is played, so no model load (nor a managed server start) is paid for."""
    from coevolve.config import PipelineConfig
    from tasks.evaluate import DEV_SPLIT, HELDOUT_SPLIT, evaluate_splits

    config = PipelineConfig(state_dir=tmp_path)
    missing = str(tmp_path / "no-such-checkpoint")
    assert evaluate_splits(config, missing, {HELDOUT_SPLIT: [], DEV_SPLIT: []}, 0) == {HELDOUT_SPLIT: 0.0, DEV_SPLIT: 0.0}
    from envs.explorer import build_tasks

    with pytest.raises(OSError):  # with a task to play, the missing checkpoint is loaded and fails
        evaluate_splits(config, missing, {HELDOUT_SPLIT: build_tasks(1, seed=0)}, 0)
