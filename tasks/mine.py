"""Mining stage: the three failure signals of the method, computed with Polars over the warehouse.

Input is a run's trajectories (one row per trajectory: trajectory_id, round, task_id, sample,
reward, tool_sequence), as a frame or as a lazy scan of the warehouse's files (the mine stage:
`mine_warehouse`). Each signal kind is computed independently; a trajectory may carry several.

- forgetting: a task's last W scores before this round include one >= 0.5, and this
  trajectory scored < 0.5. The current trajectory is marked.
- boundary: this round's samples of a task include a reward > 0.5 and one < 0.5. All of them
  are marked.
- rare: an action pattern p (the tool sequence, or its tool bigrams) with cumulative count c_p
  out of N trajectories; once N >= N_min, p is rare when 0 < c_p / N < theta / 100, compared
  exactly (in integers). Every trajectory of this round containing p is marked.
"""

from __future__ import annotations

import dataclasses
import gc
from fractions import Fraction
from typing import TYPE_CHECKING

from prefect import get_run_logger

from coevolve.config import PipelineConfig, SignalConfig
from coevolve.optional import optional_module
from coevolve.records import SIGNAL_KINDS, Signal
from coevolve.stages import MineInput, MineOutput
from tasks.registry import stage

if TYPE_CHECKING:
    import polars as pl

    from storage.warehouse import Warehouse
else:
    # polars takes about half a second to import; the flows import this module, and only mining needs it.
    pl = optional_module("polars")

PATTERNS = ("tool_sequence", "tool_bigrams")


