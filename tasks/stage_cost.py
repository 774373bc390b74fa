"""What running a stage cost: wall seconds and peak memory, recorded beside its output (``v_stage_cost``).

`measured` wraps one run of a stage's function (tasks/registry.py); the warehouse keeps the figures in the
stage's record under ``cost`` (storage/round_records.py), never in its output, so a resumed round reads back
the same output whatever the machine took. Tokens, episodes and optimizer steps come from the stage's own
rows and output, which `v_stage_cost` joins (storage/VIEWS.md).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Linux keeps a process's peak resident memory (VmHWM) in /proc; writing "5" to clear_refs resets it to the
# current use, so the peak read after a stage is that stage's own (man 5 proc).
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _reset_peak() -> bool:
    """Start a new peak of this process's memory; False where the system cannot (the peak is then the process's)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _peak_mib() -> float:
    """This process's peak resident memory since the last reset (or since it started), in MiB."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _cuda() -> Any:
    """torch.cuda when this process already uses a GPU, else None (torch is never imported for this)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


@contextmanager
def measured() -> Iterator[dict[str, Any]]:
    """Yields a dict that holds, once the block ends, ``seconds``, ``peak_rss_mib`` (this process) and, when the
    process uses a GPU, ``peak_gpu_mib``. Processes a stage starts (launched ranks, servers) are not counted."""
    cost: dict[str, Any] = {}
    own_peak = _reset_peak()
    cuda = _cuda()
    if cuda is not None:
        cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        yield cost
    finally:
        cost["seconds"] = round(time.perf_counter() - started, 3)
        cost["peak_rss_mib"] = round(_peak_mib(), 1)
        cost["peak_rss_of"] = "stage" if own_peak else "process"
        cuda = _cuda()
        if cuda is not None:
            cost["peak_gpu_mib"] = round(cuda.max_memory_allocated() / 2**20, 1)
