"""A full disk is one line naming the folder, never retried, with what was written before intact.

Every write of the pipeline's own files is made on a real filesystem that fills up (tests/small_disk.py): a
checkpoint and an optimizer state (the update's own writers), warehouse files, a pool snapshot and the MLflow
store. Each test then follows the message: it frees space, writes again and finds the result whole.
"""

from __future__ import annotations

import errno
import functools
import pickle
from pathlib import Path

import pytest
import torch
from prefect.states import Failed
from transformers import Trainer, TrainingArguments

from agent.checkpoints import checkpoint_digest, save_atomically
from agent.transformers_engine import load_policy
from coevolve.config import EnvironmentConfig
from coevolve.errors import DiskFullError, InfrastructureError, is_retryable
from envs.registry import environment_class
from storage.pool import read_pool_snapshot, write_pool_snapshot
from storage.tracking import Tracker
from storage.warehouse import Warehouse
from tasks.training.grpo_resume import save_trainer_state
from tasks.training.grpo_trainer import write_trained
from tests.small_disk import fill, resize, small_disk

RUN = "run-a"


def retried(exc: BaseException) -> bool:
    return is_retryable(None, None, Failed(data=exc))


def says_disk_full(error: DiskFullError, folder: Path) -> bool:
    return str(error) == f"no space left on device under {folder}; free space and run the same command again"


@pytest.fixture(scope="module")
def policy():
    """Checkpoint 0 of the default configuration as shipped (656,128 parameters: 2.6 MB of weights, 5.2 MB of
    AdamW state)."""
    shipped = environment_class(EnvironmentConfig().name).shipped_checkpoint
    assert shipped is not None
    return load_policy(shipped)


def test_a_checkpoint_written_onto_a_full_disk_names_its_folder_and_leaves_the_earlier_one_whole(tmp_path, policy):
    model, tokenizer = policy
    write = functools.partial(write_trained, model, tokenizer, False, None)
    with small_disk(tmp_path / "disk", 4 * 1024) as disk:  # one checkpoint (2.7 MB) fits, two do not
        checkpoints = disk / "runs" / RUN / "checkpoints"
        save_atomically(checkpoints / "round-001", write)
        first = checkpoint_digest(checkpoints / "round-001")
        with pytest.raises(DiskFullError) as caught:
            save_atomically(checkpoints / "round-002", write)
        assert says_disk_full(caught.value, checkpoints) and not retried(caught.value)
        # The staging folder is gone with the space it took; the earlier checkpoint is as it was.
        assert sorted(p.name for p in checkpoints.iterdir()) == ["round-001"]
        assert checkpoint_digest(checkpoints / "round-001") == first
        resize(disk, 8 * 1024)  # space freed
        save_atomically(checkpoints / "round-002", write)
        assert checkpoint_digest(checkpoints / "round-002") == first  # the same weights, written whole


def trainer_with_state(model, tokenizer, scratch: Path) -> Trainer:
    """A transformers Trainer (GRPOTrainer's base, whose saving methods it uses) after one AdamW step."""
    args = TrainingArguments(output_dir=str(scratch), use_cpu=True, report_to=[], save_strategy="no")
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    ids = tokenizer("ls -a; cd docs", return_tensors="pt").input_ids
    model(input_ids=ids, labels=ids).loss.backward()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    return trainer


def test_an_optimizer_state_written_onto_a_full_disk_is_the_same_line_not_torchs_internal_error(tmp_path, policy):
    model, tokenizer = policy
    trainer = trainer_with_state(model, tokenizer, tmp_path / "scratch")
    with small_disk(tmp_path / "disk", 8 * 1024) as disk:  # one optimizer state (5.3 MB) fits, two do not
        checkpoints = disk / "runs" / RUN / "checkpoints"
        save_trainer_state(trainer, checkpoints / "round-001.trainer-state")
        first = torch.load(checkpoints / "round-001.trainer-state" / "optimizer.pt", weights_only=True)
        with pytest.raises(DiskFullError) as caught:
            save_trainer_state(trainer, checkpoints / "round-002.trainer-state")
        # torch.save's own words, "[enforce fail at inline_container.cc:...] . unexpected pos ...", are the cause.
        assert "unexpected pos" in str(caught.value.__cause__) or "PytorchStreamWriter" in str(caught.value.__cause__)
        assert says_disk_full(caught.value, checkpoints) and not retried(caught.value)
        assert sorted(p.name for p in checkpoints.iterdir()) == ["round-001.trainer-state"]
        again = torch.load(checkpoints / "round-001.trainer-state" / "optimizer.pt", weights_only=True)
        assert torch.equal(again["state"][0]["exp_avg"], first["state"][0]["exp_avg"])
        resize(disk, 16 * 1024)
        save_trainer_state(trainer, checkpoints / "round-002.trainer-state")
        written = torch.load(checkpoints / "round-002.trainer-state" / "optimizer.pt", weights_only=True)
        assert torch.equal(written["state"][0]["exp_avg_sq"], first["state"][0]["exp_avg_sq"])


