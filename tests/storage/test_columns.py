"""Trajectory columns: an episode's later segments are stored, and files written without them read as one segment."""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq

from coevolve.records import Segment
from storage.columns import SCHEMAS

RUN = "run-a"  # the run of the conftest's trajectories

SECOND = Segment(prompt_ids=[1, 2, 9], completion_ids=[4, 8, 7], completion_mask=[1, 0, 1], logprobs=[-0.5, 0.0, -2.0])


def test_later_segments_are_stored_and_read_back(warehouse, make_trajectory):
    trajectory = dataclasses.replace(make_trajectory("t-1", 0, True), later_segments=[SECOND])
    warehouse.write_trajectories([trajectory, make_trajectory("t-1", 1, False)])
    first, second = warehouse.trajectories(RUN, 0)
    assert first.later_segments == [SECOND] and second.later_segments == []
    assert warehouse.sql("SELECT len(later_segments) AS n FROM trajectories ORDER BY sample")["n"].to_list() == [1, 0]


def test_trajectory_files_written_without_the_column_read_as_one_segment(warehouse, make_trajectory):
    # A warehouse begun before the column existed: its empty file and round 0 lack it; round 1 has it.
    warehouse.write_trajectories([make_trajectory("t-1", 0, True)])
    for path in [*warehouse.files.files("trajectories", RUN, 0), warehouse._empty_file("trajectories")]:
        pq.write_table(pq.read_table(path).drop_columns(["later_segments"]), path)
    warehouse.write_trajectories(
        [dataclasses.replace(make_trajectory("t-1", 0, True, round=1), later_segments=[SECOND])]
    )

    assert [t.later_segments for t in warehouse.trajectories(RUN, 0)] == [[]]
    assert [t.later_segments for t in warehouse.trajectories(RUN, 1)] == [[SECOND]]
    assert warehouse.trajectory_frame(RUN)["round"].to_list() == [0, 1]  # a Polars scan over both kinds of file
    assert warehouse.sql("SELECT count(*) AS n FROM trajectories")["n"].to_list() == [2]
    assert "later_segments" in SCHEMAS["trajectories"].names
