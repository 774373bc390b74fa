"""A round's trajectories as GRPO groups: which task groups can teach something, and TRL's rows for them.

Plain data, no torch: the update stage groups the round once (`group_round`), and both the
in-process trainer (tasks/training/grpo_trainer.py) and a launched rank (tasks/training/launch.py) work from that.

- a task's group is its ``group_size`` trajectories by sample; one whose rewards are all equal has
  zero advantage and is dropped (``flat``), as is one of another size (``malformed``);
- an episode is one or more token segments (tasks/rollout.py; the compact prompt style always has
  one). Segment slot j of a task's group is one TRL group, named by the task id for slot 0 and
  ``<task_id>#<j>`` after (`segment_groups`); an episode without a slot j fills it with a row that
  holds no trained token (`replay_rows`);
- under several ranks each takes a consecutive block of equally many TRL groups (`RoundGroups.shares`),
  the block TRL itself hands that rank.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coevolve.errors import DataError
from coevolve.records import Segment, Trajectory, digest
from coevolve.stages import step_samples

# Task id -> the task's trajectories, ordered by sample.
Groups = dict[str, list[Trajectory]]
# TRL group ("prompt" of a dataset row) -> (task id, segment slot), in dataset order.
Slots = dict[str, tuple[str, int]]


def has_reward_variance(rewards: Iterable[float]) -> bool:
    """A group's rewards are not all equal: its advantages are not all zero, so GRPO learns from it."""
    return len(set(rewards)) > 1


def group_trajectories(trajectories: list[Trajectory], group_size: int) -> tuple[Groups, dict[str, int]]:
    """Split a round's trajectories into GRPO groups that can teach something.

    Returns the kept groups (task id -> trajectories ordered by sample) and counts of dropped ones:
    ``malformed`` (not exactly group_size samples) and ``flat`` (every reward equal).
    """
    by_task: Groups = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.task_id].append(trajectory)
    kept: Groups = {}
    dropped = {"malformed": 0, "flat": 0}
    for task_id, group in by_task.items():
        group.sort(key=lambda t: t.sample)
        if len(group) != group_size:
            dropped["malformed"] += 1
        elif not has_reward_variance(t.reward for t in group):  # zero advantage, nothing to learn
            dropped["flat"] += 1
        else:
            kept[task_id] = group
    return kept, dropped


def segment_groups(groups: Groups) -> Slots:
    """TRL's groups for the kept task groups: "prompt" -> (task id, segment slot), task by task.

    Slot 0 of a task is its id; slot j > 0 is ``<task_id>#<j>``. A task has as many slots as its
    episode with the most segments.
    """
    slots: Slots = {}
    for task_id, group in groups.items():
        for slot in range(max(len(t.segments) for t in group)):
            key = task_id if slot == 0 else f"{task_id}#{slot}"
            if key in slots:
                raise DataError(
                    f"Task ids {task_id!r} and {slots[key][0]!r} both name the GRPO group {key!r}; task ids must not "
                    "end in '#<number>'."
                )
            slots[key] = (task_id, slot)
    return slots


def lineage(trajectories: list[Trajectory], groups: Groups) -> dict[str, Any]:
    """The lineage record of an update: which stored trajectories its groups hold (run, round, count, id digest)."""
    ids = sorted(t.trajectory_id for group in groups.values() for t in group)
    first = trajectories[0] if trajectories else None
    return {
        "run_id": first.run_id if first else None,
        "round": first.round if first else None,
        "count": len(ids),
        "ids_digest": digest(ids),
    }


