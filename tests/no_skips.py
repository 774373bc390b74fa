"""One switch, ``REQUIRE_ALL_TESTS=1`` (``make test`` sets it): a test that would skip fails instead, with the reason.

A developer's machine may lack what a few tests need: root (the full-disk tests mount a small tmpfs), the vLLM
environment and the SmolLM2 package, the object-store test's s3fs, moto and boto3, the MiniLM package, the
repository's full git history. There those tests skip and say why. A CI machine must not pass quietly with one of
them missing, so under the switch every skip, whatever raised it (``pytest.skip``, a ``skipif`` mark, an
``importorskip`` of a whole module), is reported as a failure naming what was missing. Tests left out on purpose
are deselected, not skipped (the exhaustive crash tests, tests/conftest.py), so the switch does not touch them.

tests/conftest.py takes these hooks in; ``python -m pytest -p tests.no_skips`` loads them alone
(tests/ci/test_no_skips.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

SWITCH = "REQUIRE_ALL_TESTS"


def required() -> bool:
    """Whether this session allows no skip."""
    return os.environ.get(SWITCH) == "1"


def _failed_instead(report: pytest.TestReport | pytest.CollectReport) -> None:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped, but {SWITCH}=1 allows no skip: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    if report.skipped and required():
        _failed_instead(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    if report.skipped and required():
        _failed_instead(report)
    return report
