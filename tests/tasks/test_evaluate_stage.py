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