@dataclass(frozen=True)
class RoundGroups:
    """A round's trajectories arranged for one GRPO update.

    ``groups`` are the task groups this process trains: all of them in-process, a rank's share
    when launched; every other field describes the whole round.
    """

    groups: Groups
    slots: Slots
    dropped: dict[str, int]  # task groups left out: "malformed" and "flat"
    trajectories: int  # the round's trajectories, kept or not
    task_groups: int  # kept task groups of the whole round
    longest_completion: int  # tokens of the longest completion segment of the whole round
    trained_on: dict[str, Any]  # `lineage` of the whole round

    def statistics(self) -> dict[str, int]:
        """What the update reports about its input, trained or skipped."""
        return {
            "groups_flat": self.dropped["flat"],
            "groups_malformed": self.dropped["malformed"],
            "trajectories": self.trajectories,
        }

    def shares(self, ranks: int) -> list[list[str]]:
        """The task ids each of ``ranks`` ranks trains: a consecutive block of len(slots) / ranks TRL groups each.

        TRL deals one generation batch (the dataset in order, no shuffling) to the ranks in consecutive
        blocks, so rank r's block is slots r*k..(r+1)*k-1. A task whose segment slots straddle two
        blocks is in both shares.
        """
        keys, per_rank = list(self.slots), len(self.slots) // ranks
        blocks = [keys[rank * per_rank : (rank + 1) * per_rank] for rank in range(ranks)]
        return [list(dict.fromkeys(self.slots[key][0] for key in block)) for block in blocks]

    def plan(self) -> dict[str, Any]:
        """Everything but the trajectories, as JSON: what a launched rank needs besides its share."""
        fields = dataclasses.asdict(dataclasses.replace(self, groups={}))
        fields["slots"] = [[key, task_id, slot] for key, (task_id, slot) in self.slots.items()]
        return fields

    @classmethod
    def from_plan(cls, plan: dict[str, Any], groups: Groups) -> RoundGroups:
        """A rank's view of the round: the planned round (`plan`) and the groups of its share."""
        slots = {key: (task_id, int(slot)) for key, task_id, slot in plan["slots"]}
        return cls(**{**plan, "slots": slots, "groups": groups})


def step_trajectories(trajectories: list[Trajectory], step: int, group_size: int) -> list[Trajectory]:
    """The trajectories of training step ``step`` of a round, as stored (their ids are the lineage's).

    Step k of a round stores a task's episodes as samples k*group_size .. k*group_size+group_size-1
    (`coevolve.stages.step_samples`; a task can be drawn by several steps of a round).
    """
    samples = step_samples(step, group_size)
    return [t for t in trajectories if t.sample in samples]


def group_round(trajectories: list[Trajectory], group_size: int) -> RoundGroups:
    """The round's trajectories grouped once, for the whole update: its groups, TRL's groups, its lineage."""
    groups, dropped = group_trajectories(trajectories, group_size)
    return RoundGroups(
        groups=groups,
        slots=segment_groups(groups),
        dropped=dropped,
        trajectories=len(trajectories),
        task_groups=len(groups),
        longest_completion=max(
            (len(s.completion_ids) for g in groups.values() for t in g for s in t.segments), default=0
        ),
        trained_on=lineage(trajectories, groups),
    )


def trained_on(trajectories: list[Trajectory], group_size: int) -> dict[str, Any]:
    """The lineage record of an update of these trajectories (`lineage` of their informative groups)."""
    return group_round(trajectories, group_size).trained_on


def check_segments(trajectory: Trajectory) -> None:
    """DataError unless every segment has a prompt, completion tokens, and a mask and logprobs as long as them."""
    for index, segment in enumerate(trajectory.segments):
        n = len(segment.completion_ids)
        if not segment.prompt_ids or n == 0:
            raise DataError(
                f"Trajectory {trajectory.trajectory_id} has no prompt or no completion tokens in segment {index}."
            )
        if len(segment.completion_mask) != n or len(segment.logprobs) != n:
            raise DataError(
                f"Trajectory {trajectory.trajectory_id}, segment {index}: completion_ids ({n}), completion_mask "
                f"({len(segment.completion_mask)}) and logprobs ({len(segment.logprobs)}) must have equal lengths."
            )


def _filler(trajectory: Trajectory, pad_token_id: int) -> Segment:
    """A row for a segment slot the episode does not reach: no trained token (env_mask 0), one token long."""
    return Segment(trajectory.prompt_ids[:1], [pad_token_id], [0], [0.0])


def replay_rows(prompts: list[str], groups: Groups, slots: Slots, pad_token_id: int) -> dict[str, list]:
    """The rollout rows TRL asks for: the i-th request of a group's "prompt" is episode i's segment of that slot."""
    handed: dict[str, int] = defaultdict(int)
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "stored_reward")}
    for key in prompts:
        task_id, slot = slots[key]
        if task_id not in groups:
            raise DataError(
                f"TRL asked this rank for the group {key!r}, which is not in its share of the round: {sorted(groups)}."
            )
        group = groups[task_id]
        trajectory = group[handed[key] % len(group)]
        handed[key] += 1
        segments = trajectory.segments
        segment = segments[slot] if slot < len(segments) else _filler(trajectory, pad_token_id)
        out["prompt_ids"].append(list(segment.prompt_ids))
        out["completion_ids"].append(list(segment.completion_ids))
        out["logprobs"].append([float(x) for x in segment.logprobs])
        out["env_mask"].append([int(m) for m in segment.completion_mask])
        out["stored_reward"].append(float(trajectory.reward))
    return out
