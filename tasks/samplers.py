"""How a training step draws its batch from the pool: the pluggable rule of ``pool.sampler``.

- ``uniform`` (the paper, the default): every task equally likely, a seeded sample without replacement;
  its first draw of a step is what the pipeline always drew.
- ``learnability``: a task's weight is p(1-p) of its estimated success p (storage/task_stats.py), the
  variance of one episode's reward, which is largest where a group of episodes most likely has reward
  variance, the only groups GRPO learns from. ``pool.weight_floor`` keeps every task drawable, and with
  ``pool.explore_unplayed`` a task never played gets the largest weight, so new tasks are tried before
  their estimate decides.
- ``band``: full weight for estimates within ``pool.band_low`` .. ``pool.band_high``, the floor elsewhere.

``pool.sharpness`` raises every weight to a power: above 1 the draws concentrate on the highest weights.

A rule is a class with a ``weight`` method, registered in ``SAMPLERS`` under its setting's name. Draws
are weighted samples without replacement (numpy's ``Generator.choice``) seeded from the run seed, round,
step and draw, so the same inputs draw the same tasks in every process.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa

from coevolve.config import PoolConfig
from coevolve.records import Task

# p(1-p) at p = 1/2: the weight of the most learnable task.
MOST_LEARNABLE = 0.25


@dataclass(frozen=True)
class TaskEstimate:
    """What the sampler knows of one task: its estimated success and its episodes counted for it."""

    estimate: float
    recent_played: int


def estimates_of(rows: pa.Table) -> dict[str, TaskEstimate]:
    """task_id -> its estimate, from the rows of `Warehouse.task_difficulty`."""
    return {
        task_id: TaskEstimate(estimate, played)
        for task_id, estimate, played in zip(
            rows.column("task_id").to_pylist(),
            rows.column("estimate").to_pylist(),
            rows.column("recent_played").to_pylist(),
            strict=True,
        )
    }


def _seed(text: str) -> int:
    # sha256, not hash(): the same draw in every process.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def draw_key(seed: int, round_: int, step: int, draw: int) -> str:
    """The text that seeds one draw: step 0's first draw keeps the key rounds of one batch always used."""
    if draw == 0:
        return f"{seed}:{round_}:batch" if step == 0 else f"{seed}:{round_}:{step}:batch"
    return f"{seed}:{round_}:{step}:{draw}:batch"


class PoolSampler:
    """A rule that weighs pool tasks; `draw` takes a seeded weighted sample without replacement."""

    name: ClassVar[str]

    def __init__(self, config: PoolConfig) -> None:
        self.config = config

    def weight(self, estimate: TaskEstimate | None) -> float:
        raise NotImplementedError

    def draw(self, tasks: list[Task], estimates: dict[str, TaskEstimate], size: int, key: str) -> list[Task]:
        """``size`` distinct tasks of ``tasks`` (all of them when there are no more), in draw order."""
        if len(tasks) <= size:
            return list(tasks)
        weights = np.array([self.weight(estimates.get(t.task_id)) for t in tasks], dtype=np.float64)
        weights **= self.config.sharpness
        if not weights.any():  # every weight at a floor of 0: nothing to prefer, every task as likely
            weights[:] = 1.0
        rng = np.random.default_rng(_seed(key))
        chosen = rng.choice(len(tasks), size=size, replace=False, p=weights / weights.sum())
        return [tasks[i] for i in chosen]


class UniformSampler(PoolSampler):
    name = "uniform"

    def weight(self, estimate: TaskEstimate | None) -> float:
        return 1.0

    def draw(self, tasks: list[Task], estimates: dict[str, TaskEstimate], size: int, key: str) -> list[Task]:
        # random.sample: the very draws of the pipeline before samplers existed, so runs stay comparable.
        if len(tasks) <= size:
            return list(tasks)
        return random.Random(key).sample(tasks, size)


class LearnabilitySampler(PoolSampler):
    name = "learnability"

    def weight(self, estimate: TaskEstimate | None) -> float:
        if estimate is None or (estimate.recent_played == 0 and self.config.explore_unplayed):
            return MOST_LEARNABLE
        return max(self.config.weight_floor, estimate.estimate * (1 - estimate.estimate))


class BandSampler(PoolSampler):
    name = "band"

    def weight(self, estimate: TaskEstimate | None) -> float:
        if estimate is None or (estimate.recent_played == 0 and self.config.explore_unplayed):
            return MOST_LEARNABLE
        inside = self.config.band_low <= estimate.estimate <= self.config.band_high
        return MOST_LEARNABLE if inside else self.config.weight_floor


SAMPLERS: dict[str, type[PoolSampler]] = {cls.name: cls for cls in (UniformSampler, LearnabilitySampler, BandSampler)}


def pool_sampler(config: PoolConfig) -> PoolSampler:
    """The sampler ``config.sampler`` names."""
    return SAMPLERS[config.sampler](config)
