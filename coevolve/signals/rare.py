"""rare: an action pattern p with cumulative count c_p out of N trajectories; once N >= N_min, p is rare when
0 < c_p / N < theta / 100, compared exactly (in integers). Every trajectory of this round containing p is marked.

The pattern is the trajectory's tool sequence, or its tool bigrams (``signals.pattern``); theta is
``signals.rare_theta`` (paper: 5) and N_min ``signals.rare_min_total``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from coevolve.optional import optional_module
from coevolve.records import Signal, Task
from coevolve.signals.base import KindSettings, SignalKind

if TYPE_CHECKING:
    import polars as pl
else:
    # polars takes about half a second to import, and the configuration (which lists the kinds) needs none.
    pl = optional_module("polars")

PATTERNS = ("tool_sequence", "tool_bigrams")


class RareSettings(KindSettings):
    rare_theta: float = Field(
        5.0, gt=0, lt=100, description="A pattern is rare below theta percent of trajectories (paper: 5)."
    )
    rare_min_total: int = Field(20, ge=1, description="N_min: trajectories seen before rarity is judged.")
    pattern: Literal["tool_sequence", "tool_bigrams"] = Field(
        "tool_sequence", description="Action pattern of a trajectory: its tool-name sequence, or its tool-name bigrams."
    )


def patterns(frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """Add a ``patterns`` column: the distinct action patterns of each trajectory.

    A trajectory that called no tool has no pattern: there is nothing to explore around it.
    """
    seq = pl.col("tool_sequence")
    found: pl.Expr
    if kind == "tool_sequence":
        found = pl.when(seq.list.len() > 0).then(pl.concat_list([seq.list.join(">")]))
    elif kind == "tool_bigrams":
        pairs = seq.list.eval((pl.element() + ">" + pl.element().shift(-1)).drop_nulls().unique(maintain_order=True))
        found = pl.when(seq.list.len() == 1).then(seq).otherwise(pairs)
    else:
        raise ValueError(f"unknown action pattern {kind!r}; use one of {PATTERNS}")
    return frame.with_columns(found.fill_null(pl.lit([], dtype=pl.List(pl.String))).alias("patterns"))


def keyed(frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """One row per (trajectory, pattern it contains), the pattern in column ``key``.

    For whole tool sequences the list itself is the key: grouping a list column is faster than
    joining millions of sequences into strings, and only the rare ones are joined into their
    ``a>b>c`` text. Trajectories without a tool call keep their empty key here (it counts towards the
    total); the rare filter drops it.
    """
    if kind == "tool_sequence":
        return frame.with_columns(pl.col("tool_sequence").alias("key"))
    return patterns(frame, kind).with_columns(pl.col("patterns").alias("key")).explode("key").drop_nulls("key")


class Rare(SignalKind[RareSettings]):
    name = "rare"
    letter = "r"
    guidance = "Explore variations of the rarely used actions: parameter combinations and edge cases."
    meaning = "the agent used an action pattern that almost never occurs in its rollouts"
    settings_type = RareSettings

    def history_plans(
        self, history: pl.LazyFrame, current: pl.DataFrame, settings: RareSettings
    ) -> dict[str, pl.LazyFrame]:
        """How many earlier trajectories contain each pattern (columns key, count), and with bigrams how many
        earlier trajectories there are (every trajectory is in one sequence's count, not so for bigrams)."""
        if settings.pattern not in PATTERNS:
            raise ValueError(f"unknown action pattern {settings.pattern!r}; use one of {PATTERNS}")
        plans = {"counts": keyed(history.select("tool_sequence"), settings.pattern).group_by("key").agg(
            pl.len().alias("count")
        )}  # fmt: skip
        if settings.pattern != "tool_sequence":
            plans["total"] = history.select(pl.len().alias("count"))
        return plans

    def fire(
        self, current: pl.DataFrame, history: dict[str, pl.DataFrame], settings: RareSettings
    ) -> pl.DataFrame | None:
        """This round's trajectories that contain a rare pattern (the first one, by text, when several).

        A pattern's count is its earlier trajectories plus this round's; only patterns played this round can
        fire. None until N_min trajectories have been seen.
        """
        total = int(history.get("total", history["counts"])["count"].sum()) + current.height
        if total < settings.rare_min_total:
            return None
        rows = keyed(current.lazy().select("trajectory_id", "task_id", "tool_sequence"), settings.pattern)
        # c_p / N < theta / 100 in integers: theta as written (1.1 is 11/10), so a pattern at exactly
        # theta percent never fires, whatever the last bit of a float division would say.
        theta = Fraction(str(settings.rare_theta))
        rare = pl.col("count").cast(pl.Int64) * (100 * theta.denominator) < total * theta.numerator
        pattern = pl.col("key")
        if settings.pattern == "tool_sequence":
            rare, pattern = rare & (pl.col("key").list.len() > 0), pattern.list.join(">")
        counts = (
            rows.group_by("key")
            .agg(pl.len().alias("now"))
            .join(history["counts"].lazy(), on="key", how="left")
            .select("key", (pl.col("now").cast(pl.Int64) + pl.col("count").cast(pl.Int64).fill_null(0)).alias("count"))
            .filter(rare)
            .with_columns(pattern.alias("pattern"))
        )
        fired = rows.join(counts, on="key", how="inner", maintain_order="left").select(
            "trajectory_id", "task_id", "pattern", "count", pl.lit(total, dtype=pl.Int64).alias("total")
        )
        if settings.pattern != "tool_sequence":  # several patterns per trajectory: keep the first by text
            fired = fired.sort(["trajectory_id", "pattern"]).unique(
                subset=["trajectory_id"], keep="first", maintain_order=True
            )
        return fired.collect()

    def evidence(self, fired: pl.DataFrame) -> list[dict[str, Any]]:
        return [
            {"pattern": p, "count": c, "total": t}
            for p, c, t in zip(
                fired["pattern"].to_list(), fired["count"].to_list(), fired["total"].to_list(), strict=True
            )
        ]

    def context(self, signal: Signal, task: Task, used: list[str], known_tools: list[str]) -> tuple[str, list[str]]:
        pattern = str(signal.evidence.get("pattern", ""))
        count, total = signal.evidence.get("count"), signal.evidence.get("total")
        focus = [t for t in dict.fromkeys(pattern.split(">")) if t in known_tools] or task.tools
        return f"pattern {pattern} appears in {count} of {total} trajectories", focus
