"""The warehouse's bookkeeping says what happened: no fresh layout over an old run, verdicts as decided, rounds as
run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coevolve.errors import DataError
from coevolve.records import Candidate, RoundSummary, Verdict
from storage import tables
from storage.columns import tool_call_counts, trajectory_tables
from storage.warehouse import Warehouse
from tests.storage.old_warehouse import create_old_file

RUN = "run-a"


def test_a_state_folder_with_an_unconverted_single_file_warehouse_is_refused_naming_the_command(tmp_path: Path) -> None:
    create_old_file(tmp_path / "warehouse.duckdb")
    with pytest.raises(DataError, match="coevolve warehouse migrate"):
        Warehouse(tmp_path / "warehouse")
    assert not (tmp_path / "warehouse").exists()


def test_a_root_with_files_but_no_layout_record_is_refused_and_left_alone(tmp_path: Path) -> None:
    stray = tmp_path / "warehouse" / "tables" / "trajectories" / "run_id=r" / "round=0" / "part-1.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"rows of an interrupted migration")
    with pytest.raises(DataError, match="no layout record"):
        Warehouse(tmp_path / "warehouse")
    assert not (tmp_path / "warehouse" / "catalog").exists()


def test_a_new_warehouse_interrupted_before_its_layout_record_is_created_on_the_next_open(tmp_path: Path) -> None:
    with Warehouse(tmp_path / "warehouse"):
        pass
    (tmp_path / "warehouse" / "catalog" / "layout.json").unlink()  # as if killed just before writing it
    with Warehouse(tmp_path / "warehouse") as wh:
        assert wh.schema_version() > 0


def test_a_duplicate_candidate_does_not_overwrite_the_accepted_copys_verdict(warehouse, make_task) -> None:
    task = make_task(7, origin="boundary")
    judged = [Candidate(task, "boundary:x", Verdict(True, "ok")),
              Candidate(task, "boundary:x", Verdict(False, f"duplicate of {task.task_id}"))]  # fmt: skip
    warehouse.write_candidates(RUN, 0, judged)
    rows = warehouse.sql("SELECT task_id, accepted, reason FROM candidates").rows()
    assert rows == [(task.task_id, True, "ok")]


def _summary(round_: int) -> RoundSummary:
    return RoundSummary(run_id=RUN, round=round_, pool_size=2, rollouts=4, success_rate=0.5, signals={}, accepted=0,
                        rejected=0, heldout_success=0.0)  # fmt: skip


def test_a_started_round_is_running_and_keeps_its_start_time_when_finished(warehouse) -> None:
    warehouse.start_round(RUN, 0, "flow-1", {"rollout.group_size": 2})
    (record,) = warehouse.round_records(RUN)
    assert record["status"] == "running" and record["finished_at"] is None
    warehouse.start_round(RUN, 0, "flow-2", {"rollout.group_size": 2})  # resumed
    assert warehouse.round_records(RUN)[0]["started_at"] == record["started_at"]
    warehouse.finish_round(RUN, 0, _summary(0))
    (done,) = warehouse.round_records(RUN)
    assert done["status"] == "finished" and done["started_at"] == record["started_at"]
    assert done["finished_at"] >= done["started_at"]
    assert warehouse.sql("SELECT status FROM rounds").rows() == [("finished",)]


def test_a_round_resumed_with_other_settings_is_refused_naming_the_fields(warehouse) -> None:
    warehouse.start_round(RUN, 0, "flow-1", {"rollout.group_size": 2, "rollout.tasks_per_batch": 4})
    with pytest.raises(DataError, match=r"rollout\.group_size: 2 -> 4"):
        warehouse.start_round(RUN, 0, "flow-2", {"rollout.group_size": 4, "rollout.tasks_per_batch": 4})


def test_a_written_file_is_followed_by_an_fsync_of_its_folder(tmp_path: Path, monkeypatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    files = tables.TableFiles.open(tmp_path / "root")
    files.write_bytes(f"{files.path}/catalog/x.json", b"{}")
    assert synced[-1] == f"{files.path}/catalog"


def test_a_batch_another_writer_is_committing_keeps_its_steps(warehouse, make_task, make_trajectory) -> None:
    """Writer A has written a batch's steps, not yet its trajectories; writer B resumes the same round meanwhile."""
    task = make_task(0)
    trajectories, steps = trajectory_tables([make_trajectory(task.task_id, s, True) for s in range(2)])
    for table, rows in (("tool_call_counts", tool_call_counts(steps)), ("steps", steps)):
        warehouse.files.write(f"{warehouse.files.partition_dir(table, RUN, 0)}/batch-a.parquet", rows)
    assert warehouse.stored_episodes(RUN, 0) == set()  # writer B: nothing committed yet
    assert warehouse.sql("SELECT count(*) FROM steps").item() == 0  # uncommitted steps are no rows
    # Writer A commits: the trajectories file is the last of write_batch's three.
    warehouse.files.write(f"{warehouse.files.partition_dir('trajectories', RUN, 0)}/batch-a.parquet", trajectories)
    stored = warehouse.trajectories(RUN, 0)
    assert [len(t.steps) for t in stored] == [2, 2]
    assert warehouse.sql("SELECT count(*) FROM steps").item() == 4


