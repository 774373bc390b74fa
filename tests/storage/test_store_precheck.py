"""The check a round makes of its stores before its first stage (storage/store_check.py).

A real state folder (a warehouse with a run's records and files, a real MLflow SQLite store) is damaged in one
place at a time: the check refuses it with one line naming the file, and following that line's fix (run as
printed) gives a state folder the check passes and the stores open. tests/flows/test_round_store_failures.py
runs a whole round through the same refusal and fix.
"""

from __future__ import annotations

import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.config import PipelineConfig
from coevolve.errors import DataError
from storage.store_check import check_round_stores
from storage.tracking import Tracker
from storage.warehouse import Warehouse

RUN = "run-a"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> str:
    """One MLflow store for the tests that damage the warehouse: a new store takes seconds to create."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def state(tmp_path, make_task, make_trajectory, shared_store) -> PipelineConfig:
    """A state folder whose run finished its rollout of round 0 (warehouse rows and records), tracked in
    ``shared_store``."""
    config = PipelineConfig(state_dir=tmp_path / "state", run_id=RUN, tracking={"mlflow_uri": shared_store})
    tasks = [make_task(i) for i in range(6)]
    with Warehouse(config.warehouse_path) as wh:
        wh.ensure_run(RUN, {"run_id": RUN})
        wh.write_tasks(tasks)
        wh.set_pool(RUN, 0, [t.task_id for t in tasks])
        wh.start_round(RUN, 0, "flow-run-0")
        wh.write_trajectories([make_trajectory(t.task_id, s, s == 0) for t in tasks for s in range(2)])
        wh.mark_stage(RUN, 0, "rollout", {"rollouts": 12})
    return config


def make_store(config: PipelineConfig) -> tuple[PipelineConfig, Path]:
    """``config`` with its own MLflow store (state_dir/mlflow.db) as a round leaves it, made by another process:
    this one then holds no connection to it (MLflow keeps one per store), as a round started after the damage."""
    config = config.with_overrides({"tracking": {"mlflow_uri": None}})
    code = (
        "import sys; from storage.tracking import Tracker; "
        "Tracker(sys.argv[1], sys.argv[2], sys.argv[3]).client.create_registered_model(sys.argv[4])"
    )
    subprocess.run(
        [sys.executable, "-c", code, config.mlflow_tracking_uri, config.tracking.experiment,
         str(config.artifacts_dir), config.registered_model_name],
        cwd=REPO, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return config, config.state_dir / "mlflow.db"


def check(config: PipelineConfig) -> None:
    with Warehouse(config.warehouse_path) as wh:
        check_round_stores(config, wh)


def refused(config: PipelineConfig, damaged: Path) -> str:
    """The check's message: one line, naming the damaged file."""
    with pytest.raises(DataError) as caught:
        check(config)
    message = str(caught.value)
    assert "\n" not in message and str(damaged) in message, message
    return message


def follow(message: str) -> None:
    """Do what the message says: the printed `mv`, and deleting the stage record it names."""
    (mv,) = re.findall(r"\(mv (\S+) (\S+)\)", message)
    subprocess.run(["mv", *mv], check=True)
    for record in re.findall(r"delete the record of the stage that wrote it[^(]*\((\S+\.json)\)", message):
        Path(record).unlink()


def test_a_healthy_state_folder_passes(state):
    check(state)


def test_an_mlflow_store_with_a_damaged_header_is_refused_and_moving_it_aside_gives_a_working_store(state):
    state, store = make_store(state)
    data = bytearray(store.read_bytes())
    data[:100] = random.Random(0).randbytes(100)
    store.write_bytes(bytes(data))
    message = refused(state, store)
    assert "from a backup" in message and f"mv {store} {store}.damaged" in message
    follow(message)
    check(state)
    tracker = Tracker(state.mlflow_tracking_uri, state.tracking.experiment, state.artifacts_dir)
    assert tracker.client.get_experiment(tracker.experiment_id).name == state.tracking.experiment
    assert Path(f"{store}.damaged").read_bytes() == bytes(data), "the damaged store is kept as it was"


