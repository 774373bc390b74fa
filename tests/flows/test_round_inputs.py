"""A round starts only from the checkpoint and pool recorded before it (round 0: checkpoint 0 and D_0).

Digests catch corruption, and nothing unverifiable passes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import shutil

from agent.checkpoints import checkpoint_digest, checkpoint_folder
from coevolve.config import load_config
from coevolve.errors import DataError
from coevolve.records import Provenance, Task, ToolCall
from storage.pool import write_pool_snapshot
from storage.warehouse import Warehouse
from tasks.common import open_warehouse
from tasks.round_inputs import verify_round_inputs


def _verified(config, round_: int) -> str:
    """The checkpoint round ``round_`` starts from, checked in one warehouse session as the prepare stage does."""
    with open_warehouse(config) as wh:
        return verify_round_inputs(config, wh, round_)


def _task(i: int) -> Task:
    return Task(
        environment="bfcl",
        initial_config={"GorillaFileSystem": {"root": {"workspace": {"type": "directory", "contents": {}}}}},
        involved_classes=["GorillaFileSystem"],
        turns=[f"Create folder d{i} and list it."],
        reference=[[ToolCall("mkdir", {"dir_name": f"d{i}"}), ToolCall("ls", {})]],
        provenance=Provenance(origin="seed", round=0),
        description=f"task {i}",
    )


@pytest.fixture
def finished_round_zero(tmp_path: Path):
    """State as round 0 leaves it: checkpoint 1, pool 1 in the warehouse and as a snapshot, both digests recorded."""
    config = load_config(data={"state_dir": str(tmp_path / "state"), "run_id": "r"}, environ={})
    checkpoint = config.checkpoint_dir(1)
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text('{"hidden_size": 8}')
    (checkpoint / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    tasks = [_task(i) for i in range(3)]
    digest = write_pool_snapshot(tasks, config.pool_path(1))
    with Warehouse(config.warehouse_path) as wh:
        wh.write_tasks(tasks)
        wh.set_pool("r", 1, [t.task_id for t in tasks])
        wh.mark_stage("r", 0, "update", {"checkpoint": str(checkpoint)})
        wh.mark_stage(
            "r",
            0,
            "version",
            {
                "checkpoint": str(checkpoint),
                "pool_digest": digest,
                "checkpoint_digest": checkpoint_digest(checkpoint),
                "model_version": "1",
            },
        )
    return config, checkpoint


def test_the_digest_of_a_checkpoint_follows_its_bytes_not_its_location(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
    assert checkpoint_digest(tmp_path / "a") == checkpoint_digest(tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").write_bytes(b"weighTs")
    assert checkpoint_digest(tmp_path / "a") != checkpoint_digest(tmp_path / "b")


def test_intact_inputs_give_the_recorded_checkpoint(finished_round_zero) -> None:
    config, checkpoint = finished_round_zero
    assert _verified(config, 1) == str(checkpoint)


def test_a_corrupt_checkpoint_is_named(finished_round_zero) -> None:
    config, checkpoint = finished_round_zero
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DataError, match=f"Checkpoint 1 of run 'r' at {checkpoint} has digest"):
        _verified(config, 1)


def test_a_missing_checkpoint_is_named(finished_round_zero) -> None:
    config, checkpoint = finished_round_zero
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(DataError, match=f"Checkpoint 1 of run 'r' at {checkpoint} is incomplete"):
        _verified(config, 1)


def test_a_replaced_pool_snapshot_is_named(finished_round_zero) -> None:
    config, _ = finished_round_zero
    snapshot = config.pool_path(1)
    snapshot.unlink()
    write_pool_snapshot([_task(i) for i in range(2)], snapshot)
    with pytest.raises(DataError, match=f"Pool snapshot {snapshot} has digest"):
        _verified(config, 1)


def test_a_missing_pool_snapshot_is_named(finished_round_zero) -> None:
    config, _ = finished_round_zero
    config.pool_path(1).unlink()
    with pytest.raises(DataError, match=f"Pool snapshot {config.pool_path(1)} does not exist"):
        _verified(config, 1)


def test_a_warehouse_pool_that_drifted_from_its_snapshot_is_named(finished_round_zero) -> None:
    config, _ = finished_round_zero
    with Warehouse(config.warehouse_path) as wh:
        wh.set_pool("r", 1, [t.task_id for t in wh.pool("r", 1)][:2])
    with pytest.raises(DataError, match=f"Pool 1 of run 'r' in the warehouse {config.warehouse_path}"):
        _verified(config, 1)


def test_a_round_after_an_unfinished_one_does_not_start(finished_round_zero) -> None:
    config, _ = finished_round_zero
    with pytest.raises(DataError, match="round 1 of run 'r' has not finished"):
        _verified(config, 2)


def test_a_deleted_checkpoint_under_a_relative_state_dir_stops_the_round(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(overrides=["state_dir=state", "run_id=r"], environ={})
    checkpoint = config.checkpoint_dir(1)
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"w")
    tasks = [_task(0)]
    with Warehouse(config.warehouse_path) as wh:
        wh.write_tasks(tasks)
        wh.set_pool("r", 1, [t.task_id for t in tasks])
        wh.mark_stage("r", 0, "update", {"checkpoint": "state/runs/r/checkpoints/round-001"})
        wh.mark_stage(
            "r",
            0,
            "version",
            {
                "checkpoint": "state/runs/r/checkpoints/round-001",
                "pool_digest": write_pool_snapshot(tasks, config.pool_path(1)),
                "checkpoint_digest": checkpoint_digest(checkpoint),
            },
        )
    shutil.rmtree(checkpoint)
    with pytest.raises(DataError, match="state/runs/r/checkpoints/round-001 is missing"):
        _verified(config, 1)


def test_a_checkpoint_without_a_recorded_digest_cannot_be_verified(finished_round_zero) -> None:
    config, checkpoint = finished_round_zero
    with Warehouse(config.warehouse_path) as wh:
        recorded = wh.stage_output("r", 0, "version")
        wh.mark_stage("r", 0, "version", {**recorded, "checkpoint_digest": None})
    with pytest.raises(DataError, match=f"at {checkpoint} has no recorded digest, so it cannot be verified"):
        _verified(config, 1)


def test_a_pool_without_a_recorded_digest_cannot_be_verified(finished_round_zero) -> None:
    config, _ = finished_round_zero
    with Warehouse(config.warehouse_path) as wh:
        recorded = wh.stage_output("r", 0, "version")
        wh.mark_stage("r", 0, "version", {**recorded, "pool_digest": ""})
    with pytest.raises(DataError, match=r"Pool 1 of run 'r' .* has no recorded digest"):
        _verified(config, 1)


@pytest.fixture
def prepared_round_zero(tmp_path: Path):
    """State as the prepare stage leaves it: checkpoint 0 and D_0 with their digests recorded."""
    config = load_config(data={"state_dir": str(tmp_path / "state"), "run_id": "r"}, environ={})
    checkpoint = tmp_path / "state" / "models" / "tiny"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text('{"hidden_size": 8}')
    (checkpoint / "model.safetensors").write_bytes(b"checkpoint zero")
    tasks = [_task(i) for i in range(3)]
    with Warehouse(config.warehouse_path) as wh:
        wh.write_tasks(tasks)
        wh.set_pool("r", 0, [t.task_id for t in tasks])
        wh.mark_stage(
            "r",
            0,
            "prepare",
            {
                "checkpoint": str(checkpoint),
                "checkpoint_digest": checkpoint_digest(checkpoint),
                "pool_digest": write_pool_snapshot(tasks, config.pool_path(0)),
            },
        )
    return config, checkpoint


def test_checkpoint_zero_and_d0_are_checked_like_the_others(prepared_round_zero) -> None:
    config, checkpoint = prepared_round_zero
    assert _verified(config, 0) == str(checkpoint)
    (checkpoint / "model.safetensors").write_bytes(b"checkpoint zerO")
    with pytest.raises(DataError, match=f"Checkpoint 0 of run 'r' at {checkpoint} has digest"):
        _verified(config, 0)


def test_a_changed_d0_snapshot_is_named(prepared_round_zero) -> None:
    config, _ = prepared_round_zero
    snapshot = config.pool_path(0)
    snapshot.unlink()
    write_pool_snapshot([_task(9)], snapshot)
    with pytest.raises(DataError, match=f"Pool snapshot {snapshot} has digest"):
        _verified(config, 0)


def test_a_hub_model_id_that_is_not_on_this_machine_stops_the_round_with_the_reason(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        DataError, match="'coevolve-tests/absent-model' is neither a local folder nor in the local hub cache"
    ):
        checkpoint_folder("coevolve-tests/absent-model")
