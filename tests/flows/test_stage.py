"""The stage registry: every stage of coevolve/stages.py declared once, resumed from its record.

Each is placed by configuration.
"""

from __future__ import annotations

import pytest

from coevolve.config import PipelineConfig
from coevolve.stages import CONTRACTS, STAGE_NAMES, EvaluateOutput, MineInput, MineOutput
from flows.stage import STAGES, placement_target
from storage.warehouse import STAGES as CLEARED_STAGES
from tasks.common import open_warehouse
from tasks.registry import stage, stage_registry


def test_the_registry_holds_every_stage_of_the_contracts_in_round_order():
    assert tuple(STAGES) == STAGE_NAMES
    assert {name: (s.inputs, s.outputs) for name, s in STAGES.items()} == CONTRACTS


def test_every_stage_function_is_annotated_with_its_contracts_models():
    """The types a round is checked against (`run_stage`'s output follows its input) are the functions' own."""
    for name, registered in STAGES.items():
        annotations = registered.function.__annotations__  # names: the stage modules postpone annotations
        assert (annotations["inputs"], annotations["return"]) == tuple(m.__name__ for m in CONTRACTS[name]), name
        # The input model is a StageInput parametrized by the output model (pydantic keeps the argument here).
        assert registered.inputs.__mro__[1].__pydantic_generic_metadata__["args"] == (registered.outputs,), name


def test_a_registry_that_lacks_a_stage_is_refused_naming_the_stages():
    with pytest.raises(ValueError, match="does not match coevolve/stages.py"):
        stage_registry(*(s for name, s in STAGES.items() if name != "mine"))


def test_the_warehouse_clears_every_stage_but_prepare_in_round_order():
    assert CLEARED_STAGES == STAGE_NAMES[1:]


def test_only_placeable_stages_follow_the_placement(tmp_path):
    config = PipelineConfig(state_dir=tmp_path, placement={"rollout": "coevolve-stage/rollout-gpu"})
    assert placement_target(config, STAGES["rollout"]) == "coevolve-stage/rollout-gpu"
    assert [placement_target(config, STAGES[n]) for n in ("prepare", "mine", "version")] == ["inline"] * 3


def test_a_finished_stage_returns_its_record_and_does_not_run_again(tmp_path, prefect_api):
    calls: list[int] = []

    def mine_once(config, wh, inputs):
        calls.append(inputs.round_)
        return MineOutput(signals={"rare": 1}, selected=["s-1"])

    counted = stage("mine", retries=0)(mine_once)
    config = PipelineConfig(state_dir=tmp_path)
    first, again = counted(config, MineInput(round_=0)), counted(config, MineInput(round_=0))
    assert first == again == MineOutput(signals={"rare": 1}, selected=["s-1"]) and calls == [0]
    with open_warehouse(config) as wh:
        assert wh.stage_output(config.run_id, 0, "mine") == {"signals": {"rare": 1}, "selected": ["s-1"]}


def test_a_record_keeps_the_shape_earlier_versions_wrote_and_read(tmp_path, prefect_api):
    """An optional field a stage did not set stays out of its record; a key an older version recorded is kept."""

    def evaluate_without_dev(config, wh, inputs):
        return EvaluateOutput(heldout_success=0.5, heldout_tasks=2)

    config = PipelineConfig(state_dir=tmp_path)
    stage("evaluate", retries=0)(evaluate_without_dev)(config, STAGES["evaluate"].inputs(round_=0, checkpoint="c"))
    with open_warehouse(config) as wh:
        assert wh.stage_output(config.run_id, 0, "evaluate") == {"heldout_success": 0.5, "heldout_tasks": 2}
        wh.mark_stage(
            config.run_id,
            1,
            "evaluate",
            {"heldout_success": 0.25, "heldout_tasks": 4, "dev_success": 0.5, "seconds": 3},
        )
    old = stage("evaluate", retries=0)(evaluate_without_dev)(
        config, STAGES["evaluate"].inputs(round_=1, checkpoint="c")
    )
    assert (old.heldout_success, old.dev_success, old.model_extra) == (0.25, 0.5, {"seconds": 3})
