"""benchmarks/suite_profile.py: a real pytest session on two workers records each test's module, worker, wall and
CPU once, the CPU of the processes a test reaps included, and the summary ranks the modules by their wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite_profile import summarize

REPO = Path(__file__).resolve().parents[2]

MODULES = {
    "test_busy.py": (
        "import subprocess, sys\n"
        "def test_a_child_computes():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(1_500_000))'], check=True)\n"
    ),
    "test_waits.py": (
        "import time\ndef test_one_waits():\n    time.sleep(1.0)\ndef test_two_waits():\n    time.sleep(1.0)\n"
    ),
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("suite-profile")
    for name, text in MODULES.items():
        (folder / name).write_text(text)
    records = folder / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SUITE_PROFILE": str(records)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
         "-p", "benchmarks.suite_profile", "--rootdir", str(folder), str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return records


def test_each_test_is_recorded_once_by_the_worker_that_ran_it_and_the_session_once(profiled):
    records = [json.loads(line) for line in profiled.read_text().splitlines()]
    tests = sorted(r["test"] for r in records if "test" in r)
    assert tests == [
        "test_busy.py::test_a_child_computes",
        "test_waits.py::test_one_waits",
        "test_waits.py::test_two_waits",
    ]
    assert {r["worker"] for r in records if "test" in r} <= {"gw0", "gw1"}
    (session,) = [r for r in records if r.get("session")]
    assert session["busy_core_s"] > 0 and session["idle_core_s"] >= 0


def test_a_tests_cpu_includes_the_processes_it_reaped_and_a_wait_costs_wall_not_cpu(profiled):
    records = {r["test"].split("::")[1]: r for r in map(json.loads, profiled.read_text().splitlines()) if "test" in r}
    child = records["test_a_child_computes"]
    assert child["children_cpu"] > 0.05 and child["children_cpu"] > child["own_cpu"]
    waited = records["test_one_waits"]
    assert waited["end"] - waited["start"] >= 1.0 and waited["own_cpu"] + waited["children_cpu"] < 0.3


def test_the_summary_ranks_modules_by_their_wall_time_on_their_worker(profiled):
    table = summarize(profiled, top=5).split("| module |")[1].splitlines()[2:]
    assert [row.split("`")[1] for row in table] == ["test_waits.py", "test_busy.py"]
    assert "| 2 |" in table[0]  # the module's two tests