def test_warehouse_files_written_onto_a_full_disk_name_the_warehouse_and_keep_every_earlier_row(
    tmp_path, make_task, make_trajectory
):
    tasks = [make_task(i) for i in range(20)]
    with small_disk(tmp_path / "disk", 2 * 1024) as disk:
        root = disk / "warehouse"
        with Warehouse(root) as wh:
            wh.write_tasks(tasks)
            wh.set_pool(RUN, 0, [t.task_id for t in tasks])
            wh.write_trajectories([make_trajectory(t.task_id, 0, True) for t in tasks])
            filler = fill(disk, leave_bytes=16 * 1024)
            written = 1
            with pytest.raises(DiskFullError) as caught:
                for sample in range(1, 200):
                    wh.write_trajectories([make_trajectory(t.task_id, sample, True) for t in tasks])
                    written += 1
        assert says_disk_full(caught.value, root) and not retried(caught.value)
        assert not [p for p in root.rglob("*") if p.name.endswith(".partial")], "a partial file kept the space"
        with Warehouse(root, read_only=True) as reader:
            assert len(reader.trajectories(RUN, 0)) == 20 * written
        filler.unlink()
        with Warehouse(root) as wh:  # the same write again
            wh.write_trajectories([make_trajectory(t.task_id, written, True) for t in tasks])
            assert len(wh.trajectories(RUN, 0)) == 20 * (written + 1)
            assert wh.sql("SELECT count(*) AS n FROM trajectories")["n"][0] == 20 * (written + 1)


def test_a_pool_snapshot_written_onto_a_full_disk_names_its_folder(tmp_path, make_task):
    tasks = [make_task(i) for i in range(200)]
    with small_disk(tmp_path / "disk", 1024) as disk:
        pools = disk / "runs" / RUN / "pools"
        filler = fill(disk, leave_bytes=4 * 1024)
        with pytest.raises(DiskFullError) as caught:
            write_pool_snapshot(tasks, pools / "pool-001.parquet")
        assert says_disk_full(caught.value, pools) and list(pools.iterdir()) == []
        filler.unlink()
        digest = write_pool_snapshot(tasks, pools / "pool-001.parquet")
        assert len(read_pool_snapshot(pools / "pool-001.parquet", expected_digest=digest)) == 200


def test_an_mlflow_store_on_a_full_disk_is_a_full_disk_not_a_damaged_store(tmp_path):
    with small_disk(tmp_path / "disk", 1024) as disk:
        state = disk / "state"
        state.mkdir()
        filler = fill(disk, leave_bytes=8 * 1024)
        with pytest.raises(DiskFullError) as caught:  # SQLite: "database or disk is full"
            Tracker(f"sqlite:///{state / 'mlflow.db'}", "exp", state / "mlartifacts")
        assert says_disk_full(caught.value, state) and not retried(caught.value)
        filler.unlink()
        resize(disk, 8 * 1024)
        Tracker(f"sqlite:///{state / 'mlflow.db'}", "exp", state / "mlartifacts")


def test_a_full_disk_is_never_retried_even_as_an_infrastructure_failure():
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        raise InfrastructureError("MLflow store sqlite:///x is not usable") from full
    except InfrastructureError as exc:
        assert not retried(exc)
    assert retried(InfrastructureError("the engine at http://127.0.0.1:8000 did not answer"))
    assert not retried(DiskFullError("/state"))
    # Prefect may carry a task's exception to another process: it arrives with the same line.
    assert says_disk_full(pickle.loads(pickle.dumps(DiskFullError("/state"))), Path("/state"))
