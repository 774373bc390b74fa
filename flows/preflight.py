"""What `coevolve evolve` and `coevolve round` check before Prefect starts, and the line they print when a round stops.

Before: the refusals a round would otherwise reach only after Prefect's temporary server is up (tens of seconds)
are made here in a second or two, each as one ``error:`` line, and nothing is started or written (but the
round lock's file, where the run has none yet):

- another process holds the run's round lock (tasks/common.py `round_lock`);
- the checkpoint or pool the round starts from is missing, or no longer matches its recorded digest (what the
  prepare stage checks, tasks/round_inputs.py `verify_round_inputs`), or the round before it has not finished.

Nothing here imports Prefect: a command loads it only once its output goes to the log file (coevolve/console.py).

After: an interrupted or failed command prints one line naming the round and the stage it stopped in (the
first stage of the round without a record, where the same command resumes) and what to do::

    resumed = preflight.check(config, round_)          # None, or "resuming round 1 at stage rollout ..."
    with preflight.reported(config, round_, log), console.log_to_file(log):
        ...                                            # an interrupt leaves as `Interrupted`, with its line
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from coevolve.config import PipelineConfig
from coevolve.console import shown
from coevolve.errors import DataError, PipelineError, RoundLockedError
from coevolve.optional import optional_module
from coevolve.stages import STAGE_NAMES, STEP_STAGES, record_name
from tasks.common import round_lock
from tasks.round_inputs import verify_round_inputs

# The warehouse loads duckdb and pyarrow: only once a warehouse exists.
if TYPE_CHECKING:
    import storage.warehouse as storage_warehouse
else:
    storage_warehouse = optional_module("storage.warehouse")

if TYPE_CHECKING:
    from storage.warehouse import Warehouse

LOCK_FILE = "round.lock"  # in the run's folder: tasks/common.py round_lock's


class Interrupted(Exception):  # not a PipelineError: the command exits 128 + the signal's number, not 2
    """A command stopped by Ctrl-C (SIGINT) or SIGTERM; its message is the one line the console gets."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = int(signum)


def record_order(config: PipelineConfig, round_: int = 0) -> list[str]:
    """The records round ``round_`` makes, in the order it makes them: prepare, rollout, update, rollout@1, ...,
    version. Only round 0's prepare stage is recorded (it builds the run's starting point); a later round's
    checks its inputs and records nothing (tasks/prepare.py), so its first record is its first rollout's."""
    training = [record_name(stage, step) for step in range(config.training.batches_per_round) for stage in STEP_STAGES]
    once = [stage for stage in STAGE_NAMES if stage not in STEP_STAGES]
    return (once[:1] if round_ == 0 else []) + training + once[1:]


def stage_label(config: PipelineConfig, record: str) -> str:
    """How a record's stage is named to people: ``rollout``, or ``rollout, training step 2 of 3``."""
    stage, _, step = record.partition("@")
    steps = config.training.batches_per_round
    if stage not in STEP_STAGES or steps == 1:
        return stage
    return f"{stage}, training step {int(step or 0) + 1} of {steps}"


def _open(config: PipelineConfig) -> Warehouse | None:
    """The warehouse, read-only, or None where none has been made yet (a new run)."""
    root, options = config.warehouse_path, config.warehouse.storage_options
    if "://" not in str(root) and not Path(root).exists():
        return None
    if "://" in str(root) and not storage_warehouse.Warehouse.made_at(root, options):
        return None  # an object-store prefix has no folder to look for: its layout record says a warehouse is there
    return storage_warehouse.Warehouse(root, read_only=True, storage_options=options)


def _first_unfinished(wh: Warehouse, config: PipelineConfig) -> int:
    finished = [summary.round for summary in wh.rounds(config.run_id)]
    return max(finished) + 1 if finished else 0


