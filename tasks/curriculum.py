"""A training step's curriculum: a sampler that draws tasks from the pool, and gates that admit played groups.

The rollout stage plays what `StepCurriculum` hands out. Its first draw is the step's batch
(``rollout.tasks_per_batch`` tasks, drawn by ``pool.sampler``, tasks/samplers.py). Once a batch is played, every
gate judges each whole group (one task's episodes of this step): a group counts toward the update only when every
gate admits it. While fewer groups than the batch size are admitted and the step's episode budget lasts
(`episode_budget`), the curriculum draws replacement tasks not yet played in the step. Without gates it draws
once and the update takes every group, as the paper does.

- ``informative`` (``rollout.dynamic_sampling``, DAPO's dynamic sampling): a group whose rewards are not all
  equal, the only groups GRPO learns from;
- any gate an installed package declares under the entry-point group ``coevolve.gates``, named in
  ``rollout.gates`` (docs/extending.md).

Every draw is seeded by (seed, round, step, draw) and decided by the stored outcomes only, so the curriculum's
state is the warehouse: a stage that resumes replays the same draws from what it stored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from coevolve.config import PipelineConfig, RolloutConfig
from coevolve.config.rollout import GATE_ENTRY_POINTS
from coevolve.plugins import declared_class
from coevolve.records import Task
from coevolve.stages import step_samples
from tasks.samplers import PoolSampler, TaskEstimate, draw_key, pool_sampler
from tasks.training.grpo_groups import has_reward_variance


class Gate(ABC):
    """An admission rule for a played group: one task's whole group of episodes in this step."""

    # The name rollout.gates uses for it.
    name: ClassVar[str]

    @abstractmethod
    def admit(self, task: Task, rewards: list[float]) -> bool:
        """Whether the update trains on this group (its rewards in sample order)."""


class InformativeGate(Gate):
    """Dynamic sampling: a group counts only when its rewards are not all equal."""

    name = "informative"

    def admit(self, task: Task, rewards: list[float]) -> bool:
        return has_reward_variance(rewards)


BUILT_IN_GATES: dict[str, type[Gate]] = {InformativeGate.name: InformativeGate}


def gate_class(name: str) -> type[Gate]:
    """The gate called ``name``: a built-in one, or the one an installed package declares under that name."""
    return declared_class(GATE_ENTRY_POINTS, name, BUILT_IN_GATES, Gate, "tasks/curriculum.py", "gate")


def step_gates(config: RolloutConfig) -> tuple[Gate, ...]:
    """The gates of a step: ``informative`` with dynamic sampling, then ``rollout.gates``, each once."""
    names = (["informative"] if config.dynamic_sampling else []) + list(config.gates)
    return tuple(gate_class(name)() for name in dict.fromkeys(names))


def episode_budget(config: RolloutConfig, gates: Sequence[Gate]) -> int:
    """The most episodes one training step plays: its batch, times rollout.max_rollout_factor when ``gates`` (the
    step's, `step_gates`) can send it back for replacements."""
    base = config.tasks_per_batch * config.group_size
    return int(base * config.max_rollout_factor) if gates else base


def step_groups(outcomes: dict[str, list[Any]], samples: range) -> dict[str, list[float]]:
    """Each task's rewards among the episodes numbered ``samples`` (one training step's), in stored order."""
    rewards: dict[str, list[float]] = {}
    for task_id, sample, reward in zip(outcomes["task_id"], outcomes["sample"], outcomes["reward"], strict=True):
        if sample in samples:
            rewards.setdefault(task_id, []).append(reward)
    return rewards


def informative_tasks(outcomes: dict[str, list[Any]], samples: range, group_size: int) -> set[str]:
    """Tasks whose episodes numbered ``samples`` form a whole group with reward variance: the groups GRPO learns
    from (the rule of tasks/training/grpo_groups.group_trajectories), measured for every step whatever its gates."""
    return {
        task_id
        for task_id, rewards in step_groups(outcomes, samples).items()
        if len(rewards) == group_size and has_reward_variance(rewards)
    }


@dataclass
class StepCurriculum:
    """What one training step plays and trains on: its draws from the pool and the groups its gates admit."""

    sampler: PoolSampler
    gates: tuple[Gate, ...]
    estimates: dict[str, TaskEstimate]
    tasks_per_batch: int
    group_size: int
    budget: int  # episodes
    seed: int
    round_: int
    step: int
    played: list[Task] = field(default_factory=list)
    draws: int = 0

    @classmethod
    def for_step(
        cls, config: PipelineConfig, estimates: dict[str, TaskEstimate], round_: int, step: int
    ) -> StepCurriculum:
        rollout = config.rollout
        gates = step_gates(rollout)
        return cls(
            sampler=pool_sampler(config.pool),
            gates=gates,
            estimates=estimates,
            tasks_per_batch=rollout.tasks_per_batch,
            group_size=rollout.group_size,
            budget=episode_budget(rollout, gates),
            seed=config.seed,
            round_=round_,
            step=step,
        )

    @property
    def samples(self) -> range:
        """The episode numbers of this step's groups."""
        return step_samples(self.step, self.group_size)

    def _draw(self, tasks: Sequence[Task], size: int) -> list[Task]:
        batch = self.sampler.draw(list(tasks), self.estimates, size, draw_key(self.seed, self.round_, self.step,
                                                                             self.draws))  # fmt: skip
        self.draws += 1
        self.played += batch
        return batch

    def first_draw(self, pool: Sequence[Task]) -> list[Task]:
        """The step's batch."""
        return self._draw(pool, self.tasks_per_batch)

    def next_draw(self, pool: Sequence[Task], outcomes: dict[str, list[Any]]) -> list[Task]:
        """Replacements for the groups the gates did not admit, from tasks not yet played in the step, as many
        as are missing and the budget still holds; none without gates (or when nothing is missing)."""
        if not self.gates:
            return []
        room = (self.budget - len(self.played) * self.group_size) // self.group_size
        wanted = min(self.tasks_per_batch - len(self.admitted(outcomes)), room)
        if wanted <= 0:
            return []
        drawn = {t.task_id for t in self.played}
        return self._draw([t for t in pool if t.task_id not in drawn], wanted)

    def admitted(self, outcomes: dict[str, list[Any]]) -> set[str]:
        """Played tasks whose whole group every gate admits (with no gates: every whole group)."""
        groups = step_groups(outcomes, self.samples)
        tasks = {t.task_id: t for t in self.played}
        return {
            task_id
            for task_id, rewards in groups.items()
            if task_id in tasks
            and len(rewards) == self.group_size
            and all(gate.admit(tasks[task_id], rewards) for gate in self.gates)
        }

    def train_tasks(self, outcomes: dict[str, list[Any]]) -> list[str] | None:
        """The groups the update trains on: the first ``tasks_per_batch`` admitted ones in draw order; None (every
        group with reward variance, the update's own rule) without gates."""
        if not self.gates:
            return None
        admitted = self.admitted(outcomes)
        return [t.task_id for t in self.played if t.task_id in admitted][: self.tasks_per_batch]
