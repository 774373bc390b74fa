"""Python's cycle collector, timed: the CPU seconds and the number of its collections, by generation, from `start` on
(every collection reported through ``gc.callbacks``). Used by benchmarks/command_cpu.py inside the command it runs
and by benchmarks/collector_time.py inside a test process; it imports nothing heavy, so it adds nothing to what they
measure."""

from __future__ import annotations

import gc
import time
from typing import Any

_SECONDS = {0: 0.0, 1: 0.0, 2: 0.0}
_COUNTS = {0: 0, 1: 0, 2: 0}
_STARTED: list[float] = []


def _timed(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _STARTED.append(time.process_time())
        return
    generation = info["generation"]
    _SECONDS[generation] += time.process_time() - _STARTED.pop()
    _COUNTS[generation] += 1


def start() -> None:
    """Time every collection from now on (once per process)."""
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)


def figures() -> dict[str, Any]:
    """The collector's CPU seconds and collections by generation so far, and the process's own CPU seconds."""
    return {
        "collector_s": {str(g): round(s, 2) for g, s in _SECONDS.items()},
        "collections": {str(g): n for g, n in _COUNTS.items()},
        "process_cpu_s": round(time.process_time(), 1),
    }