def next_record(wh: Warehouse, config: PipelineConfig, round_: int) -> str:
    """The first record of the round that is not written yet: where the round (re)starts.

    ``version`` when every stage is recorded but the round is not marked finished yet.
    """
    for record in record_order(config, round_):
        if wh.stage_output(config.run_id, round_, record) is None:
            return record
    return "version"


def position(config: PipelineConfig, round_: int | None = None) -> str:
    """``round R (stage)``: where the run stands (``round_``, else its first unfinished round)."""
    try:
        wh = _open(config)
        if wh is None:
            return f"round {round_ or 0} ({STAGE_NAMES[0]})"
        with wh:
            current = _first_unfinished(wh, config) if round_ is None else round_
            return f"round {current} ({stage_label(config, next_record(wh, config, current))})"
    except Exception:  # noqa: BLE001 - the line must be printed even when the warehouse is what failed
        return "the run" if round_ is None else f"round {round_}"


def _moved(wh: Warehouse, config: PipelineConfig) -> bool:
    """Whether the run's records were written in another state folder: the round re-roots them when it opens
    the warehouse (storage/relocation.py), and checks its inputs after that."""
    run = wh.catalog.get(wh.catalog.run_path(config.run_id)) or {}
    recorded = str((run.get("config") or {}).get("state_dir") or "")
    return os.path.isabs(recorded) and os.path.realpath(recorded) != os.path.realpath(config.state_dir)


def check_inputs(wh: Warehouse, config: PipelineConfig, round_: int) -> None:
    """The prepare stage's checks of the checkpoint and pool round ``round_`` starts from; round 0 only once its
    prepare stage has recorded them. DataError naming the file otherwise."""
    if round_ == 0 and wh.stage_output(config.run_id, 0, "prepare") is None:
        return  # round 0 makes checkpoint 0 and D_0 first
    verify_round_inputs(config, wh, round_)


def check(config: PipelineConfig, round_: int | None = None) -> str | None:
    """Refuse now what round ``round_`` (else the run's first unfinished round) would refuse after Prefect started.

    Returns the line to print when the round resumes (it was started before and is not finished), else None.
    """
    wh = _open(config)
    if wh is None:
        _probe_lock(config, round_ or 0)
        return None
    with wh:
        current = _first_unfinished(wh, config) if round_ is None else round_
        status = wh.round_status(config.run_id, current)
        if status == "finished":
            return None  # read back, never run again (tasks/prepare.py finished_round_result)
        _probe_lock(config, current)  # first: a round running elsewhere may be writing the inputs checked below
        if not _moved(wh, config):
            try:
                check_inputs(wh, config, current)
            except DataError as exc:
                raise DataError(f"round {current} ({STAGE_NAMES[0]}): {exc}") from None
        if status != "running":
            return None
        return f"resuming round {current} at stage {stage_label(config, next_record(wh, config, current))}"


def not_writable(config: PipelineConfig, folder: Path, exc: OSError) -> PipelineError:
    """The one line for a state folder a round cannot write (a read-only mount, another user's folder)."""
    reason = exc.strerror or type(exc).__name__
    return PipelineError(
        f"the state folder {shown(config.state_dir)} cannot be written ({reason}: {shown(folder)}); a round writes "
        "its warehouse, checkpoints and lock there. Make it writable (remount it read-write, or fix its owner), or "
        "copy it and pass the copy with --set state_dir=DIR; `coevolve status`, `sql` and `lineage` read it as it is."
    )


def require_writable(config: PipelineConfig) -> None:
    """PipelineError, in one line, when the state folder cannot be written: before a round writes anything."""
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=config.state_dir, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise not_writable(config, config.state_dir, exc) from None


def _probe_lock(config: PipelineConfig, round_: int) -> None:
    """RoundLockedError now when another process holds the run's round lock.

    A free lock is let go at once and its owner file left to the round, which takes the lock when it starts
    (and refuses a process that took it in between).
    """
    try:
        config.run_dir().mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(config.run_dir() / LOCK_FILE), timeout=0)
        lock.acquire()
    except Timeout:
        with round_lock(config, round_):  # held: refused with the lock's own message
            pass
    except OSError as exc:  # a read-only folder: FileLock cannot make its file
        raise not_writable(config, config.run_dir(), exc) from None
    else:
        lock.release()


