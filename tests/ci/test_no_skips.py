"""REQUIRE_ALL_TESTS=1 (`make test`): every way a test can skip is a failure naming why, in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.no_skips import SWITCH

REPO = Path(__file__).resolve().parents[2]

SKIPPING = """
import pytest


def test_runs():
    pass


def test_calls_skip():
    pytest.skip("a tmpfs needs root")


@pytest.mark.skipif(True, reason="resident memory is read from /proc")
def test_marked_skipif():
    pass
"""

IMPORT_SKIPPING = """
import pytest

pytest.importorskip("no_such_module_for_this_test")


def test_never_collected():
    pass
"""


def _pytest(folder: Path, switch: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), SWITCH: switch}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.no_skips", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(folder), "-q", "-rs", "-n", "0", str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_without_the_switch_a_test_that_cannot_run_skips_saying_why(tmp_path):
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "test_import_skipping.py").write_text(IMPORT_SKIPPING)
    done = _pytest(tmp_path, "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 3 skipped" in done.stdout and "a tmpfs needs root" in done.stdout


def test_under_the_switch_every_skip_fails_with_its_reason(tmp_path):
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    done = _pytest(tmp_path, "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed, 1 error" in done.stdout
    for reason in ("a tmpfs needs root", "resident memory is read from /proc"):
        assert f"{SWITCH}=1 allows no skip: Skipped: {reason}" in done.stdout


def test_under_the_switch_a_module_that_imports_nothing_it_needs_fails_the_collection(tmp_path):
    (tmp_path / "test_import_skipping.py").write_text(IMPORT_SKIPPING)
    done = _pytest(tmp_path, "1")
    assert done.returncode != 0 and "skipped" not in done.stdout.splitlines()[-1], done.stdout
    assert "could not import 'no_such_module_for_this_test'" in done.stdout
