"""A round r > 0 starts only from the checkpoint and pool that round r-1 recorded: digests catch corruption."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from coevolve.config import load_config  # noqa: E402
from coevolve.errors import DataError  # noqa: E402
from coevolve.records import Provenance, Task, ToolCall  # noqa: E402
from storage.pool import write_pool_snapshot  # noqa: E402
from storage.warehouse import Warehouse  # noqa: E402
from tasks.common import checkpoint_digest  # noqa: E402
from tasks.prepare import verify_round_inputs  # noqa: E402


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
        wh.mark_stage("r", 0, "version", {"pool_digest": digest, "checkpoint_digest": checkpoint_digest(checkpoint), "model_version": "1"})
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
    assert verify_round_inputs(config, 1) == str(checkpoint)


def test_a_corrupt_checkpoint_is_named(finished_round_zero) -> None:
    config, checkpoint = finished_round_zero
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DataError, match=f"Checkpoint {checkpoint} of round 1 has digest"):
        verify_round_inputs(config, 1)


def test_a_missing_checkpoint_is_named(finished_round_zero) -> None:
    config, checkpoint = finished_round_zero
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(DataError, match=f"Checkpoint {checkpoint} of round 1 is missing"):
        verify_round_inputs(config, 1)


def test_a_replaced_pool_snapshot_is_named(finished_round_zero) -> None:
    config, _ = finished_round_zero
    snapshot = config.pool_path(1)
    snapshot.unlink()
    write_pool_snapshot([_task(i) for i in range(2)], snapshot)
    with pytest.raises(DataError, match=f"Pool snapshot {snapshot} has digest"):
        verify_round_inputs(config, 1)


def test_a_missing_pool_snapshot_is_named(finished_round_zero) -> None:
    config, _ = finished_round_zero
    config.pool_path(1).unlink()
    with pytest.raises(DataError, match=f"Pool snapshot {config.pool_path(1)} does not exist"):
        verify_round_inputs(config, 1)


def test_a_warehouse_pool_that_drifted_from_its_snapshot_is_named(finished_round_zero) -> None:
    config, _ = finished_round_zero
    with Warehouse(config.warehouse_path) as wh:
        wh.set_pool("r", 1, [t.task_id for t in wh.pool("r", 1)][:2])
    with pytest.raises(DataError, match=f"Pool 1 of run 'r' in the warehouse {config.warehouse_path}"):
        verify_round_inputs(config, 1)


def test_a_round_after_an_unfinished_one_does_not_start(finished_round_zero) -> None:
    config, _ = finished_round_zero
    with pytest.raises(DataError, match="Round 1 of run 'r' has not finished"):
        verify_round_inputs(config, 2)
