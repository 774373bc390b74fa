"""A pytest plugin that reports how much of the test process's CPU Python's cycle collector took.

Every collection is timed (benchmarks/gc_clock.py: CPU seconds, by generation); at the end of the session the plugin
prints one JSON line on standard error: the collector's seconds and collections by generation, after collection and
in all, and the process's own CPU seconds. Run the same modules in one process on two trees to compare them:

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -q -p no:cacheprovider -p collector_time \\
        tests/envs/test_bfcl_prompts.py tests/tasks/test_report.py tests/tasks/test_inference.py \\
        tests/tasks/test_policy_cache.py

The figures are recorded in benchmarks/HISTORY.md.
"""

from __future__ import annotations

import json
import sys

import gc_clock
import pytest

_AFTER_COLLECTION: dict[str, object] = {}
gc_clock.start()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _AFTER_COLLECTION.update(gc_clock.figures())


def pytest_unconfigure(config: pytest.Config) -> None:
    sys.stderr.write(json.dumps({"after_collection": _AFTER_COLLECTION, "in_all": gc_clock.figures()}) + "\n")
