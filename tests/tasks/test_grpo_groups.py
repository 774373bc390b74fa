"""A round's trajectories as GRPO groups: grouped once, shared among ranks the way TRL deals them."""

from __future__ import annotations

import json

import pytest

from coevolve.errors import DataError
from coevolve.records import Segment, Trajectory, digest
from tasks.training.grpo_groups import (
    RoundGroups,
    check_segments,
    group_round,
    replay_rows,
    step_trajectories,
    trained_on,
)

GROUP_SIZE = 2


def _episode(task_id: str, sample: int, reward: float, *segments: Segment) -> Trajectory:
    """An episode whose first segment is ``segments[0]`` and whose later ones follow it."""
    first, *later = segments
    return Trajectory(
        run_id="r",
        round=3,
        task_id=task_id,
        sample=sample,
        steps=[],
        prompt_ids=first.prompt_ids,
        completion_ids=first.completion_ids,
        completion_mask=first.completion_mask,
        logprobs=first.logprobs,
        reward=reward,
        success=reward > 0,
        finish_reason="done",
        later_segments=later,
    )


def _trajectory(task_id: str, sample: int, reward: float, segments: int = 1) -> Trajectory:
    later = [Segment([1, 2, 3], [4 + s, 5], [1, 1], [-0.5, -0.5]) for s in range(segments - 1)]
    return _episode(task_id, sample, reward, Segment([1, 2], [7, 8, 9], [1, 0, 1], [-1.0, 0.0, -1.0]), *later)


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


def test_replay_rows_hand_each_slots_requests_the_groups_episodes_in_sample_order_with_fillers_past_an_episodes_end():
    """Three episodes of one task; only sample 0's reaches a second segment, so slot 1 of samples 1 and 2 is a filler:
    the episode's first prompt token, the pad token, no trained token (env_mask 0), logprob 0.0."""
    group = [
        _episode("t-a", 0, 1.0, Segment([10, 11], [12, 13], [1, 0], [-0.25, 0.0]), Segment([14], [15], [1], [-0.5])),
        _episode("t-a", 1, 0.0, Segment([20, 21], [22], [1], [-1.0])),
        _episode("t-a", 2, 0.5, Segment([30, 31], [32, 33, 34], [1, 1, 0], [-2.0, -0.125, 0.0])),
    ]
    round_groups = group_round(group, 3)
    assert round_groups.slots == {"t-a": ("t-a", 0), "t-a#1": ("t-a", 1)}
    rows = replay_rows(["t-a"] * 3 + ["t-a#1"] * 3, round_groups.groups, round_groups.slots, pad_token_id=99)
    assert rows == {
        "prompt_ids": [[10, 11], [20, 21], [30, 31], [14], [20], [30]],
        "completion_ids": [[12, 13], [22], [32, 33, 34], [15], [99], [99]],
        "logprobs": [[-0.25, 0.0], [-1.0], [-2.0, -0.125, 0.0], [-0.5], [0.0], [0.0]],
        "env_mask": [[1, 0], [1], [1, 1, 0], [1], [0], [0]],
        "stored_reward": [1.0, 0.0, 0.5, 1.0, 0.0, 0.5],
    }


def test_replay_rows_count_each_groups_requests_on_their_own_and_start_again_after_the_last_episode():
    """Two groups asked in turn: a group's i-th request is its episode i, and the one after its last is its first."""
    trajectories = _round({"t-a": [1.0, 0.0], "t-b": [0.0, 1.0]})
    round_groups = group_round(trajectories, GROUP_SIZE)
    rows = replay_rows(["t-a", "t-b", "t-a", "t-a", "t-b"], round_groups.groups, round_groups.slots, pad_token_id=0)
    assert rows["stored_reward"] == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert rows["prompt_ids"] == [[1, 2]] * 5 and rows["env_mask"] == [[1, 0, 1]] * 5


def test_replay_rows_for_no_request_are_five_empty_columns():
    assert replay_rows([], {}, {}, pad_token_id=0) == {
        "prompt_ids": [],
        "completion_ids": [],
        "logprobs": [],
        "env_mask": [],
        "stored_reward": [],
    }


def test_every_dropped_task_group_is_counted():
    trajectories = _round(
        {"t-a": [1.0], "t-b": [0.0, 0.0, 1.0], "t-c": [1.0, 1.0], "t-d": [0.0, 0.0], "t-e": [0.0, 1.0]}
    )
    assert group_round(trajectories, GROUP_SIZE).dropped == {"malformed": 2, "flat": 2}