# The signals that interrupted the block (`reported`): the last one is delivered again when Python dropped the
# exception it raised, and any tells an interrupt that a library turned into an error of its own (DuckDB's
# "Query interrupted" RuntimeError) from a failure.
_signals: list[signal.Signals] = []
REDELIVER_AFTER_S = 0.05


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _signals.append(signal.Signals(signum))
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _is_interrupt(exc: BaseException) -> bool:
    """KeyboardInterrupt, or a signal another handler turned into an exception (Prefect's TerminationSignal for
    SIGTERM inside a flow run); not SystemExit or GeneratorExit, which end a command as they are."""
    return not isinstance(exc, (Exception, SystemExit, GeneratorExit))


def _signal_of(exc: BaseException) -> signal.Signals:
    """The signal behind an interrupt: Prefect's TerminationSignal names it, ours were noted as they came."""
    named = getattr(exc, "signal", None)
    if isinstance(named, int):
        return signal.Signals(named)
    return _signals[-1] if _signals else signal.SIGINT


def _raise_dropped_again(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """An unraisable-exception hook that interrupts the main thread again when a signal's exception was dropped.

    A signal's exception lands wherever the main thread is; inside a weakref callback or ``__del__`` the garbage
    collector runs (often, with torch, pyarrow and asyncio objects about), Python only logs it as "Exception
    ignored" and the command would run on.
    """

    def hook(unraisable: Any) -> None:
        previous(unraisable)
        exc = unraisable.exc_value
        if exc is not None and _is_interrupt(exc) and threading.current_thread() is threading.main_thread():
            # From another thread, a moment later: raised here, it would be dropped again, in this hook.
            threading.Timer(REDELIVER_AFTER_S, _thread.interrupt_main, args=(_signal_of(exc),)).start()

    return hook


@contextlib.contextmanager
def reported(config: PipelineConfig, round_: int | None, log: Path, where: str | None = None) -> Iterator[None]:
    """Turn a command's end in round ``round_`` (else the run's first unfinished one) into its one console line;
    ``where``, when given, is named instead of the round (a command over many runs: an ablation).

    Ctrl-C and SIGTERM end it as `Interrupted`; a PipelineError keeps its message, after the round and stage; any
    other exception becomes a PipelineError naming its type and the log file, where its traceback goes. SIGTERM
    is an interrupt while the block runs, so Prefect records the flow runs as crashed and the command's exit
    stops the temporary API server; Ctrl-C is left alone where the command was started with it ignored (``&``
    in a script).
    """
    handled = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        handled.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, _interrupt) for signum in handled}
    unraisable_hook = sys.unraisablehook
    sys.unraisablehook = _raise_dropped_again(unraisable_hook)
    _signals.clear()

    def place() -> str:
        return where or position(config, round_)

    try:
        yield
    except BaseException as exc:
        if _is_interrupt(exc) or (_signals and isinstance(exc, Exception)):
            raise Interrupted(f"interrupted in {place()}; run the same command to resume", _signal_of(exc)) from None
        if isinstance(exc, RoundLockedError):
            raise  # about the round another process runs, not this one's stage
        if isinstance(exc, PipelineError):
            raise PipelineError(f"{place()}: {exc}") from exc
        if not isinstance(exc, Exception):
            raise  # SystemExit and the like end the command as they are
        with log.open("a", encoding="utf-8") as out:
            traceback.print_exception(exc, file=out)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PipelineError(
            f"{place()} failed: {type(exc).__name__}: {first} (the traceback is in {shown(log)}); "
            "fix the cause and run the same command to resume"
        ) from exc
    finally:
        sys.unraisablehook = unraisable_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
