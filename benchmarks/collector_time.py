"""A pytest plugin that reports how much of the test process's CPU Python's cycle collector took.

Every collection is timed through ``gc.callbacks`` (CPU seconds, by generation); at the end of the session the plugin
prints one JSON line on standard error: the collector's seconds and collections by generation, after collection and
in all, and the process's own CPU seconds. Run the same modules in one process on two trees to compare them:

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -q -p no:cacheprovider -p collector_time \\
        tests/envs/test_bfcl_prompts.py tests/tasks/test_report.py tests/tasks/test_inference.py \\
        tests/tasks/test_policy_cache.py

The figures are recorded in benchmarks/README.md ("What freezing at a process's start cut").
"""

from __future__ import annotations

import gc
import json
import sys
import time

import pytest

_SECONDS = {0: 0.0, 1: 0.0, 2: 0.0}
_COUNTS = {0: 0, 1: 0, 2: 0}
_STARTED: list[float] = []
_AFTER_COLLECTION: dict[str, object] = {}


def _timed(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _STARTED.append(time.process_time())
        return
    generation = info["generation"]
    _SECONDS[generation] += time.process_time() - _STARTED.pop()
    _COUNTS[generation] += 1


gc.callbacks.append(_timed)


def _figures() -> dict[str, object]:
    return {
        "collector_s": {str(g): round(s, 2) for g, s in _SECONDS.items()},
        "collections": {str(g): n for g, n in _COUNTS.items()},
        "process_cpu_s": round(time.process_time(), 1),
    }


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _AFTER_COLLECTION.update(_figures())


def pytest_unconfigure(config: pytest.Config) -> None:
    sys.stderr.write(json.dumps({"after_collection": _AFTER_COLLECTION, "in_all": _figures()}) + "\n")