class WriterDied(BaseException):
    """The writing process ending at this point: nothing after it runs (not an Exception, so nothing catches it)."""


@pytest.mark.parametrize("files_written", [1, 2])
def test_a_writer_killed_between_a_batchs_files_leaves_no_episode_visible(
    warehouse, make_task, make_trajectory, monkeypatch, files_written
) -> None:
    """A batch is three files; a writer dying after any but the last leaves nothing a reader or a resume counts."""
    task = make_task(0)
    batch = [make_trajectory(task.task_id, s, True) for s in range(2)]
    write_bytes, written = tables.TableFiles.write_bytes, []

    def dying(files: tables.TableFiles, target: str, data: bytes) -> None:
        if len(written) == files_written:
            raise WriterDied(target)
        write_bytes(files, target, data)
        written.append(target.split("/tables/")[1].split("/")[0])

    monkeypatch.setattr(tables.TableFiles, "write_bytes", dying)
    with pytest.raises(WriterDied):
        warehouse.write_trajectories(batch)
    monkeypatch.undo()
    assert "trajectories" not in written and len(written) == files_written
    assert warehouse.stored_episodes(RUN, 0) == set()
    assert warehouse.trajectories(RUN, 0) == []
    counts = (
        "SELECT (SELECT count(*) FROM trajectories), (SELECT count(*) FROM steps), "
        "(SELECT coalesce(sum(calls), 0) FROM tool_call_counts)"
    )
    assert warehouse.sql(counts).row(0) == (0, 0, 0)
    # The resumed writer writes the batch again, whole.
    warehouse.write_trajectories(batch)
    assert [len(t.steps) for t in warehouse.trajectories(RUN, 0)] == [2, 2]
    assert warehouse.sql(counts).row(0) == (2, 4, 4)  # two calls in each of the two episodes


@pytest.mark.parametrize("lost", ["steps", "tool_call_counts"])
def test_a_batch_whose_other_files_are_not_stored_is_never_committed(
    warehouse, make_task, make_trajectory, monkeypatch, lost
) -> None:
    """The trajectories file commits a batch: it is refused while a file the batch needs is missing."""
    write_bytes = tables.TableFiles.write_bytes

    def losing(files: tables.TableFiles, target: str, data: bytes) -> None:
        if f"/tables/{lost}/" not in target:
            write_bytes(files, target, data)

    monkeypatch.setattr(tables.TableFiles, "write_bytes", losing)
    with pytest.raises(DataError, match=f"its {lost} file is not written yet.*written last"):
        warehouse.write_trajectories([make_trajectory(make_task(0).task_id, s, True) for s in range(2)])
    monkeypatch.undo()
    assert warehouse.files.files("trajectories", RUN, 0) == []
