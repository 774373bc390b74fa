"""A round's trajectories as GRPO groups: grouped once, shared among ranks the way TRL deals them."""

from __future__ import annotations

import json

import pytest

from coevolve.errors import DataError
from coevolve.records import Segment, Trajectory
from tasks.training.grpo_groups import RoundGroups, group_round, replay_rows

GROUP_SIZE = 2


def _trajectory(task_id: str, sample: int, reward: float, segments: int = 1) -> Trajectory:
    later = [Segment([1, 2, 3], [4 + s, 5], [1, 1], [-0.5, -0.5]) for s in range(segments - 1)]
    return Trajectory(
        run_id="r",
        round=3,
        task_id=task_id,
        sample=sample,
        steps=[],
        prompt_ids=[1, 2],
        completion_ids=[7, 8, 9],
        completion_mask=[1, 0, 1],
        logprobs=[-1.0, 0.0, -1.0],
        reward=reward,
        success=reward > 0,
        finish_reason="done",
        later_segments=later,
    )


def _round(rewards: dict[str, list[float]], segments: dict[str, int] | None = None) -> list[Trajectory]:
    segments = segments or {}
    return [
        _trajectory(task_id, sample, reward, segments.get(task_id, 1) if sample == 0 else 1)
        for task_id, task_rewards in rewards.items()
        for sample, reward in enumerate(task_rewards)
    ]


def test_the_round_is_grouped_once_into_informative_groups_with_counts_of_the_rest():
    trajectories = _round({"t-a": [1.0, 0.0], "t-b": [1.0, 1.0], "t-c": [0.0], "t-d": [0.0, 1.0]})
    round_groups = group_round(trajectories, GROUP_SIZE)
    assert list(round_groups.groups) == ["t-a", "t-d"]
    assert round_groups.statistics() == {"groups_flat": 1, "groups_malformed": 1, "trajectories": 7}
    assert round_groups.trained_on["count"] == 4 and round_groups.trained_on["round"] == 3
    assert round_groups.longest_completion == 3


def test_each_rank_shares_a_consecutive_block_of_trls_groups():
    round_groups = group_round(_round({t: [1.0, 0.0] for t in ("t-a", "t-b", "t-c", "t-d")}), GROUP_SIZE)
    assert round_groups.shares(2) == [["t-a", "t-b"], ["t-c", "t-d"]]
    assert round_groups.shares(1) == [["t-a", "t-b", "t-c", "t-d"]]


def test_a_task_whose_segment_groups_straddle_two_blocks_is_in_both_shares():
    round_groups = group_round(_round({"t-a": [1.0, 0.0], "t-b": [0.0, 1.0]}, segments={"t-a": 3}), GROUP_SIZE)
    assert list(round_groups.slots) == ["t-a", "t-a#1", "t-a#2", "t-b"]
    assert round_groups.shares(2) == [["t-a"], ["t-a", "t-b"]]


def test_a_rank_rebuilds_the_round_from_the_json_plan_and_its_share_only():
    round_groups = group_round(_round({t: [1.0, 0.0] for t in ("t-a", "t-b")}), GROUP_SIZE)
    plan = json.loads(json.dumps(round_groups.plan()))
    share = {"t-b": round_groups.groups["t-b"]}
    rank_view = RoundGroups.from_plan(plan, share)
    assert rank_view.groups == share
    assert rank_view.slots == round_groups.slots and rank_view.task_groups == 2
    assert rank_view.statistics() == round_groups.statistics() and rank_view.trained_on == round_groups.trained_on


def test_a_group_outside_the_ranks_share_is_refused_by_name():
    round_groups = group_round(_round({t: [1.0, 0.0] for t in ("t-a", "t-b")}), GROUP_SIZE)
    with pytest.raises(DataError, match="'t-a', which is not in its share"):
        replay_rows(["t-a"], {"t-b": round_groups.groups["t-b"]}, round_groups.slots, pad_token_id=0)
