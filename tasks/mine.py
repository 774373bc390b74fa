"""Mining stage: the three failure signals of the method, computed with Polars over the warehouse.

Input is the trajectory frame (one row per trajectory: trajectory_id, round, task_id, sample,
reward, tool_sequence) of a run up to the current round. Each signal kind is computed
independently; a trajectory may carry several.

- forgetting: a task's last W scores before this round include one >= 0.5, and this
  trajectory scored < 0.5. The current trajectory is marked.
- boundary: this round's samples of a task include a reward > 0.5 and one < 0.5. All of them
  are marked.
- rare: an action pattern p (the tool sequence, or its tool bigrams) with cumulative count c_p
  out of N trajectories; once N >= N_min, p is rare when 0 < c_p / N < theta / 100. Every
  trajectory of this round containing p is marked.
"""

from __future__ import annotations

import polars as pl

from coevolve.config import SignalConfig
from coevolve.records import SIGNAL_KINDS, Signal

PATTERNS = ("tool_sequence", "tool_bigrams")


def _patterns(frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """Add a ``patterns`` column: the distinct action patterns of each trajectory.

    A trajectory that called no tool has no pattern: there is nothing to explore around it.
    """
    seq = pl.col("tool_sequence")
    if kind == "tool_sequence":
        patterns = pl.when(seq.list.len() > 0).then(pl.concat_list([seq.list.join(">")]))
    elif kind == "tool_bigrams":
        pairs = seq.list.eval((pl.element() + ">" + pl.element().shift(-1)).drop_nulls().unique(maintain_order=True))
        patterns = pl.when(seq.list.len() == 1).then(seq).otherwise(pairs)
    else:
        raise ValueError(f"unknown action pattern {kind!r}; use one of {PATTERNS}")
    return frame.with_columns(patterns.fill_null(pl.lit([], dtype=pl.List(pl.String))).alias("patterns"))


def mine_signals(frame: pl.DataFrame, round_: int, run_id: str, config: SignalConfig) -> list[Signal]:
    """All enabled signals of ``round_`` from the run's trajectory frame (rounds <= round_)."""
    lazy = frame.lazy().filter(pl.col("round") <= round_)
    signals: list[Signal] = []
    if "forgetting" in config.enabled:
        signals += _forgetting(lazy, round_, run_id, config.forgetting_window)
    if "boundary" in config.enabled:
        signals += _boundary(lazy, round_, run_id)
    if "rare" in config.enabled:
        signals += _rare(lazy, round_, run_id, config)
    return signals


def _forgetting(lazy: pl.LazyFrame, round_: int, run_id: str, window: int) -> list[Signal]:
    history = (
        lazy.filter(pl.col("round") < round_)
        .sort(["task_id", "round", "sample"])
        .group_by("task_id")
        .agg(pl.col("reward").tail(window).alias("window"))
    )
    current = lazy.filter(pl.col("round") == round_)
    fired = (
        current.join(history, on="task_id", how="inner")
        .filter((pl.col("window").list.max() >= 0.5) & (pl.col("reward") < 0.5))
        .sort("trajectory_id")
        .collect()
    )
    return [
        Signal(run_id, round_, "forgetting", row["trajectory_id"], row["task_id"], {"window": list(row["window"]), "score": row["reward"]})
        for row in fired.iter_rows(named=True)
    ]


def _boundary(lazy: pl.LazyFrame, round_: int, run_id: str) -> list[Signal]:
    current = lazy.filter(pl.col("round") == round_)
    groups = (
        current.group_by("task_id")
        .agg(
            (pl.col("reward") > 0.5).any().alias("has_high"),
            (pl.col("reward") < 0.5).any().alias("has_low"),
            pl.col("reward").sort_by("sample").alias("rewards"),
        )
        .filter(pl.col("has_high") & pl.col("has_low"))
    )
    fired = current.join(groups, on="task_id", how="inner").sort("trajectory_id").collect()
    return [
        Signal(run_id, round_, "boundary", row["trajectory_id"], row["task_id"], {"group_rewards": list(row["rewards"])})
        for row in fired.iter_rows(named=True)
    ]


def _rare(lazy: pl.LazyFrame, round_: int, run_id: str, config: SignalConfig) -> list[Signal]:
    with_patterns = _patterns(lazy, config.pattern)
    total = with_patterns.select(pl.len()).collect().item()
    if total < config.rare_min_total:
        return []
    counts = (
        with_patterns.select("patterns")
        .explode("patterns")
        .drop_nulls()
        .group_by("patterns")
        .agg(pl.len().alias("count"))
        .rename({"patterns": "pattern"})
        .filter((pl.col("count") > 0) & (pl.col("count") / total < config.rare_theta / 100))
    )
    fired = (
        with_patterns.filter(pl.col("round") == round_)
        .explode("patterns")
        .rename({"patterns": "pattern"})
        .join(counts, on="pattern", how="inner")
        .sort(["trajectory_id", "pattern"])
        .unique(subset=["trajectory_id"], keep="first", maintain_order=True)
        .collect()
    )
    return [
        Signal(
            run_id,
            round_,
            "rare",
            row["trajectory_id"],
            row["task_id"],
            {"pattern": row["pattern"], "count": int(row["count"]), "total": int(total)},
        )
        for row in fired.iter_rows(named=True)
    ]


def select_for_synthesis(signals: list[Signal], limit: int) -> list[Signal]:
    """At most ``limit`` signals, kinds interleaved so no single kind crowds out the others.

    Within a kind, one signal per task comes first: ten boundary signals on the same task
    would otherwise spend the whole synthesis budget on one spot.
    """
    by_kind: dict[str, list[Signal]] = {k: [] for k in SIGNAL_KINDS}
    for kind in SIGNAL_KINDS:
        seen: set[str] = set()
        firsts, rest = [], []
        for s in (s for s in signals if s.kind == kind):
            (rest if s.task_id in seen else firsts).append(s)
            seen.add(s.task_id)
        by_kind[kind] = firsts + rest
    picked: list[Signal] = []
    while len(picked) < limit and any(by_kind.values()):
        for kind in SIGNAL_KINDS:
            if by_kind[kind] and len(picked) < limit:
                picked.append(by_kind[kind].pop(0))
    return picked


def count_by_kind(signals: list[Signal]) -> dict[str, int]:
    return {kind: sum(1 for s in signals if s.kind == kind) for kind in SIGNAL_KINDS}


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from coevolve.config import PipelineConfig  # noqa: E402
from coevolve.errors import is_retryable  # noqa: E402
from tasks.common import open_warehouse, resumable  # noqa: E402


@task(name="mine", retries=2, retry_delay_seconds=2, retry_condition_fn=is_retryable, cache_policy=NO_CACHE)
def mine_task(config: PipelineConfig, round_: int) -> dict:
    """Mine the round's signals from the warehouse, store them, and pick those synthesis follows."""

    def compute() -> dict:
        with open_warehouse(config) as wh:
            frame = wh.trajectory_frame(config.run_id, upto_round=round_)
        signals = mine_signals(frame, round_, config.run_id, config.signals)
        with open_warehouse(config) as wh:
            wh.write_signals(signals)
        selected = select_for_synthesis(signals, config.signals.max_signals_per_round)
        counts = count_by_kind(signals)
        get_run_logger().info("round %d: signals %s, %d selected for synthesis", round_, counts, len(selected))
        return {"signals": counts, "selected": [s.signal_id for s in selected]}

    return resumable(config, round_, "mine", compute)
