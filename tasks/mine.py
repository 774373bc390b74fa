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

from typing import TYPE_CHECKING

import polars as pl

from coevolve.config import SignalConfig
from coevolve.records import SIGNAL_KINDS, Signal

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

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


# Columns mining reads; everything else in the trajectory frame is dropped before any work.
COLUMNS = ("trajectory_id", "round", "task_id", "sample", "reward", "tool_sequence")


def mine_frames(frame: pl.DataFrame, round_: int, config: SignalConfig) -> dict[str, pl.DataFrame]:
    """The enabled signals of ``round_`` as one frame per kind, sorted by trajectory_id.

    Columns: trajectory_id, task_id and the kind's evidence (forgetting: window, reward;
    boundary: rewards; rare: pattern, count, total). Linear in the frame's rows: the history is
    scanned with grouped aggregations and only this round's rows are joined; the kinds' plans run
    in parallel. benchmarks/mining.py measures it.
    """
    lazy = frame.lazy().select(COLUMNS).filter(pl.col("round") <= round_)
    current = lazy.filter(pl.col("round") == round_).select("trajectory_id", "task_id", "sample", "reward").collect()
    plans: dict[str, pl.LazyFrame] = {}
    if not current.is_empty():
        if "forgetting" in config.enabled:
            plans["forgetting"] = _forgetting(lazy, current, round_, config.forgetting_window)
        if "boundary" in config.enabled:
            plans["boundary"] = _boundary(current)
        total = int((frame["round"] <= round_).sum())
        if "rare" in config.enabled and total >= config.rare_min_total:
            plans["rare"] = _rare(lazy, round_, config, total)
    return dict(zip(plans, pl.collect_all(list(plans.values())))) if plans else {}


def signals_from_frames(frames: dict[str, pl.DataFrame], round_: int, run_id: str) -> list[Signal]:
    """Signal records from mine_frames' output, kinds in SIGNAL_KINDS order."""
    signals: list[Signal] = []
    for kind in SIGNAL_KINDS:
        fired = frames.get(kind)
        if fired is None or fired.is_empty():
            continue
        ids, tasks = fired["trajectory_id"].to_list(), fired["task_id"].to_list()
        if kind == "forgetting":
            evidence = [{"window": w, "score": r} for w, r in zip(fired["window"].to_list(), fired["reward"].to_list())]
        elif kind == "boundary":
            evidence = [{"group_rewards": r} for r in fired["rewards"].to_list()]
        else:
            evidence = [
                {"pattern": p, "count": c, "total": t}
                for p, c, t in zip(fired["pattern"].to_list(), fired["count"].to_list(), fired["total"].to_list())
            ]
        signals += [Signal(run_id, round_, kind, tid, task, ev) for tid, task, ev in zip(ids, tasks, evidence)]
    return signals


def mine_signals(frame: pl.DataFrame, round_: int, run_id: str, config: SignalConfig) -> list[Signal]:
    """All enabled signals of ``round_`` from the run's trajectory frame (rounds <= round_)."""
    return signals_from_frames(mine_frames(frame, round_, config), round_, run_id)


def _forgetting(lazy: pl.LazyFrame, current: pl.DataFrame, round_: int, window: int) -> pl.LazyFrame:
    # Only tasks played this round can fire, so the history is cut to them before grouping.
    history = (
        lazy.filter(pl.col("round") < round_)
        .select("task_id", "round", "sample", "reward")
        .join(current.lazy().select("task_id").unique(), on="task_id", how="semi")
        .group_by("task_id")
        .agg(pl.col("reward").sort_by(["round", "sample"]).tail(window).alias("window"))
        .filter(pl.col("window").list.max() >= 0.5)
    )
    return (
        current.lazy()
        .filter(pl.col("reward") < 0.5)
        .join(history, on="task_id", how="inner")
        .select("trajectory_id", "task_id", "window", "reward")
        .sort("trajectory_id")
    )


def _boundary(current: pl.DataFrame) -> pl.LazyFrame:
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
    return current.lazy().join(groups, on="task_id", how="inner").select("trajectory_id", "task_id", "rewards").sort("trajectory_id")


def _rare(lazy: pl.LazyFrame, round_: int, config: SignalConfig, total: int) -> pl.LazyFrame:
    """This round's trajectories that contain a rare pattern (the first one, by text, when several).

    For whole tool sequences the list itself is the group key: grouping a list column is several
    times faster than joining a million sequences into strings, and only the rare ones are
    joined into their ``a>b>c`` text.
    """
    rare_share = pl.col("count") / total < config.rare_theta / 100
    if config.pattern == "tool_sequence":
        keyed = lazy.select("trajectory_id", "task_id", "round", pl.col("tool_sequence").alias("key"))
        # Empty sequences are dropped after grouping: filtering a million lists first copies them all.
        counts = (
            keyed.group_by("key")
            .agg(pl.len().alias("count"))
            .filter(rare_share & (pl.col("key").list.len() > 0))
            .with_columns(pl.col("key").list.join(">").alias("pattern"))
        )
    else:
        keyed = (
            _patterns(lazy, config.pattern)
            .select("trajectory_id", "task_id", "round", pl.col("patterns").alias("key"))
            .explode("key")
            .drop_nulls("key")
        )
        counts = keyed.group_by("key").agg(pl.len().alias("count")).filter(rare_share).with_columns(pl.col("key").alias("pattern"))
    return (
        keyed.filter(pl.col("round") == round_)
        .join(counts, on="key", how="inner")
        .select("trajectory_id", "task_id", "pattern", pl.col("count").cast(pl.Int64), pl.lit(total, dtype=pl.Int64).alias("total"))
        .sort(["trajectory_id", "pattern"])
        .unique(subset=["trajectory_id"], keep="first", maintain_order=True)
    )


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
from tasks.common import resumable  # noqa: E402


@task(name="mine", retries=2, retry_delay_seconds=2, retry_condition_fn=is_retryable, cache_policy=NO_CACHE)
def mine_task(config: PipelineConfig, round_: int) -> dict:
    """Mine the round's signals from the warehouse, store them, and pick those synthesis follows."""

    def compute(wh: Warehouse) -> dict:
        frame = wh.trajectory_frame(config.run_id, upto_round=round_)
        signals = mine_signals(frame, round_, config.run_id, config.signals)
        wh.write_signals(signals)
        selected = select_for_synthesis(signals, config.signals.max_signals_per_round)
        counts = count_by_kind(signals)
        get_run_logger().info("round %d: signals %s, %d selected for synthesis", round_, counts, len(selected))
        return {"signals": counts, "selected": [s.signal_id for s in selected]}

    return resumable(config, round_, "mine", compute)