def test_the_lineage_names_the_run_the_round_and_the_sorted_ids_of_the_trained_trajectories():
    trajectories = _round({"t-b": [1.0, 0.0], "t-a": [0.0, 1.0], "t-c": [1.0, 1.0]})
    assert trained_on(trajectories, GROUP_SIZE) == {
        "run_id": "r",
        "round": 3,
        "count": 4,
        "ids_digest": digest(["r/r3/t-a/s0", "r/r3/t-a/s1", "r/r3/t-b/s0", "r/r3/t-b/s1"]),
    }


def test_a_round_of_one_episode_trains_nothing_but_its_lineage_still_names_its_run_and_round():
    assert trained_on([_trajectory("t-a", 0, 1.0)], GROUP_SIZE) == {
        "run_id": "r",
        "round": 3,
        "count": 0,
        "ids_digest": digest([]),
    }


def test_an_empty_round_has_no_group_no_completion_and_a_lineage_of_nothing():
    round_groups = group_round([], GROUP_SIZE)
    assert (round_groups.groups, round_groups.slots, round_groups.task_groups) == ({}, {}, 0)
    assert round_groups.longest_completion == 0
    assert round_groups.statistics() == {"groups_flat": 0, "groups_malformed": 0, "trajectories": 0}
    assert round_groups.trained_on == {"run_id": None, "round": None, "count": 0, "ids_digest": digest([])}


def test_the_plan_holds_every_field_but_the_trajectories():
    round_groups = group_round(_round({"t-a": [1.0, 0.0], "t-b": [1.0, 1.0]}, segments={"t-a": 2}), GROUP_SIZE)
    assert round_groups.plan() == {
        "groups": {},
        "slots": [["t-a", "t-a", 0], ["t-a#1", "t-a", 1]],
        "dropped": {"malformed": 0, "flat": 1},
        "trajectories": 4,
        "task_groups": 1,
        "longest_completion": 3,
        "trained_on": round_groups.trained_on,
    }


def test_a_task_id_that_ends_in_a_slot_number_of_another_task_is_refused_with_both_ids():
    trajectories = _round({"t-a": [1.0, 0.0], "t-a#1": [0.0, 1.0]}, segments={"t-a": 2})
    message = "Task ids 't-a#1' and 't-a' both name the GRPO group 't-a#1'; task ids must not end in '#<number>'."
    with pytest.raises(DataError) as refused:
        group_round(trajectories, GROUP_SIZE)
    assert str(refused.value) == message


def test_a_steps_trajectories_are_the_samples_it_stored_and_no_other_steps():
    """Step 1 of a round with groups of 2 stores samples 2 and 3 of each task."""
    trajectories = [_trajectory(task_id, sample, 1.0) for task_id in ("t-a", "t-b") for sample in range(6)]
    chosen = step_trajectories(trajectories, 1, GROUP_SIZE)
    assert [t.trajectory_id for t in chosen] == ["r/r3/t-a/s2", "r/r3/t-a/s3", "r/r3/t-b/s2", "r/r3/t-b/s3"]


def test_well_formed_segments_pass_the_check_one_token_long_ones_too():
    trajectory = _episode("t-a", 0, 1.0, Segment([1, 2], [3, 4], [1, 0], [-1.0, 0.0]), Segment([5], [6], [1], [-0.5]))
    assert check_segments(trajectory) is None


@pytest.mark.parametrize(
    "second",
    [Segment([], [6], [1], [-0.5]), Segment([5], [], [], [])],
    ids=["no prompt", "no completion"],
)
def test_a_segment_without_prompt_or_completion_tokens_is_refused_by_its_place(second):
    trajectory = _episode("t-a", 0, 1.0, Segment([1, 2], [3], [1], [-1.0]), second)
    with pytest.raises(DataError) as refused:
        check_segments(trajectory)
    assert str(refused.value) == "Trajectory r/r3/t-a/s0 has no prompt or no completion tokens in segment 1."


@pytest.mark.parametrize(
    "second, lengths",
    [
        (Segment([5], [6, 7], [1], [-0.5, 0.0]), "completion_mask (1) and logprobs (2)"),
        (Segment([5], [6, 7], [1, 0], [-0.5]), "completion_mask (2) and logprobs (1)"),
    ],
    ids=["short mask", "short logprobs"],
)
def test_a_segment_whose_mask_or_logprobs_differ_in_length_from_its_tokens_is_refused_with_the_lengths(second, lengths):
    trajectory = _episode("t-a", 0, 1.0, Segment([1, 2], [3], [1], [-1.0]), second)
    with pytest.raises(DataError) as refused:
        check_segments(trajectory)
    assert str(refused.value) == (
        f"Trajectory r/r3/t-a/s0, segment 1: completion_ids (2), {lengths} must have equal lengths."
    )
