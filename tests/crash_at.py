"""Run the ``coevolve`` command line and die at one commit point: a real process death, for crash tests.

``python -m tests.crash_at WHEN:PATH[#N] ARGS...`` runs ``coevolve ARGS...`` in this process with every
durable write it makes watched: at the N-th watched write (default 1) whose target contains PATH, the
process ends with `os._exit` (no cleanup, no finally blocks, like kill -9) just ``before`` or ``after``
that write. It exits with CRASH_EXIT then, so a test knows the point was reached; without reaching it,
it exits as the command does.

``python -m tests.crash_at trace:FILE ARGS...`` runs the command to its end and appends the target of
every watched write, in order, one per line, to FILE: the commit points of a real run, so a crash test
built from a trace covers a write the pipeline gains without anyone listing it.

The watched writes are every way the pipeline makes something durable, each patched here and only here
(production code has no hook):
- `storage.tables.TableFiles.write_bytes`: warehouse table files, catalog records (stage, round, run) and
  the layout record; the target is the file's path.
- `storage.pool.write_pool_snapshot`: a pool snapshot file; the target is the snapshot's path.
- `pathlib.Path.rename` of a ``*.partial`` staging folder or file onto its final name: a checkpoint folder
  published whole (the start policy, an update's output, a stacked adapter); the target is the final path.
- `storage.tracking.Tracker._register`: the MLflow model version registered for a round; the target is
  ``mlflow-registry/<model name>``.
- `os.rename` of a ``.migrating`` staging folder onto its target: the one publish of a local
  ``warehouse migrate``; the target is the warehouse's path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.checkpoints import STAGING_SUFFIX  # what every checkpoint folder is staged under
from storage import pool, single_file_conversion
from storage.tables import TableFiles
from storage.tracking import Tracker

CRASH_EXIT = 86


def _watch(on_write: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Routes every durable write of the pipeline through ``on_write(target, write)``."""
    write_bytes = TableFiles.write_bytes
    TableFiles.write_bytes = lambda self, target, data: on_write(target, lambda: write_bytes(self, target, data))  # type: ignore[method-assign]

    write_pool_snapshot = pool.write_pool_snapshot
    pool.write_pool_snapshot = lambda tasks, path: on_write(str(path), lambda: write_pool_snapshot(tasks, path))

    path_rename = Path.rename

    def rename(self: Path, target: Any) -> Path:
        if not self.name.endswith(STAGING_SUFFIX):
            return path_rename(self, target)
        return on_write(str(target), lambda: path_rename(self, target))

    Path.rename = rename  # type: ignore[method-assign]

    register = Tracker._register
    Tracker._register = lambda self, name, source, run_id, tags: on_write(  # type: ignore[method-assign]
        f"mlflow-registry/{name}", lambda: register(self, name, source, run_id, tags)
    )

    os_rename = os.rename

    def rename_staged_warehouse(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if not os.fspath(src).endswith(single_file_conversion.STAGING_SUFFIX):
            return os_rename(src, dst, *args, **kwargs)
        return on_write(os.fspath(dst), lambda: os_rename(src, dst, *args, **kwargs))

    os.rename = rename_staged_warehouse


def arm(spec: str) -> None:
    """Patch the pipeline's durable writes to end the process at the point ``spec`` names, or to trace them."""
    when, _, rest = spec.partition(":")
    if when == "trace":
        log = Path(rest)

        def traced(target: str, write: Callable[[], Any]) -> Any:
            with log.open("a") as out:
                out.write(target + "\n")
            return write()

        _watch(traced)
        return
    if when not in ("before", "after"):
        raise SystemExit(f"crash point {spec!r}: start it with before:, after: or trace:")
    fragment, _, nth = rest.partition("#")
    wanted = int(nth or 1)
    seen = 0

    def watched(target: str, write: Callable[[], Any]) -> Any:
        nonlocal seen
        hit = fragment in target and (seen := seen + 1) == wanted
        if hit and when == "before":
            os._exit(CRASH_EXIT)
        result = write()
        if hit:
            os._exit(CRASH_EXIT)
        return result

    _watch(watched)


if __name__ == "__main__":
    arm(sys.argv[1])
    from coevolve.process_exit import exit_promptly
    from flows.cli import main

    exit_promptly(main(sys.argv[2:]))
