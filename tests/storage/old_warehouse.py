"""A single-file warehouse (``warehouse.duckdb``, layout version 2) as the release before the open-table
layout left it, built in code: the input of the conversion tests (the ``old_warehouse`` fixture)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import duckdb

from coevolve.records import RoundSummary, Step, Task, ToolCall, Trajectory
from storage.single_file_schema import SINGLE_FILE_MIGRATIONS

STAMP = datetime(2026, 3, 1, 12, 30, 15, 250000)


def create_old_file(path: Path) -> None:
    """An empty warehouse file as the single-file release left it: every migration applied and recorded."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP)")
    for version, sql in SINGLE_FILE_MIGRATIONS:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, STAMP])
    con.close()


def old_trajectory(trajectory: Trajectory) -> tuple[list[object], list[list[object]]]:
    """The trajectories row and the steps rows the single-file release wrote for a trajectory."""
    t = trajectory
    head = [t.trajectory_id, t.run_id, t.round, t.task_id, t.sample, t.reward, t.success, t.finish_reason, len(t.steps),
            t.tool_sequence, t.prompt_ids, t.completion_ids, t.completion_mask, t.logprobs, t.duration_s]  # fmt: skip
    steps = [
        [t.trajectory_id, i, s.index, s.turn, s.model_text, json.dumps([c.to_dict() for c in s.calls], default=str),
         [c.name for c in s.calls], list(s.observations), s.error, s.completion_tokens]
        for i, s in enumerate(t.steps)
    ]  # fmt: skip
    return head, steps


def summary(run_id: str, round_: int) -> RoundSummary:
    return RoundSummary(
        run_id=run_id, round=round_, pool_size=3, rollouts=4, success_rate=0.5, signals={"boundary": 1, "rare": 0},
        accepted=1, rejected=2, heldout_success=0.25, pool_digest="ab" * 32, checkpoint="/ckpt/1", model_version="1",
        flow_run_id="flow-1", durations_s={"rollout": 1.5, "update": 2.25},
    )  # fmt: skip


def write_old_warehouse(
    tmp_path: Path, make_task: Callable[..., Task], make_trajectory: Callable[..., Trajectory]
) -> dict[str, object]:
    """A version-2 warehouse file holding a few rows of every table, and the records they came from."""
    path = tmp_path / "state" / "warehouse.duckdb"
    path.parent.mkdir()
    create_old_file(path)
    tasks = [make_task(0), make_task(1), make_task(2, origin="boundary", round=0, tools=("touch", "ls"))]
    odd = Step(
        turn=1, index=3, model_text="écrire(\"x\")",
        calls=[ToolCall("touch", {"file_name": "résumé.txt", "mode": 0.1, "nested": {"b": [1, None], "a": "x"}}),
               ToolCall("ls", {})],
        observations=["ok", "Error: nope"], completion_tokens=11,
    )  # fmt: skip
    trajectories = [
        make_trajectory(tasks[0].task_id, 0, True),
        make_trajectory(tasks[0].task_id, 1, False),
        make_trajectory(tasks[1].task_id, 0, True, tools=("ls",)),
        make_trajectory(tasks[2].task_id, 0, False, round=1),
        make_trajectory(tasks[1].task_id, 0, True, run_id="run-b"),
    ]
    trajectories[1].steps.append(odd)
    summaries = [summary("run-a", 0)]
    con = duckdb.connect(str(path))
    con.execute(
        "INSERT INTO runs VALUES ('run-a', ?, ?), ('run-b', ?, ?)",
        [STAMP, json.dumps({"seed": 3, "pool": {"seed_size": 12}, "name": "ü"}), STAMP, json.dumps({})],
    )
    con.execute(
        "INSERT INTO rounds VALUES ('run-a', 0, 'finished', ?, 'flow-1', ?, ?), "
        "('run-a', 1, 'running', NULL, 'flow-2', ?, NULL)",
        [json.dumps(summaries[0].to_dict()), STAMP, STAMP, STAMP],
    )
    con.executemany(
        "INSERT INTO stage_runs VALUES (?, ?, ?, ?, ?)",
        [["run-a", 0, "rollout", STAMP, json.dumps({"rollouts": 4})],
         ["run-a", 0, "mine", STAMP, json.dumps({"signals": {"rare": 0, "boundary": 1}})],
         ["run-a", 1, "rollout", STAMP, json.dumps({"rollouts": 1, "ids": ["a", "b"]})]],
    )  # fmt: skip
    con.executemany(
        "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [[t.task_id, t.environment, t.provenance.origin, t.provenance.round, t.provenance.parent_trajectory_id,
          t.provenance.signal_id, t.content_hash, json.dumps(t.to_dict(), default=str), t.tools] for t in tasks],
    )  # fmt: skip
    pools = {
        ("run-a", 0): [tasks[1].task_id, tasks[0].task_id],
        ("run-a", 1): [tasks[2].task_id, tasks[1].task_id, tasks[0].task_id],
        ("run-a", -1): [tasks[2].task_id],
        ("run-b", 0): [tasks[1].task_id],
    }
    con.executemany(
        "INSERT INTO pool_membership VALUES (?, ?, ?, ?)",
        [[run, rnd, pos, tid] for (run, rnd), ids in pools.items() for pos, tid in enumerate(ids)],
    )
    for t in trajectories:
        head, steps = old_trajectory(t)
        con.execute("INSERT INTO trajectories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", head)
        con.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", steps)
    bid = trajectories[1].trajectory_id
    con.executemany(
        "INSERT INTO signals VALUES (?, ?, ?, ?, ?, ?, ?)",
        [[f"boundary:{bid}", "run-a", 0, "boundary", bid, tasks[0].task_id, json.dumps({"rate": 0.5, "n": 2})],
         [f"rare:{bid}", "run-a", 0, "rare", bid, tasks[0].task_id, json.dumps({"tools": ["touch"]})]],
    )  # fmt: skip
    con.executemany(
        "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [["run-a", 0, tasks[2].task_id, f"boundary:{bid}", f"boundary:{bid}", "boundary", True, "valid",
          json.dumps(tasks[2].to_dict())],
         ["run-a", 0, tasks[1].task_id, "", None, "random", False, "unsolvable", json.dumps(tasks[1].to_dict())],
         ["run-a", 1, tasks[0].task_id, "", None, "random", None, None, json.dumps(tasks[0].to_dict())]],
    )  # fmt: skip
    con.executemany(
        "INSERT INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?)",
        [["run-a", 0, "heldout", tasks[2].task_id, True, 1.0, "run-a/r-1/x/s0"],
         ["run-a", 0, "multi_turn_base", "multi_turn_base_0", False, 0.0, None],
         ["run-a", -2, "multi_turn_base", "multi_turn_base_0", True, 1.0, None]],
    )  # fmt: skip
    con.close()
    return {"path": path, "tasks": tasks, "trajectories": trajectories, "pools": pools, "summaries": summaries}


EXPECTED_ROWS = {"runs": 2, "rounds": 2, "stage_runs": 3, "tasks": 3, "pool_membership": 7, "trajectories": 5,
                 "steps": 11, "signals": 2, "candidates": 3, "evaluations": 3}  # fmt: skip
