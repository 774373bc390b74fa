"""CPU of one tiny `coevolve round` from the command line: this checkout against another commit, alternating.

Each run is ``python -m flows.cli round --round 0`` on the tests' tiny configuration (`tests.conftest.make_tiny_config`)
in a new state folder and a new Prefect home, as a user's first round is; checkpoint 0 is built once beforehand
into a policy cache both trees share, so every run measures the command and not the policy's build. The CPU is the
command's and every process it reaped (its temporary Prefect API), read with ``getrusage(RUSAGE_CHILDREN)``; ``gc_s``
is the part of the command's own CPU that Python's cycle collector took (every collection timed by
benchmarks/gc_clock.py), and ``collections`` how many full (generation 2) collections it made. The other commit
runs from a git worktree made for the run and removed after it, with this checkout's environment.

    PYTHONPATH=. .venv/bin/python benchmarks/command_cpu.py --base 7b9acdd --repeats 3

Prints one JSON line per run and one summary line (medians); the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from coevolve.settings import OFFLINE_ENV
from tests.conftest import make_tiny_config

REPO = Path(__file__).resolve().parents[1]
# `coevolve ARGS` with every cycle collection timed (benchmarks/gc_clock.py), its figures written to the file named
# first when the command exits.
TIMED_COLLECTIONS = """
import atexit, json, runpy, sys
import gc_clock
gc_clock.start()
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(gc_clock.figures())))
sys.argv = ["coevolve", *sys.argv[2:]]
runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)
"""


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_round(tree: Path, folder: Path, cache: Path) -> dict[str, float]:
    """One `coevolve round --round 0` from ``tree`` in the new state folder ``folder``: wall and CPU seconds."""
    config = make_tiny_config(folder / "state").model_dump(mode="json")
    config["policy_cache_dir"] = str(cache)
    config_file = folder / "tiny.yaml"
    folder.mkdir(parents=True)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(OFFLINE_ENV, PREFECT_HOME=str(folder / "prefect"), BFCL_PROJECT_ROOT=str(folder / "bfcl"))
    # The tree's own packages before the checkout's editable install; gc_clock from this checkout's benchmarks/.
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(REPO / "benchmarks")])
    collections = folder / "collections.json"
    round_0 = ["round", "--round", "0", "--config", str(config_file)]
    command = [sys.executable, "-c", TIMED_COLLECTIONS, str(collections), *round_0]
    cpu_before, started = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    wall_s, cpu_s = time.perf_counter() - started, children_cpu_s() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {tree}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    timed = json.loads(collections.read_text())
    gc_s = sum(timed["collector_s"].values())
    full = timed["collections"]["2"]
    return {"wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1), "gc_s": round(gc_s, 2), "collections": full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare this checkout with")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="command-cpu-") as scratch:
        root = Path(scratch)
        base = root / "base"
        subprocess.run(["git", "worktree", "add", "--quiet", "--detach", str(base), args.base], cwd=REPO, check=True)
        try:
            trees = {args.base: base, "checkout": REPO}
            cache = root / "policy-cache"
            run_round(REPO, root / "warm-up", cache)  # builds checkpoint 0 into the shared cache; not counted
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for repeat in range(args.repeats):
                for name, tree in trees.items():
                    figures = run_round(tree, root / f"{repeat}-{tree.name}", cache)
                    runs[name].append(figures)
                    print(json.dumps({"tree": name, "repeat": repeat, **figures}), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=True)
    median = {
        name: {key: statistics.median(r[key] for r in rows) for key in ("wall_s", "cpu_s", "gc_s", "collections")}
        for name, rows in runs.items()
    }
    print(json.dumps({"median": median, "repeats": args.repeats}))


if __name__ == "__main__":
    main()
