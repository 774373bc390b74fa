"""The training step's goal measure for two revisions, alternately: round 0 of `evolve` at 12 steps minus 2 steps, / 10.

Each revision is exported with ``git archive`` into a temporary folder and run from there with this checkout's
interpreter (``python -m flows.cli evolve --rounds 1``, the default configuration, ``training.batches_per_round``
12 and 2, a fresh state folder each time). A round's time is the span between its log's "Beginning" and
"Finished" lines of the ``round-0`` flow run, so start-up and the command's own exit are left out. The revisions
alternate within each pass, so a machine whose speed drifts slows both alike; the round table's row for round 0
is printed too, so a change that alters what is learned shows.

    .venv/bin/python benchmarks/step_time.py --before a5d777c --after HEAD --passes 2

Prints one line per pass and revision, then one JSON line; figures go in benchmarks/STEP.md and HISTORY.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from coevolve.settings import OFFLINE_ENV

REPO = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"(\d\d:\d\d:\d\d,\d+) INFO\s+prefect\.flow_runs \[round-0\] - Beginning (?:sub)?flow run")
END = re.compile(r"(\d\d:\d\d:\d\d,\d+) INFO\s+prefect\.flow_runs \[round-0\] - Finished in state Completed")
ROUND_ROW = re.compile(r"^\s+0\s+\d+\s+\d+\s")


def export(revision: str, folder: Path) -> Path:
    """The tree of ``revision`` in ``folder``."""
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def clock(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp.replace(",", "."), "%H:%M:%S.%f")


def round0(tree: Path, steps: int, scratch: Path) -> tuple[float, str]:
    """Seconds of round 0 at ``steps`` training steps, and its row of the round table."""
    state = Path(tempfile.mkdtemp(prefix="state-", dir=scratch))
    command = [sys.executable, "-m", "flows.cli", "evolve", "--rounds", "1", "--set", f"state_dir={state}"]
    command += ["--set", f"training.batches_per_round={steps}"]
    try:
        done = subprocess.run(command, cwd=tree, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True)
        logs = "".join(path.read_text() for path in sorted((state / "logs").glob("*.log")))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    begin, end = BEGIN.search(logs), END.findall(logs)
    if done.returncode or begin is None or not end:
        raise SystemExit(f"round 0 at {steps} steps failed in {tree}:\n{(done.stdout + done.stderr)[-3000:]}")
    rows = [line.strip() for line in done.stdout.splitlines() if ROUND_ROW.match(line)]
    return (clock(end[-1]) - clock(begin.group(1))).total_seconds(), rows[-1] if rows else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision measured first in each pass")
    parser.add_argument("--after", default="HEAD", help="git revision measured second in each pass")
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="step-time-"))
    try:
        trees = {name: export(rev, scratch / name) for name, rev in (("before", args.before), ("after", args.after))}
        steps: dict[str, list[float]] = {"before": [], "after": []}
        for number in range(args.passes):
            for name, tree in trees.items():
                long, long_row = round0(tree, 12, scratch)
                short, short_row = round0(tree, 2, scratch)
                steps[name].append(round((long - short) / 10, 3))
                print(f"pass {number + 1} {name}: 12 steps {long:.2f} s, 2 steps {short:.2f} s, a step "
                      f"{steps[name][-1]:.3f} s | {long_row} | {short_row}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in steps.items()}
    print(json.dumps({"before": args.before, "after": args.after, "step_s": steps, "median_s": medians,
                      "after_over_before": round(medians["after"] / medians["before"], 3),
                      "load_average": os.getloadavg()}))  # fmt: skip


if __name__ == "__main__":
    main()
