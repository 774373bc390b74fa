"""Trajectories and their steps: bulk rows written in batches, one file per table, named after their episodes."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from coevolve.errors import DataError
from coevolve.records import Segment, Step, Trajectory
from storage.columns import SCHEMAS, read_calls, tool_call_counts, trajectory_tables
from storage.tables import STALE_PARTIAL_S, part_name
from storage.views import BATCH_PARTS, WarehouseViews


class TrajectoryRows(WarehouseViews):
    """Writes trajectory batches and reads them back: episodes stored, outcomes, full trajectories, frames."""

    def write_trajectories(self, trajs: list[Trajectory], name: str | None = None) -> None:
        """Writes trajectories and their steps as one file per table in each (run, round) partition.

        The file name is ``name`` or derived from the trajectory ids, so writing the same episodes
        again replaces their files. Steps are written before trajectories: a reader that sees a
        trajectory also sees its steps.
        """
        self._writable()
        by_partition: dict[tuple[str, int], list[Trajectory]] = {}
        for t in trajs:
            by_partition.setdefault((t.run_id, t.round), []).append(t)
        for (run_id, round_), group in by_partition.items():
            trajectories, steps = trajectory_tables(group)
            self.write_batch(run_id, round_, trajectories, steps, name)

    def write_batch(
        self, run_id: str, round_: int, trajectories: pa.Table, steps: pa.Table, name: str | None = None
    ) -> None:
        """Write one batch of trajectory and step rows of a partition, with its tool-call counts.

        All three files get one name, ``name`` or one derived from the trajectory ids; the counts and
        the steps are written before the trajectories, which make the batch visible as episodes.
        """
        self._writable()
        file = name or part_name(trajectories.column("trajectory_id").to_pylist())
        for table, rows in (("tool_call_counts", tool_call_counts(steps)), ("steps", steps)):
            self.files.write(self._batch_file(table, run_id, round_, file), rows)
        self._commit_batch(run_id, round_, file, trajectories)

    def _batch_file(self, table: str, run_id: str, round_: int, file: str) -> str:
        return f"{self.files.partition_dir(table, run_id, round_)}/{file}.parquet"

    def _commit_batch(self, run_id: str, round_: int, file: str, trajectories: pa.Table) -> None:
        """Write a batch's trajectories file, its commit record, once every other file of the batch is stored.

        Readers take a batch's steps and counts as rows only when its trajectories file exists (`scan`), so a
        trajectories file written before them would show episodes without their steps to every reader until
        they follow, and for good if the writer died first. The check refuses that order outright.
        """
        missing = [t for t in BATCH_PARTS if not self.files.exists(self._batch_file(t, run_id, round_, file))]
        if missing:
            raise DataError(
                f"Batch {file} of run {run_id!r} round {round_} was not committed: its {' and '.join(missing)} "
                "file is not written yet, and the trajectories file commits a batch, so it is written last."
            )
        self.files.write(self._batch_file("trajectories", run_id, round_, file), trajectories)

    def stored_episodes(self, run_id: str, round_: int) -> set[tuple[str, int]]:
        """(task_id, sample) of the round's stored trajectories: a rollout that resumes plays only the others.

        Steps and counts of a batch without its trajectories file are invisible to every reader (see
        `scan`); they are removed here only once abandoned (older than STALE_PARTIAL_S), since another
        live writer of the round (a stage re-run on another worker) may be about to commit them.
        """
        heads = {os.path.basename(p) for p in self.files.files("trajectories", run_id, round_)}
        orphans = [
            p for t in BATCH_PARTS for p in self.files.files(t, run_id, round_) if os.path.basename(p) not in heads
        ]
        if not self.read_only:
            self.files.delete([p for p in orphans if self.files.age_s(p) > STALE_PARTIAL_S])
            for table in ("trajectories", *BATCH_PARTS):
                self.files.sweep_partials(table)
        stored = self._partition("trajectories", run_id, round_, ["task_id", "sample"])
        return set(zip(stored.column("task_id").to_pylist(), stored.column("sample").to_pylist(), strict=True))

    def outcomes(self, run_id: str, round_: int) -> dict[str, list[Any]]:
        """task_id, sample, reward, success and finish_reason of the round's stored trajectories (columns)."""
        columns = ["task_id", "sample", "reward", "success", "finish_reason"]
        return self._partition("trajectories", run_id, round_, columns).to_pydict()

    def tool_sequences(self, run_id: str, round_: int) -> dict[str, list[str]]:
        """trajectory_id -> the tools it called, for the round's stored trajectories."""
        table = self._partition("trajectories", run_id, round_, ["trajectory_id", "tool_sequence"])
        return dict(
            zip(table.column("trajectory_id").to_pylist(), table.column("tool_sequence").to_pylist(), strict=True)
        )

    def trajectories(
        self, run_id: str, round: int, task_ids: Iterable[str] | None = None, samples: range | None = None
    ) -> list[Trajectory]:
        """Full trajectories of a round, steps included, ordered by task then sample; of ``task_ids`` only and
        with a sample number in ``samples`` only (one training step's episodes) when given."""
        head_table, step_table = self._partition("trajectories", run_id, round), self._partition("steps", run_id, round)
        if task_ids is not None or samples is not None:
            # Filtered as Arrow columns: only the wanted rows become Python objects.
            if task_ids is not None:
                head_table = head_table.filter(
                    pc.is_in(head_table["task_id"], pa.array(sorted(set(task_ids)), pa.string()))
                )
            if samples is not None:
                head_table = head_table.filter(
                    pc.and_(
                        pc.greater_equal(head_table["sample"], samples.start),
                        pc.less(head_table["sample"], samples.stop),
                    )
                )
            step_table = step_table.filter(
                pc.is_in(step_table["trajectory_id"], head_table["trajectory_id"].combine_chunks())
            )
        heads = head_table.to_pylist()
        step_rows = step_table.to_pylist()
        steps: dict[str, list[tuple[int, Step]]] = {}
        for row in step_rows:
            steps.setdefault(row["trajectory_id"], []).append(
                (row["step_index"],
                 Step(turn=row["turn"], index=row["step_number"], model_text=row["model_text"],
                      calls=read_calls(row["calls"]), observations=list(row["observations"]), error=row["error"],
                      completion_tokens=row["completion_tokens"]))
            )  # fmt: skip
        heads.sort(key=lambda h: (h["task_id"], h["sample"]))
        return [
            Trajectory(run_id=run_id, round=round, task_id=h["task_id"], sample=h["sample"],
                       steps=[s for _, s in sorted(steps.get(h["trajectory_id"], []), key=lambda x: x[0])],
                       prompt_ids=list(h["prompt_ids"]), completion_ids=list(h["completion_ids"]),
                       completion_mask=list(h["completion_mask"]), logprobs=list(h["logprobs"]), reward=h["reward"],
                       success=h["success"], finish_reason=h["finish_reason"], duration_s=h["duration_s"],
                       later_segments=[Segment(**r) for r in h["later_segments"] or []])
            for h in heads
        ]  # fmt: skip

    def _trajectory_files(self, run_id: str, upto_round: int | None) -> list[str]:
        """The run's trajectory files of rounds <= upto_round (all when None), read off their round=R folder."""
        return [
            p for p in self.files.files("trajectories", run_id)
            if upto_round is None or int(p.rsplit("/round=", 1)[1].split("/", 1)[0]) <= upto_round
        ]  # fmt: skip

    def trajectory_frame(self, run_id: str, upto_round: int | None = None) -> pl.DataFrame:
        """Trajectory outcomes of a run (no token data), rounds <= upto_round: what signal mining reads."""
        columns = ["trajectory_id", "task_id", "sample", "reward", "success", "finish_reason", "tool_sequence"]
        if self.files.is_local:
            # A Polars scan of the run's files: about 7x faster here than the same read through a DuckDB view.
            paths = self._trajectory_files(run_id, upto_round)
            if not paths:
                schema = SCHEMAS["trajectories"]
                empty = pl.DataFrame(pa.schema([schema.field(c) for c in columns]).empty_table())
                frame = empty.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(0, pl.Int32).alias("round")).clear()
            else:
                try:
                    frame = (
                        pl.scan_parquet(paths, hive_partitioning=True, extra_columns="ignore")
                        .select(["run_id", "round", *columns])
                        .collect()
                    )
                except (pl.exceptions.PolarsError, OSError) as exc:
                    raise self._damaged_table_file(exc, "trajectories") or DataError(
                        f"Trajectories of run {run_id!r} in {self.root} cannot be read: {exc}"
                    ) from exc
            frame = frame.with_columns(pl.col("round").cast(pl.Int32), pl.col("run_id").cast(pl.String))
        else:
            con = self.connect()
            try:
                frame = con.sql(
                    f"SELECT run_id, round, {', '.join(columns)} FROM trajectories "
                    "WHERE run_id = $run AND ($upto IS NULL OR round <= $upto)",
                    params={"run": run_id, "upto": upto_round},
                ).pl()
            except duckdb.Error as exc:
                damaged = self._damaged_table_file(exc, "trajectories")
                if damaged is None:
                    raise
                raise damaged from exc
            finally:
                con.close()
        order = [
            "trajectory_id",
            "run_id",
            "round",
            "task_id",
            "sample",
            "reward",
            "success",
            "finish_reason",
            "tool_sequence",
        ]
        # Sorted by Polars: faster here than an ORDER BY in DuckDB that carries the tool_sequence lists.
        return frame.select(order).sort("round", "task_id", "sample")

    def trajectory_scan(self, run_id: str, upto_round: int | None = None) -> pl.LazyFrame:
        """What signal mining reads, as a lazy frame: a run's trajectories, rounds <= upto_round, unsorted.

        Columns trajectory_id, round (Int32), task_id, sample, reward, tool_sequence. On a local
        warehouse it is a Polars scan of the run's files, so the plan that collects it reads only the
        columns it selects, and only the rounds it filters on (``round`` is the partition key). A
        damaged file fails at collect time; `trajectory_read_error` turns the error into the
        DataError `trajectory_frame` raises. On an object store the rows are read once, through DuckDB.
        """
        columns = ["trajectory_id", "round", "task_id", "sample", "reward", "tool_sequence"]
        if not self.files.is_local:
            frame = self.trajectory_frame(run_id, upto_round)
            return frame.lazy().select(columns)
        paths = self._trajectory_files(run_id, upto_round)
        if not paths:
            fields = SCHEMAS["trajectories"]
            empty = pl.DataFrame(pa.schema([fields.field(c) for c in columns if c != "round"]).empty_table())
            return empty.lazy().with_columns(pl.lit(0, pl.Int32).alias("round")).select(columns)
        # extra_columns: a column added within the layout (columns.conform) is in later files, not in earlier ones.
        scan = pl.scan_parquet(
            paths, hive_partitioning=True, hive_schema={"run_id": pl.String, "round": pl.Int32}, extra_columns="ignore"
        )
        return scan.select(columns)

    def trajectory_read_error(self, exc: Exception, run_id: str) -> DataError:
        """The DataError for a failed collect of `trajectory_scan`: the damaged file named, or the error itself."""
        return self._damaged_table_file(exc, "trajectories") or DataError(
            f"Trajectories of run {run_id!r} in {self.root} cannot be read: {exc}"
        )
