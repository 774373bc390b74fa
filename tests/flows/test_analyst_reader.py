"""An analyst's read session held open for a whole round neither stops nor slows the round, and sees its rows.

The analyst is a separate process with one DuckDB session (`Warehouse(root, read_only=True).connect()`)
opened before the round starts and kept until the round is over, querying now and then. The round
runs through the real CLI in its own process. Nothing holds a lock, so every stage runs once (no
retry, no stage redone) and the analyst's next query in the same session sees the round's rows.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from coevolve.stages import STAGE_NAMES
from storage.warehouse import Warehouse
from tests.flows.conftest import REPO, cli_env

pytestmark = pytest.mark.slow

STAGES = STAGE_NAMES

# Reads a command per line on stdin ("query" or "quit") and answers each with one JSON line, in one
# session opened at start. Between commands it keeps querying on its own, as an analyst would.
ANALYST = """
import json, select, sys, time
from storage.warehouse import Warehouse

root, run = sys.argv[1], sys.argv[2]
con = Warehouse(root, read_only=True).connect()

def look():
    return {
        "trajectories": con.execute("SELECT count(*) FROM trajectories WHERE run_id = ?", [run]).fetchone()[0],
        "steps": con.execute("SELECT count(*) FROM steps WHERE run_id = ?", [run]).fetchone()[0],
        "stages": sorted(r[0] for r in con.execute("SELECT stage FROM stage_runs WHERE run_id = ?", [run]).fetchall()),
        "rounds": con.execute(
            "SELECT count(*) FROM rounds WHERE run_id = ? AND status = 'finished'", [run]
        ).fetchone()[0],
    }

print(json.dumps(look()), flush=True)
queries = 0
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.5)
    if not ready:
        look()  # an analyst's query in the middle of the round
        queries += 1
        continue
    command = sys.stdin.readline().strip()
    if command == "quit" or not command:
        break
    print(json.dumps({**look(), "queries": queries}), flush=True)
con.close()
"""


def test_a_read_session_open_across_a_round_blocks_nothing_and_sees_the_new_rows(tiny_config, cli, tmp_path) -> None:
    config = tiny_config(tmp_path / "state")
    config_file = cli.write_config_file(config, tmp_path / "config.yaml")
    config.state_dir.mkdir(parents=True, exist_ok=True)
    Warehouse(config.warehouse_path).close()  # the warehouse exists before the analyst opens it
    log = tmp_path / "round.log"

    analyst = subprocess.Popen(
        [sys.executable, "-c", ANALYST, str(config.warehouse_path), config.run_id],
        cwd=REPO, env=cli_env(config.state_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    round_ = None
    try:
        before = json.loads(analyst.stdout.readline() or "null")
        assert before == {"trajectories": 0, "steps": 0, "stages": [], "rounds": 0}, analyst.stderr.read()

        round_ = cli.start_round(config_file, config.state_dir, 0, log)
        cli.wait_for_stage(config, 0, "rollout", round_)
        analyst.stdin.write("query\n")
        analyst.stdin.flush()
        during = json.loads(analyst.stdout.readline() or "null")
        assert round_.wait(timeout=600) == 0, log.read_text()[-3000:]

        analyst.stdin.write("query\n")
        analyst.stdin.flush()
        after = json.loads(analyst.stdout.readline() or "null")
        analyst.stdin.write("quit\n")
        analyst.stdin.flush()
        assert analyst.wait(timeout=60) == 0, analyst.stderr.read()
    finally:
        if round_ is not None and round_.poll() is None:
            cli.kill_group(round_)
        if analyst.poll() is None:
            analyst.kill()
            analyst.wait()

    with Warehouse(config.warehouse_path, read_only=True) as wh:
        stored = wh.sql(
            f"SELECT count(*) AS t, (SELECT count(*) FROM steps WHERE run_id = '{config.run_id}') AS s "
            f"FROM trajectories WHERE run_id = '{config.run_id}'"
        ).row(0)
    expected_trajectories = config.rollout.tasks_per_batch * config.rollout.group_size

    assert during is not None and "rollout" in during["stages"] and during["trajectories"] == expected_trajectories
    assert after is not None and after["queries"] > 0, "the analyst kept querying while the round ran"
    assert (after["trajectories"], after["steps"]) == stored and stored[0] == expected_trajectories
    assert after["stages"] == sorted(STAGES) and after["rounds"] == 1

    # Every stage ran exactly once, as the round's own Prefect database records its task runs:
    # one run each, one attempt, Pending -> Running -> Completed, no retry or failure in between.
    database = sqlite3.connect(config.state_dir / "prefect" / "prefect.db")
    try:
        runs = database.execute("SELECT id, name, state_type, run_count FROM task_run").fetchall()
        histories = {
            name.rsplit("-", 1)[0]: [r[0] for r in database.execute(
                "SELECT type FROM task_run_state WHERE task_run_id = ? ORDER BY timestamp", [run_id])]
            for run_id, name, _, _ in runs
        }  # fmt: skip
    finally:
        database.close()
    assert sorted(name.rsplit("-", 1)[0] for _, name, _, _ in runs) == sorted(STAGES)
    assert all(state == "COMPLETED" and count == 1 for _, _, state, count in runs), runs
    assert all(history == ["PENDING", "RUNNING", "COMPLETED"] for history in histories.values()), histories
