"""forgetting: a task's last W scores before this round include one >= 0.5, and this trajectory scored < 0.5.

The current trajectory is marked. W is ``signals.forgetting_window`` (the paper gives no value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from coevolve.optional import optional_module
from coevolve.records import Signal, Task
from coevolve.signals.base import KindSettings, SignalKind

if TYPE_CHECKING:
    import polars as pl
else:
    # polars takes about half a second to import, and the configuration (which lists the kinds) needs none.
    pl = optional_module("polars")


class ForgettingSettings(KindSettings):
    forgetting_window: int = Field(10, ge=1, description="W: past scores per task; the paper gives no value.")


class Forgetting(SignalKind[ForgettingSettings]):
    name = "forgetting"
    letter = "f"
    guidance = "Practise the exact operations the agent used to master, with varied parameters, from simple to complex."
    meaning = "the agent solved this task in an earlier round and fails it now"
    settings_type = ForgettingSettings

    def history_plans(
        self, history: pl.LazyFrame, current: pl.DataFrame, settings: ForgettingSettings
    ) -> dict[str, pl.LazyFrame]:
        """The last W past rewards of each task played this round, for the tasks that passed in them."""
        # Only tasks played this round can fire, so the history is cut to them before grouping.
        passed = (
            history.select("task_id", "round", "sample", "reward")
            .join(current.lazy().select("task_id").unique(), on="task_id", how="semi")
            .group_by("task_id")
            .agg(pl.col("reward").sort_by(["round", "sample"]).tail(settings.forgetting_window).alias("window"))
            .filter(pl.col("window").list.max() >= 0.5)
        )
        return {"passed": passed}

    def fire(
        self, current: pl.DataFrame, history: dict[str, pl.DataFrame], settings: ForgettingSettings
    ) -> pl.DataFrame:
        return (
            current.lazy()
            .filter(pl.col("reward") < 0.5)
            .join(history["passed"].lazy(), on="task_id", how="inner", maintain_order="left")
            .select("trajectory_id", "task_id", "window", "reward")
            .collect()
        )

    def evidence(self, fired: pl.DataFrame) -> list[dict[str, Any]]:
        return [
            {"window": w, "score": r} for w, r in zip(fired["window"].to_list(), fired["reward"].to_list(), strict=True)
        ]

    def context(self, signal: Signal, task: Task, used: list[str], known_tools: list[str]) -> tuple[str, list[str]]:
        before = max(signal.evidence.get("window") or [0])
        return f"scored {signal.evidence.get('score')} after scoring {before} before", task.tools