def _patterns(frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """Add a ``patterns`` column: the distinct action patterns of each trajectory.

    A trajectory that called no tool has no pattern: there is nothing to explore around it.
    """
    seq = pl.col("tool_sequence")
    patterns: pl.Expr
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


def mine_frames(source: pl.DataFrame | pl.LazyFrame, round_: int, config: SignalConfig) -> dict[str, pl.DataFrame]:
    """The enabled signals of ``round_`` as one frame per kind, sorted by trajectory_id.

    ``source`` holds the run's trajectories (COLUMNS; rounds after ``round_`` are ignored): a frame,
    or a lazy scan of the warehouse's files (`Warehouse.trajectory_scan`), of which only the columns
    and rounds each part needs are read. Columns of the result: trajectory_id, task_id and the kind's
    evidence (forgetting: window, reward; boundary: rewards; rare: pattern, count, total).

    This round's rows are read first (they are few); the history (earlier rounds) is then scanned
    once per kind with grouped aggregations, the kinds' plans in parallel: forgetting reads each
    played task's past rewards, rare counts the patterns (trajectory_id is never read for the
    history). Linear in the rows; benchmarks/mining.py and benchmarks/warehouse.py measure it.
    """
    lazy = source.lazy().select(COLUMNS)
    # Sorted once here; every kind's rows then keep this order through their joins.
    current = lazy.filter(pl.col("round") == round_).drop("round").sort("trajectory_id").collect()
    if current.is_empty():
        return {}
    history = lazy.filter(pl.col("round") < round_)
    enabled = config.enabled
    plans: dict[str, pl.LazyFrame] = {}
    if "forgetting" in enabled:
        plans["forgetting"] = _forgetting_history(history, current, config.forgetting_window)
    if "rare" in enabled:
        plans["rare"] = _history_counts(history, config.pattern)
        if config.pattern != "tool_sequence":  # every trajectory is in one sequence's count, not so for bigrams
            plans["total"] = history.select(pl.len().alias("count"))
    # The streaming engine reads the files and aggregates as it goes: faster here on millions of rows.
    done = dict(zip(plans, pl.collect_all(list(plans.values()), engine="streaming"), strict=True)) if plans else {}
    frames: dict[str, pl.DataFrame] = {}
    if "forgetting" in done:
        frames["forgetting"] = _forgetting(current, done["forgetting"])
    if "boundary" in enabled:
        frames["boundary"] = _boundary(current)
    if "rare" in done:
        total = int(done.get("total", done["rare"])["count"].sum()) + current.height
        if total >= config.rare_min_total:
            frames["rare"] = _rare(current, done["rare"], config, total)
    return frames


def signals_from_frames(frames: dict[str, pl.DataFrame], round_: int, run_id: str) -> list[Signal]:
    """Signal records from mine_frames' output, kinds in SIGNAL_KINDS order."""
    signals: list[Signal] = []
    # Hundreds of thousands of small records at once: the cycle collector would walk the whole heap
    # again and again while they are built (it doubled this function's time), and they hold no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for kind in SIGNAL_KINDS:
            fired = frames.get(kind)
            if fired is None or fired.is_empty():
                continue
            ids, tasks = fired["trajectory_id"].to_list(), fired["task_id"].to_list()
            if kind == "forgetting":
                evidence = [
                    {"window": w, "score": r}
                    for w, r in zip(fired["window"].to_list(), fired["reward"].to_list(), strict=True)
                ]
            elif kind == "boundary":
                evidence = [{"group_rewards": r} for r in fired["rewards"].to_list()]
            else:
                evidence = [
                    {"pattern": p, "count": c, "total": t}
                    for p, c, t in zip(
                        fired["pattern"].to_list(), fired["count"].to_list(), fired["total"].to_list(), strict=True
                    )
                ]
            signals += _signals(run_id, round_, kind, ids, tasks, evidence)
    finally:
        if collecting:
            gc.enable()
    return signals


# Signal is a frozen dataclass: its __init__ sets each field through object.__setattr__, which is
# half the cost of building a few hundred thousand of them. When it is a plain one (no slots, no
# __post_init__, these fields), the records are built by setting their __dict__ at once: the same
# objects, equal to Signal(...) field by field (tests/tasks/test_mine.py checks it).
_SIGNAL_FIELDS = ("run_id", "round", "kind", "trajectory_id", "task_id", "evidence")
_PLAIN_SIGNAL = (
    tuple(f.name for f in dataclasses.fields(Signal)) == _SIGNAL_FIELDS
    and "__slots__" not in Signal.__dict__
    and not hasattr(Signal, "__post_init__")
)


def _signals(run_id: str, round_: int, kind: str, ids: list, tasks: list, evidence: list) -> list[Signal]:
    if not _PLAIN_SIGNAL:
        return [
            Signal(run_id, round_, kind, tid, task_id, ev)
            for tid, task_id, ev in zip(ids, tasks, evidence, strict=True)
        ]
    new, set_dict = object.__new__, object.__setattr__
    out: list[Signal] = []
    append = out.append
    for tid, task_id, ev in zip(ids, tasks, evidence, strict=True):
        signal = new(Signal)
        set_dict(signal, "__dict__", {"run_id": run_id, "round": round_, "kind": kind, "trajectory_id": tid,
                                      "task_id": task_id, "evidence": ev})  # fmt: skip
        append(signal)
    return out


def mine_signals(source: pl.DataFrame | pl.LazyFrame, round_: int, run_id: str, config: SignalConfig) -> list[Signal]:
    """All enabled signals of ``round_`` from the run's trajectories (a frame or `Warehouse.trajectory_scan`)."""
    return signals_from_frames(mine_frames(source, round_, config), round_, run_id)


def mine_warehouse(wh: Warehouse, run_id: str, round_: int, config: SignalConfig) -> list[Signal]:
    """All enabled signals of ``round_``, read from the warehouse's files and mined in one pass."""
    try:
        return mine_signals(wh.trajectory_scan(run_id, upto_round=round_), round_, run_id, config)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise wh.trajectory_read_error(exc, run_id) from exc


def _forgetting_history(history: pl.LazyFrame, current: pl.DataFrame, window: int) -> pl.LazyFrame:
    """The last ``window`` past rewards of each task played this round, for the tasks that passed in them."""
    # Only tasks played this round can fire, so the history is cut to them before grouping.
    return (
        history.select("task_id", "round", "sample", "reward")
        .join(current.lazy().select("task_id").unique(), on="task_id", how="semi")
        .group_by("task_id")
        .agg(pl.col("reward").sort_by(["round", "sample"]).tail(window).alias("window"))
        .filter(pl.col("window").list.max() >= 0.5)
    )


def _forgetting(current: pl.DataFrame, history: pl.DataFrame) -> pl.DataFrame:
    return (
        current.lazy()
        .filter(pl.col("reward") < 0.5)
        .join(history.lazy(), on="task_id", how="inner", maintain_order="left")
        .select("trajectory_id", "task_id", "window", "reward")
        .collect()
    )


def _boundary(current: pl.DataFrame) -> pl.DataFrame:
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


def _keyed(frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """One row per (trajectory, pattern it contains), the pattern in column ``key``.

    For whole tool sequences the list itself is the key: grouping a list column is faster than
    joining millions of sequences into strings, and only the rare ones are joined into their
    ``a>b>c`` text. Trajectories without a tool call keep their empty key here (it counts towards the
    total); the rare filter drops it.
    """
    if kind == "tool_sequence":
        return frame.with_columns(pl.col("tool_sequence").alias("key"))
    return _patterns(frame, kind).with_columns(pl.col("patterns").alias("key")).explode("key").drop_nulls("key")


def _history_counts(history: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """How many earlier trajectories contain each pattern (columns key, count)."""
    if kind not in PATTERNS:
        raise ValueError(f"unknown action pattern {kind!r}; use one of {PATTERNS}")
    return _keyed(history.select("tool_sequence"), kind).group_by("key").agg(pl.len().alias("count"))


def _rare(current: pl.DataFrame, history_counts: pl.DataFrame, config: SignalConfig, total: int) -> pl.DataFrame:
    """This round's trajectories that contain a rare pattern (the first one, by text, when several).

    A pattern's count is its earlier trajectories (``history_counts``) plus this round's; only
    patterns played this round can fire.
    """
    keyed = _keyed(current.lazy().select("trajectory_id", "task_id", "tool_sequence"), config.pattern)
    # c_p / N < theta / 100 in integers: theta as written (1.1 is 11/10), so a pattern at exactly
    # theta percent never fires, whatever the last bit of a float division would say.
    theta = Fraction(str(config.rare_theta))
    rare = pl.col("count").cast(pl.Int64) * (100 * theta.denominator) < total * theta.numerator
    pattern = pl.col("key")
    if config.pattern == "tool_sequence":
        rare, pattern = rare & (pl.col("key").list.len() > 0), pattern.list.join(">")
    counts = (
        keyed.group_by("key")
        .agg(pl.len().alias("now"))
        .join(history_counts.lazy(), on="key", how="left")
        .select("key", (pl.col("now").cast(pl.Int64) + pl.col("count").cast(pl.Int64).fill_null(0)).alias("count"))
        .filter(rare)
        .with_columns(pattern.alias("pattern"))
    )
    fired = keyed.join(counts, on="key", how="inner", maintain_order="left").select(
        "trajectory_id", "task_id", "pattern", "count", pl.lit(total, dtype=pl.Int64).alias("total")
    )
    if config.pattern != "tool_sequence":  # several patterns per trajectory: keep the first by text
        fired = fired.sort(["trajectory_id", "pattern"]).unique(
            subset=["trajectory_id"], keep="first", maintain_order=True
        )
    return fired.collect()


def select_for_synthesis(signals: list[Signal], limit: int) -> list[Signal]:
    """At most ``limit`` signals, kinds interleaved so no single kind crowds out the others.

    Within a kind, one signal per task comes first: ten boundary signals on the same task
    would otherwise spend the whole synthesis budget on one spot.
    """
    by_kind: dict[str, list[Signal]] = {k: [] for k in SIGNAL_KINDS}
    for kind in SIGNAL_KINDS:
        seen: set[str] = set()
        firsts: list[Signal] = []
        rest: list[Signal] = []
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


@stage("mine", retries=2, retry_delay_seconds=2)
def mine_stage(config: PipelineConfig, wh: Warehouse, inputs: MineInput) -> MineOutput:
    """Mine the round's signals from the warehouse, store them, and pick those synthesis follows."""
    signals = mine_warehouse(wh, config.run_id, inputs.round_, config.signals)
    wh.write_signals(signals)
    selected = select_for_synthesis(signals, config.signals.max_signals_per_round)
    counts = count_by_kind(signals)
    get_run_logger().info("round %d: signals %s, %d selected for synthesis", inputs.round_, counts, len(selected))
    return MineOutput(signals=counts, selected=[s.signal_id for s in selected])
