"""boundary: this round's samples of a task include a reward > 0.5 and one < 0.5. All of them are marked.

The paper's largest signal (45-51% of all signals).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coevolve.optional import optional_module
from coevolve.records import Signal, Task
from coevolve.signals.base import NoSettings, SignalKind

if TYPE_CHECKING:
    import polars as pl
else:
    # polars takes about half a second to import, and the configuration (which lists the kinds) needs none.
    pl = optional_module("polars")


class Boundary(SignalKind[NoSettings]):
    name = "boundary"
    letter = "b"
    guidance = "Explore what separates success from failure on this task, at several difficulty levels."
    meaning = "among the agent's samples of this task some succeeded and some failed"
    settings_type = NoSettings

    def fire(self, current: pl.DataFrame, history: dict[str, pl.DataFrame], settings: NoSettings) -> pl.DataFrame:
        groups = (
            current.lazy()
            .group_by("task_id")
            .agg(
                (pl.col("reward") > 0.5).any().alias("has_high"),
                (pl.col("reward") < 0.5).any().alias("has_low"),
                pl.col("reward").sort_by("sample").alias("rewards"),
            )
            .filter(pl.col("has_high") & pl.col("has_low"))
            .select("task_id", "rewards")
        )
        return (
            current.lazy()
            .join(groups, on="task_id", how="inner", maintain_order="left")
            .select("trajectory_id", "task_id", "rewards")
            .collect()
        )

    def evidence(self, fired: pl.DataFrame) -> list[dict[str, Any]]:
        return [{"group_rewards": r} for r in fired["rewards"].to_list()]

    def context(self, signal: Signal, task: Task, used: list[str], known_tools: list[str]) -> tuple[str, list[str]]:
        rewards = signal.evidence.get("group_rewards") or []
        cause = f"{sum(r < 0.5 for r in rewards)} of {len(rewards)} samples failed the same task"
        return cause, list(dict.fromkeys(task.tools + used))
