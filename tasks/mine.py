"""Mining stage: the failure signals of the method, computed with Polars over the warehouse.

Input is a run's trajectories (one row per trajectory: trajectory_id, round, task_id, sample,
reward, tool_sequence), as a frame or as a lazy scan of the warehouse's files (the mine stage:
`mine_warehouse`). Each enabled signal kind (coevolve/signals/: forgetting, boundary, rare and any
kind a package registers) is computed independently; a trajectory may carry several.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from prefect import get_run_logger

from coevolve.config import PipelineConfig, SignalConfig
from coevolve.optional import collector_paused, optional_module
from coevolve.records import Signal
from coevolve.signals import KINDS, SIGNAL_KINDS
from coevolve.stages import MineInput, MineOutput
from tasks.registry import stage

if TYPE_CHECKING:
    import polars as pl

    from storage.warehouse import Warehouse
else:
    # polars takes about half a second to import; the flows import this module, and only mining needs it.
    pl = optional_module("polars")

# Columns mining reads; everything else in the trajectory frame is dropped before any work.
COLUMNS = ("trajectory_id", "round", "task_id", "sample", "reward", "tool_sequence")


def mine_frames(source: pl.DataFrame | pl.LazyFrame, round_: int, config: SignalConfig) -> dict[str, pl.DataFrame]:
    """The enabled signals of ``round_`` as one frame per kind, sorted by trajectory_id.

    ``source`` holds the run's trajectories (COLUMNS; rounds after ``round_`` are ignored): a frame,
    or a lazy scan of the warehouse's files (`Warehouse.trajectory_scan`), of which only the columns
    and rounds each part needs are read. Columns of the result: trajectory_id, task_id and the kind's
    evidence (forgetting: window, reward; boundary: rewards; rare: pattern, count, total).

    This round's rows are read first (they are few); the history (earlier rounds) is then scanned
    once for all kinds' grouped aggregations (`SignalKind.history_plans`), their plans collected in
    parallel: forgetting reads each played task's past rewards, rare counts the patterns
    (trajectory_id is never read for the history). Linear in the rows; benchmarks/mining.py and
    benchmarks/warehouse.py measure it.
    """
    lazy = source.lazy().select(COLUMNS)
    # Sorted once here; every kind's rows then keep this order through their joins.
    current = lazy.filter(pl.col("round") == round_).drop("round").sort("trajectory_id").collect()
    if current.is_empty():
        return {}
    history = lazy.filter(pl.col("round") < round_)
    kinds = [(kind, kind.settings(config)) for name, kind in KINDS.items() if name in config.enabled]
    plans = {(kind.name, key): plan for kind, settings in kinds
             for key, plan in kind.history_plans(history, current, settings).items()}  # fmt: skip
    # The streaming engine reads the files and aggregates as it goes: faster here on millions of rows.
    done = dict(zip(plans, pl.collect_all(list(plans.values()), engine="streaming"), strict=True)) if plans else {}
    frames: dict[str, pl.DataFrame] = {}
    for kind, settings in kinds:
        own = {key: frame for (name, key), frame in done.items() if name == kind.name}
        fired = kind.fire(current, own, settings)
        if fired is not None:
            frames[kind.name] = fired
    return frames


def signals_from_frames(frames: dict[str, pl.DataFrame], round_: int, run_id: str) -> list[Signal]:
    """Signal records from mine_frames' output, kinds in the registry's order."""
    signals: list[Signal] = []
    # Hundreds of thousands of small records at once: the cycle collector would walk the whole heap
    # again and again while they are built (it doubled this function's time), and they hold no cycles.
    with collector_paused():
        for name, kind in KINDS.items():
            fired = frames.get(name)
            if fired is None or fired.is_empty():
                continue
            ids, tasks = fired["trajectory_id"].to_list(), fired["task_id"].to_list()
            signals += _signals(run_id, round_, name, ids, tasks, kind.evidence(fired))
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
