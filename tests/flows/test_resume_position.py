"""Where an interrupted round is said to stand, and resumes: its first stage without a record, in every round.

Only round 0's prepare stage is recorded (a later round's checks its inputs and records nothing), so a round
after the first is never said to stand "at stage prepare" once its first rollout is recorded.
"""

from __future__ import annotations

from pathlib import Path

from coevolve.config import load_config
from coevolve.records import RoundSummary
from flows import preflight
from storage.warehouse import Warehouse
from tests.storage.conftest import build_task

RUN = "default"


def _run_in_round_1(state: Path, steps: int, recorded: list[str]):
    config = load_config(overrides=[f"state_dir={state}", f"training.batches_per_round={steps}"], environ={})
    with Warehouse(config.warehouse_path) as wh:
        tasks = [build_task(i) for i in range(2)]
        wh.write_tasks(tasks)
        wh.start_round(RUN, 0, "flow-0")
        wh.mark_stage(RUN, 0, "prepare", {"checkpoint": "c0"})
        wh.finish_round(RUN, 0, RoundSummary(RUN, 0, 2, 4, 0.5, {}, 0, 0, 0.0))
        wh.start_round(RUN, 1, "flow-1")
        for record in recorded:
            wh.mark_stage(RUN, 1, record, {"step": 0})
    return config


def test_a_later_round_interrupted_after_its_first_rollout_stands_at_its_update(tmp_path: Path) -> None:
    config = _run_in_round_1(tmp_path / "state", 1, ["rollout"])
    assert preflight.position(config) == "round 1 (update)"
    assert preflight.position(config, 1) == "round 1 (update)"


def test_a_later_round_interrupted_before_any_record_stands_at_its_first_rollout(tmp_path: Path) -> None:
    config = _run_in_round_1(tmp_path / "state", 2, [])
    assert preflight.position(config, 1) == "round 1 (rollout, training step 1 of 2)"


def test_a_later_round_names_the_training_step_it_resumes(tmp_path: Path) -> None:
    config = _run_in_round_1(tmp_path / "state", 2, ["rollout", "update", "rollout@1"])
    assert preflight.position(config, 1) == "round 1 (update, training step 2 of 2)"


def test_round_0_still_stands_at_prepare_until_its_starting_point_is_recorded(tmp_path: Path) -> None:
    config = load_config(overrides=[f"state_dir={tmp_path / 'state'}"], environ={})
    with Warehouse(config.warehouse_path) as wh:
        wh.start_round(RUN, 0, "flow-0")
    assert preflight.position(config, 0) == "round 0 (prepare)"
