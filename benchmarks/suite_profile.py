"""Where the test suite's time goes: each module's wall and CPU seconds on its pytest-xdist worker, and how busy the
cores were.

Loaded as a pytest plugin, it writes one JSON line per test (the worker, the module, its start and end, and the CPU
the worker spent on it: its own, and that of the processes it started and reaped: commands, rounds, servers), and
one line for the whole session (the machine's busy and idle core-seconds between the session's start and end, read
from /proc/stat). Run as a script, it reads that file back and prints the modules that cost most:

    SUITE_PROFILE=/tmp/suite.jsonl make test-only ARGS="-p benchmarks.suite_profile"
    .venv/bin/python benchmarks/suite_profile.py /tmp/suite.jsonl --top 25

A server a module shares with others (the session's vLLM server, a test harness's Prefect API) counts where it is
reaped; a process that another one reaps (a flow run under a Prefect worker) counts at its parent's end, or not at
all if the parent is killed. The figures are recorded in benchmarks/HISTORY.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

OUT_VARIABLE = "SUITE_PROFILE"


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of the children it has reaped."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _machine() -> tuple[float, float]:
    """Busy and idle core-seconds of the whole machine since boot (/proc/stat's first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / ticks, idle / ticks


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(OUT_VARIABLE)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")


_started: dict[str, tuple[float, float, float]] = {}
_session: dict[str, Any] = {}
# Whether this process runs the tests: a pytest-xdist worker, or the only process without workers. The controller
# of an xdist session also sees every test's reports, as its workers send them; those it does not record.
_runs_tests = [True]


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    _runs_tests[0] = not _is_controller(config) or not getattr(config.option, "numprocesses", None)


def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_controller(session.config):
        _session.update(start=time.time(), machine=_machine())


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _runs_tests[0]:
        _started[nodeid] = (time.time(), *_cpu())


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    start = _started.pop(nodeid, None)
    if start is None:
        return
    own, children = _cpu()
    _write(
        {
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "module": nodeid.split("::", 1)[0],
            "test": nodeid,
            "start": start[0],
            "end": time.time(),
            "own_cpu": own - start[1],
            "children_cpu": children - start[2],
        }
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_controller(session.config) and _session:
        busy, idle = _machine()
        _write(
            {
                "session": True,
                "start": _session["start"],
                "end": time.time(),
                "busy_core_s": busy - _session["machine"][0],
                "idle_core_s": idle - _session["machine"][1],
            }
        )


def summarize(path: Path, top: int) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tests = [r for r in records if "test" in r]
    sessions = [r for r in records if r.get("session")]
    if not tests:
        raise SystemExit(f"{path} holds no test record: run the suite with -p benchmarks.suite_profile first")
    t0 = min(r["start"] for r in tests)
    modules: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"start": float("inf"), "end": 0.0, "cpu": 0.0, "tests": 0, "worker": ""}
    )
    workers: dict[str, dict[str, float]] = defaultdict(lambda: {"end": 0.0, "cpu": 0.0})
    for r in tests:
        m = modules[r["module"]]
        m["start"], m["end"] = min(m["start"], r["start"]), max(m["end"], r["end"])
        m["cpu"] += r["own_cpu"] + r["children_cpu"]
        m["tests"] += 1
        m["worker"] = r["worker"]
        w = workers[r["worker"]]
        w["end"] = max(w["end"], r["end"] - t0)
        w["cpu"] += r["own_cpu"] + r["children_cpu"]
    lines = []
    if sessions:
        s = sessions[-1]
        wall = s["end"] - s["start"]
        total = s["busy_core_s"] + s["idle_core_s"]
        lines.append(
            f"session: {wall:.1f} s wall; the machine's cores busy {s['busy_core_s']:.0f} and idle "
            f"{s['idle_core_s']:.0f} core-seconds ({100 * s['idle_core_s'] / total:.0f}% idle)"
        )
    for name, w in sorted(workers.items()):
        lines.append(f"{name}: last test ended at {w['end']:.0f} s; {w['cpu']:.0f} CPU-seconds seen")
    lines.append(
        f"{len(tests)} tests in {len(modules)} modules, {sum(w['cpu'] for w in workers.values()):.0f} "
        "CPU-seconds seen in all"
    )
    lines.append("")
    lines.append("| module | worker | tests | wall s | CPU-s |")
    lines.append("|---|---|---:|---:|---:|")
    ranked = sorted(modules.items(), key=lambda kv: kv[1]["end"] - kv[1]["start"], reverse=True)
    for name, m in ranked[:top]:
        wall = m["end"] - m["start"]
        lines.append(f"| `{name}` | {m['worker']} | {m['tests']} | {wall:.1f} | {m['cpu']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="the file SUITE_PROFILE named")
    parser.add_argument("--top", type=int, default=20, help="modules to list, longest on their worker first")
    args = parser.parse_args(argv)
    print(summarize(args.records, args.top))


if __name__ == "__main__":
    main()
