"""What `coevolve evolve` and `coevolve round` show: the round table on the console, everything else in a log file.

A run prints a few lines people read (its header, one row per round, the closing line, or the one line
saying where it stopped). The rest of what a run writes, Prefect's flow and task run lines, TRL's losses,
warnings, the libraries' own messages and the output of processes a round starts, goes to
``<state_dir>/logs/<command>-<UTC time>.log``, and so does what the process prints while it exits::

    with log_to_file(path):
        print(row, file=table_stream())

While `log_to_file` runs, the process's file descriptors 1 and 2 point at the log (so does every process
it starts), the table goes to a copy of the original stdout, and a progress bar reaches the console only
when its stderr is a terminal.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import itertools
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from coevolve.errors import DiskFullError, is_disk_full
from coevolve.optional import collector_paused, optional_module

transformers_logging = optional_module("transformers.utils.logging")

# Loaded before the console is handed to the progress bars: each makes its logging handlers when it is
# imported, bound to the stderr of that moment, which is then the log.
LIBRARIES = ("prefect", "mlflow", "torch", "transformers", "datasets")
# Libraries that print their records through a handler of their own and also pass them on to the root
# logger: without their handler each record is written once, in the log's format.
OWN_HANDLER_LOGGERS = ("datasets", "huggingface_hub")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s%(run)s - %(message)s"

# The project's own packages, whose INFO records reach the log (where checkpoint 0 came from, a warm-up's steps):
# under the root logger's WARNING, which the libraries' records keep, they would be dropped.
PROJECT_PACKAGES = ("agent", "coevolve", "envs", "flows", "storage", "tasks")

# The console's stdout while `log_to_file` runs (None otherwise: the table goes to sys.stdout).
_table: TextIO | None = None


def table_stream() -> TextIO:
    """Where the table goes: the console while `log_to_file` runs, else ``sys.stdout``."""
    return _table if _table is not None else sys.stdout


def log_path(state_dir: Path, command: str, now: datetime | None = None) -> Path:
    """``<state_dir>/logs/<command>-<UTC time>.log``, e.g. ``evolve-20260425T101500Z.log``, made empty and this
    command's own: a second command started in the same second (another run of the state folder) gets
    ``evolve-20260425T101500Z-2.log``, never the first one's file, which both would otherwise write into."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    folder = state_dir / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    for number in itertools.count(1):
        path = folder / (f"{command}-{stamp}.log" if number == 1 else f"{command}-{stamp}-{number}.log")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))  # claimed whole, or taken
        except FileExistsError:
            continue
        except OSError as exc:
            if is_disk_full(exc):
                raise DiskFullError(folder) from None
            raise
        return path
    raise AssertionError("unreachable: itertools.count never ends")


def shown(path: Path) -> str:
    """``path`` as people type it: relative to the working directory when below it, else as it is."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class _LogFormatter(logging.Formatter):
    """One line per record; Prefect's flow and task run records name their run, as Prefect's console does."""

    def format(self, record: logging.LogRecord) -> str:
        run = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
        record.run = f" [{run}]" if run else ""
        return super().format(record)


def _open_copy(fd: int) -> TextIO:
    """A line-buffered text stream on a duplicate of ``fd``, which stays the console after fd is redirected."""
    return open(os.dup(fd), "w", buffering=1, encoding=getattr(sys.stdout, "encoding", None) or "utf-8")


@contextmanager
def log_to_file(path: Path, load_first: Sequence[str] = LIBRARIES) -> Iterator[None]:
    """Send everything but `table_stream` to ``path`` (appended) until the block ends.

    ``load_first``: modules imported once the output is redirected, before the console is handed to the
    progress bars (see `LIBRARIES`).
    """
    global _table
    path.parent.mkdir(parents=True, exist_ok=True)
    bars = os.isatty(2)
    if not bars:
        # tqdm's own switch: bars that do not decide for themselves (the SFT trainer's) stay off, here and
        # in the processes a round starts.
        os.environ.setdefault("TQDM_DISABLE", "1")
    # A root handler in place before Prefect loads: Prefect then keeps it instead of its console handler.
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_LogFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    logging.captureWarnings(True)
    for name in PROJECT_PACKAGES:
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.INFO)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    table = _open_copy(1)
    bar_stream = _open_copy(2) if bars else None
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    stderr = sys.stderr
    # Line by line, so a library's prints and the log's records land in the order they happened.
    stdout = sys.stdout
    block_buffered = isinstance(stdout, io.TextIOWrapper) and not stdout.line_buffering
    if isinstance(stdout, io.TextIOWrapper) and block_buffered:
        stdout.reconfigure(line_buffering=True)
    try:
        with collector_paused():  # imports make objects that live as long as the process (coevolve/optional.py)
            for name in load_first:
                if importlib.util.find_spec(name) is not None:  # one not installed is the pipeline's to report
                    importlib.import_module(name)
        if "transformers" in sys.modules:
            transformers_logging.disable_default_handler()
            transformers_logging.enable_propagation()
        for name in OWN_HANDLER_LOGGERS:
            logger = logging.getLogger(name)
            for own in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
                logger.removeHandler(own)
        if bar_stream is not None:
            sys.stderr = bar_stream
        _table = table
        yield
    finally:
        _table = None
        sys.stderr = stderr
        for stream in (sys.stdout, sys.stderr, table, *([bar_stream] if bar_stream else [])):
            # The log's disk may be full: the error that ended the block must still reach the console.
            with suppress(OSError):
                stream.flush()
        if isinstance(stdout, io.TextIOWrapper) and block_buffered:
            stdout.reconfigure(line_buffering=False)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        table.close()
        if bar_stream is not None:
            bar_stream.close()
        logging.captureWarnings(False)
        root.removeHandler(handler)
        with suppress(OSError):
            handler.close()


# The log file a command's exit goes to (`exit_in_log`), once its last console line is printed.
_exit_log: list[Path] = []


def exit_in_log(path: Path) -> None:
    """Have `exit_to_log` send what this process prints from then on to ``path`` (a command's own log file)."""
    _exit_log[:] = [path]


def command_log(state_dir: Path, command: str) -> Path:
    """A command's own log file (`log_path`), named on the console, and where the process's last output goes
    (`exit_in_log`): the first lines of `coevolve evolve`, `round` and `ablation`."""
    log = log_path(state_dir, command)
    print(f"log: {shown(log)}", flush=True)
    exit_in_log(log)
    return log


def exit_to_log() -> None:
    """After a command's last console line: what the process still prints until it exits goes to its log file.

    Exit handlers (Prefect's services, its temporary server) and native libraries' leak reports at interpreter
    shutdown write to the process's stdout and stderr; after an interrupt or an error they have plenty to say.
    Does nothing unless the command named its log with `exit_in_log` (`command_log`).
    """
    if not _exit_log or not _exit_log[0].exists():
        return
    path = _exit_log.pop()
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError):
            stream.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
