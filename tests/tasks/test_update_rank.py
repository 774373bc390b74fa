"""A launched rank reads only its share of the round from the warehouse, and stops when the round changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from coevolve.records import Step, Trajectory
from tasks.common import open_warehouse
from tasks.training.grpo_groups import group_round
from tasks.training.update_rank import read_share, run_rank


def _config(state_dir: Path) -> PipelineConfig:
    return PipelineConfig(run_id="ranks", state_dir=state_dir, rollout={"group_size": 2})


def _trajectory(task_id: str, sample: int) -> Trajectory:
    return Trajectory(
        run_id="ranks",
        round=0,
        task_id=task_id,
        sample=sample,
        steps=[Step(turn=0, index=0, model_text=f"{task_id} {sample}")],
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        completion_mask=[1, 1],
        logprobs=[-1.0, -1.0],
        reward=float(sample),
        success=sample > 0,
        finish_reason="done",
    )


@pytest.fixture
def stored(tmp_path: Path) -> tuple[PipelineConfig, list[Trajectory]]:
    config = _config(tmp_path)
    trajectories = [_trajectory(task_id, sample) for task_id in ("t-a", "t-b", "t-c", "t-d") for sample in (0, 1)]
    with open_warehouse(config) as wh:
        wh.write_trajectories(trajectories)
    return config, trajectories


def test_a_rank_reads_the_trajectories_and_steps_of_its_share_only(stored):
    config, trajectories = stored
    share = read_share(config, 0, ["t-c", "t-d"])
    assert [(t.task_id, t.sample) for t in share] == [("t-c", 0), ("t-c", 1), ("t-d", 0), ("t-d", 1)]
    assert [t.steps[0].model_text for t in share] == ["t-c 0", "t-c 1", "t-d 0", "t-d 1"]
    assert share == [t for t in trajectories if t.task_id in {"t-c", "t-d"}]


def test_a_rank_whose_share_changed_in_the_warehouse_stops_before_training(stored, tmp_path):
    config, trajectories = stored
    round_groups = group_round(trajectories, 2)
    spec = {
        "config": config.model_dump(mode="json"),
        "round": 0,
        "checkpoint": str(tmp_path / "absent"),
        "out_dir": str(tmp_path / "out"),
        "reference_checkpoint": str(tmp_path / "absent"),
        "round_groups": round_groups.plan(),
        "shares": [["t-a", "t-b"], ["t-c", "t-e"]],
    }
    with pytest.raises(DataError, match=r"Rank 1 found the groups \['t-c'\] .* planned \['t-c', 't-e'\]"):
        run_rank(spec, rank=1, world=2)
    with pytest.raises(DataError, match="among 2 ranks, but 4 were started"):
        run_rank(spec, rank=1, world=4)
