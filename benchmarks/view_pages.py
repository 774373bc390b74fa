"""How long each page of `coevolve view` takes on a warehouse of at least 100,000 episodes (the goal: 1 s a page).

Builds a warehouse with `benchmarks/warehouse.py`'s synthetic records (2-6 steps an episode, tool calls with
results, 8 samples a task): ``--episodes`` over ``--rounds`` rounds of one run, each round with its pool,
signals on 5% of its episodes, 200 judged candidates, a stage record (with its cost) for every stage and a
finished round record. Then starts the real command, ``coevolve view --database FOLDER --port 0``, and fetches
every page over HTTP: the first fetch (cold) and the best of ``--repeats`` after it.

Run (from the repository root):

    .venv/bin/python benchmarks/view_pages.py                       # 100,000 episodes, 10 rounds
    .venv/bin/python benchmarks/view_pages.py --keep /tmp/view-bench  # keeps the warehouse (reused when there)

Prints one JSON object: the warehouse's size and, per page, cold and best seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.warehouse import GROUP, RUN, Records, make_task  # noqa: E402
from coevolve.records import Candidate, RoundSummary, Signal, Verdict  # noqa: E402
from coevolve.stages import STAGE_NAMES  # noqa: E402
from storage.warehouse import Warehouse  # noqa: E402

URL = re.compile(r"at (?P<url>http://127\.0\.0\.1:\d+/) ")


def build(root: Path, episodes: int, rounds: int, batch: int = 2048) -> dict[str, int]:
    """The warehouse at ``root``: ``episodes`` episodes over ``rounds`` rounds, with every record a round keeps."""
    records, rng = Records(), random.Random(1)
    per_round = episodes // rounds // GROUP  # tasks per round
    with Warehouse(root) as wh:
        wh.ensure_run(RUN, {"rollout": {"group_size": GROUP}, "environment": {"name": "bfcl"}})
        for round_ in range(rounds):
            first = round_ * per_round // 2  # half of this round's tasks were played the round before
            tasks = [make_task(i, round_) for i in range(first, first + per_round)]
            wh.write_tasks(tasks)
            wh.set_pool(RUN, round_, [t.task_id for t in tasks])
            pending = []
            for task in tasks:
                skill = rng.random()
                pending += [records.trajectory(round_, task.task_id, s, skill) for s in range(GROUP)]
                if len(pending) >= batch:
                    wh.write_trajectories(pending)
                    pending = []
            if pending:
                wh.write_trajectories(pending)
            picked = tasks[: len(tasks) * GROUP // 20]
            kinds = ("boundary", "rare", "forgetting")
            signals = [
                Signal(
                    RUN, round_, kinds[i % 3], f"{RUN}/r{round_}/{t.task_id}/s{i % GROUP}", t.task_id, {"score": 0.0}
                )
                for i, t in enumerate(picked)
            ]
            wh.write_signals(signals)
            made = [make_task(10_000_000 + round_ * 1000 + i, round_ + 1) for i in range(min(200, len(signals)))]
            wh.write_tasks(made)
            wh.write_candidates(RUN, round_, [
                Candidate(task, s.signal_id, Verdict(i % 2 == 0, "ok" if i % 2 == 0 else "duplicate of a pool task"))
                for i, (task, s) in enumerate(zip(made, signals, strict=False))
            ])  # fmt: skip
            wh.start_round(RUN, round_, "bench-flow")
            for stage in STAGE_NAMES:
                output: dict = {"trajectories": per_round * GROUP} if stage == "rollout" else {}
                if stage == "update":
                    output = {"checkpoint": "c", "stats": {"steps": 2, "groups": per_round // 2, "groups_flat": 3}}
                wh.mark_stage(RUN, round_, stage, output, cost={"seconds": 1.0 + rng.random(), "peak_rss_mib": 900.0})
            summary = RoundSummary(
                run_id=RUN, round=round_, pool_size=len(tasks), rollouts=per_round * GROUP, success_rate=0.4,
                signals={"boundary": len(signals) // 3}, accepted=100, rejected=100,
                heldout_success=0.1 + 0.02 * round_, optimizer_steps=2,
            )  # fmt: skip
            wh.finish_round(RUN, round_, summary)
        counts = wh.sql("SELECT count(*) AS episodes, sum(num_steps) AS steps FROM trajectories").to_dicts()[0]
    return {"episodes": int(counts["episodes"]), "steps": int(counts["steps"]), "rounds": rounds}


def pages(root: Path) -> list[str]:
    """The pages to time, with real ids of the warehouse."""
    with Warehouse.for_queries(root) as wh:
        last = wh.sql("SELECT max(round) AS r FROM trajectories").item()
        episode = wh.sql(f"SELECT trajectory_id FROM trajectories WHERE round = {last} LIMIT 1").item()
        seed = wh.sql(f"SELECT task_id FROM trajectories WHERE round = {last} LIMIT 1").item()
        made = wh.sql("SELECT task_id FROM candidates WHERE accepted LIMIT 1").item()
    return [
        "",
        f"runs/{RUN}/rounds/{last}",
        "episodes",
        f"episodes?round={last}&tool=mkdir&success=1",
        f"episodes/{episode}",
        "tasks",
        "tasks?kind=boundary&verdict=accepted",
        f"tasks/{made}",
        f"tasks/{seed}",
    ]


def time_pages(root: Path, repeats: int) -> dict[str, dict[str, float]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "view", "--database", str(root), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 120)
        match = URL.search(process.stdout.readline()) if ready else None
        if match is None:
            raise SystemExit(f"coevolve view did not start: {process.stderr.read() if process.stderr else ''}")
        figures = {}
        with httpx.Client(base_url=match["url"], timeout=120) as client:
            for page in pages(root):
                seconds = []
                for _ in range(1 + repeats):
                    started = time.perf_counter()
                    response = client.get("/" + page)
                    seconds.append(time.perf_counter() - started)
                    response.raise_for_status()
                figures["/" + page] = {
                    "cold_s": round(seconds[0], 3),
                    "best_s": round(min(seconds[1:]), 3),
                    "kb": round(len(response.content) / 1024),
                }
        return figures
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="Folder to build the warehouse in and keep (reused when there).")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="view-bench-"))
    root = folder / "warehouse"
    try:
        started = time.perf_counter()
        size: dict[str, float] = dict(
            build(root, args.episodes, args.rounds)
            if not root.exists()
            else {"episodes": args.episodes, "rounds": args.rounds, "reused": 1}
        )
        size["build_s"] = round(time.perf_counter() - started, 1)
        figures = time_pages(root, args.repeats)
        print(json.dumps({"warehouse": size, "pages": figures}, indent=1))
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