def test_a_damaged_page_inside_the_mlflow_store_is_found_before_the_round_not_when_the_version_stage_writes_it(state):
    state, store = make_store(state)
    con = sqlite3.connect(store)
    page_size = con.execute("PRAGMA page_size").fetchall()[0][0]
    (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'model_versions'").fetchall()[0]
    con.close()
    data = bytearray(store.read_bytes())
    data[(root - 1) * page_size : root * page_size] = random.Random(1).randbytes(page_size)
    store.write_bytes(bytes(data))
    # What opening the store reads (its schema version, the experiment) is intact: MLflow would meet the damage
    # only when the version stage registers the round's checkpoint.
    con = sqlite3.connect(store)
    assert con.execute("SELECT count(*) FROM alembic_version").fetchall() == [(1,)]
    assert con.execute("SELECT name FROM experiments WHERE name = ?", [state.tracking.experiment]).fetchall()
    con.close()
    message = refused(state, store)
    assert "malformed" in message
    follow(message)
    check(state)


@pytest.mark.parametrize(
    "record", ["runs/run-a.json", "rounds/run_id=run-a/0.json", "stage_runs/run_id=run-a/round=0/rollout.json"]
)
@pytest.mark.parametrize("content", [b"\x00\x13" * 300, b'{"run_id": "run-a", "sta', b"[1, 2]"])
def test_a_damaged_warehouse_record_is_refused_and_the_round_writes_it_anew_once_moved_aside(state, record, content):
    path = state.warehouse_path / "catalog" / record
    path.write_bytes(content)
    message = refused(state, path)
    assert "from a backup" in message and "untouched" in message
    if not record.startswith("runs/"):
        assert "coevolve round --round 0" in message
    follow(message)
    check(state)
    with Warehouse(state.warehouse_path) as wh:
        # What the round's start and its stages do with the record gone: they write it anew.
        if record.startswith("runs/"):
            wh.ensure_run(RUN, {"run_id": RUN})
        elif record.startswith("rounds/"):
            wh.start_round(RUN, 0, "flow-run-1")
            assert wh.round_status(RUN, 0) == "running"
        else:
            assert wh.stage_output(RUN, 0, "rollout") is None, "the stage runs again"
            wh.mark_stage(RUN, 0, "rollout", {"rollouts": 12})
    check(state)


@pytest.mark.parametrize("damage", ["truncated", "not parquet"])
def test_a_damaged_table_file_of_the_run_is_refused_naming_the_stage_to_run_again(state, damage):
    (path,) = (state.warehouse_path / "tables" / "trajectories" / f"run_id={RUN}" / "round=0").glob("*.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"round 0 looked fine\n")
    message = refused(state, path)
    assert "coevolve round --round 0" in message and "rollout" in message
    follow(message)
    check(state)
    with Warehouse(state.warehouse_path, read_only=True) as wh:
        assert wh.stage_output(RUN, 0, "rollout") is None and wh.trajectories(RUN, 0) == []


def test_another_runs_damaged_files_do_not_stop_this_run(state, make_trajectory):
    with Warehouse(state.warehouse_path) as wh:
        wh.write_trajectories([make_trajectory("t-other", 0, True, run_id="run-b")])
        wh.catalog.put(wh.catalog.round_path("run-b", 0), {"run_id": "run-b", "round": 0, "status": "running"})
    (state.warehouse_path / "catalog" / "rounds" / "run_id=run-b" / "0.json").write_bytes(b"\x00" * 40)
    (other,) = (state.warehouse_path / "tables" / "trajectories" / "run_id=run-b" / "round=0").glob("*.parquet")
    other.write_bytes(b"\x00" * 40)
    check(state)
