"""The pipeline's error tree.

Prefect tasks retry `InfrastructureError` (a lost server, a busy file, a flaky engine) and fail
fast on everything else: retrying bad data only repeats the failure, and a full disk stays full
(`DiskFullError`) until someone frees space.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""


class ConfigError(PipelineError):
    """Raised when a configuration file, override or environment variable is invalid."""


class DataError(PipelineError):
    """Raised when stored data is missing, corrupt (a digest mismatch) or inconsistent."""


class EnvSetupError(PipelineError):
    """Raised when an environment cannot be built for a task (unknown class, bad initial state)."""


class InfrastructureError(PipelineError):
    """Raised when an external resource fails in a way a retry can fix (engine, store, lock)."""


class RoundLockedError(PipelineError):
    """Raised when another process is already running the same round of the same run."""


class DiskFullError(PipelineError):
    """Raised when a write fails because the filesystem under a folder is full: what was written before is intact,
    and running the same command again after freeing space resumes where it stopped."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        super().__init__(f"no space left on device under {folder}; free space and run the same command again")
        self.folder = str(folder)

    def __reduce__(self) -> tuple[type[DiskFullError], tuple[str]]:
        # Rebuilt from its folder wherever it is unpickled (Prefect may carry a task's exception across processes).
        return DiskFullError, (self.folder,)


# errno values of a write that failed for lack of space: the disk is full, or the user's quota is.
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How libraries that do their own I/O word a full disk: the OS message (safetensors, polars and pyarrow quote
# it; shutil.copytree collects it in a shutil.Error without an errno) and SQLite's (MLflow's store).
_NO_SPACE_TEXTS = (
    "no space left on device",
    "os error 28",
    "errno 28",
    "disk quota exceeded",
    "database or disk is full",
)
# torch.save reports a failed write of its zip container without the OS error ("[enforce fail at
# inline_container.cc:672] . unexpected pos 704 vs 598", "PytorchStreamWriter failed writing file ..."), so for
# these the free space of the folder written decides whether the disk was full.
_TORCH_WRITE_FAILED = ("unexpected pos", "pytorchstreamwriter failed", "file write failed", "iostream error")
# A write that ran out of space filled the disk first, so less than this is left after it; a torch write that
# failed with more free than this is another fault (a failing device) and keeps its own error.
_FULL_BELOW_BYTES = 64 * 1024 * 1024


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, once each."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer can still use on the filesystem of ``folder`` (or its nearest existing parent)."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def is_disk_full(exc: BaseException, folder: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``exc``, or an exception it was raised from or during, is a write that failed for lack of space.

    With ``folder`` (where the write went), torch's failed zip writes count too when that filesystem is full.
    """
    for cause in _chain(exc):
        if isinstance(cause, OSError) and cause.errno in _NO_SPACE_ERRNOS:
            return True
        text = str(cause).lower()
        if any(marker in text for marker in _NO_SPACE_TEXTS):
            return True
        if folder is not None and isinstance(cause, RuntimeError) and any(m in text for m in _TORCH_WRITE_FAILED):
            free = _free_bytes(folder)
            if free is not None and free < _FULL_BELOW_BYTES:
                return True
    return False


@contextlib.contextmanager
def disk_full_as_error(folder: str | os.PathLike[str], remove: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Turn a write under ``folder`` that fails for lack of space into a `DiskFullError` naming ``folder``.

    ``remove``: what the failed write left half written (a file or folder), deleted so its space is free again.
    """
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        if not is_disk_full(exc, folder):
            raise
        if remove is not None:
            target = Path(remove)
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        raise DiskFullError(folder) from exc


def is_retryable(task, task_run, state) -> bool:
    """Prefect `retry_condition_fn`: retry infrastructure failures only, never a full disk (it stays full)."""
    try:
        state.result()
    except InfrastructureError as exc:
        return not is_disk_full(exc)
    except Exception:  # noqa: BLE001 - any other failure of the task's own code is not retried
        return False
    return False
