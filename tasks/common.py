"""Plumbing the stages share: the warehouse session, the round lock, checkpoint digests.

Stages are declared, resumed and recorded by tasks/registry.py; engines are opened by agent/engines.py,
environments built by envs/registry.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from coevolve.config import PipelineConfig
from coevolve.errors import RoundLockedError
from coevolve.optional import optional_module

# The warehouse loads duckdb, polars and pyarrow (a second or more); the flows import this module
# to run stages, and only a stage's own process needs them, when it opens the warehouse.
if TYPE_CHECKING:
    import storage.warehouse as storage_warehouse
else:
    storage_warehouse = optional_module("storage.warehouse")

if TYPE_CHECKING:
    from storage.warehouse import Warehouse


@contextlib.contextmanager
def open_warehouse(config: PipelineConfig) -> Iterator[Warehouse]:
    """A session of the run's warehouse, closed when the block ends; a stage opens one and hands it down."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    warehouse = storage_warehouse.Warehouse(config.warehouse_path, storage_options=config.warehouse.storage_options)
    try:
        yield warehouse
    finally:
        warehouse.close()


@contextlib.contextmanager
def round_lock(config: PipelineConfig, round_: int) -> Iterator[None]:
    """Hold the run's lock for the round; a second process running the same run stops at once.

    The lock is an OS file lock, so a process killed with -9 releases it and a re-run resumes.
    """
    lock_path = config.run_dir() / "round.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RoundLockedError(
            f"Run {config.run_id!r} is already running a round in another process (lock {lock_path}). "
            "Wait for it to finish; rounds of one run execute one at a time."
        ) from None
    try:
        (lock_path.parent / "round.owner").write_text(f"pid={os.getpid()} round={round_}\n")
        yield
    finally:
        lock.release()
