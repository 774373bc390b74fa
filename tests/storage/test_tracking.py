"""MLflow tracking on a real SQLite store: versions, lineage both ways, idempotent re-runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy

from coevolve.errors import DataError
from storage.pool import write_pool_snapshot
from storage.tracking import CURRENT_ALIAS, RUN_NAME_TAG, Tracker, is_duplicate_dataset


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One SQLite store per module: creating MLflow's schema takes a few seconds.
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture
def tracker(store: Path, request: pytest.FixtureRequest) -> Tracker:
    return Tracker(f"sqlite:///{store / 'mlflow.db'}", f"exp-{request.node.name}", store / "artifacts")


def _round(tmp_path: Path, make_task, r: int, tasks: int) -> tuple[Path, str, Path]:
    pool = tmp_path / f"pool-{r:03d}.parquet"
    digest = write_pool_snapshot([make_task(i) for i in range(tasks)], pool)
    ckpt = tmp_path / f"round-{r:03d}"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(f'{{"round": {r}}}')
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    return pool, digest, ckpt


def _log(tracker: Tracker, name: str, model: str, pool: Path, digest: str, ckpt: Path, r: int) -> dict[str, str]:
    return tracker.log_round(
        run_name=name,
        params={"group_size": 2, "lr": 1e-4},
        metrics={"success_rate": 0.5, "pool_size": 3},
        pool_path=pool,
        pool_digest=digest,
        checkpoint_dir=ckpt,
        registered_model=model,
        flow_run_id=f"flow-{r}",
        tags={"run_id": "run-a", "round": str(r)},
    )


def test_a_round_is_one_run_with_params_metrics_pool_and_a_model_version(tracker, tmp_path, make_task) -> None:
    pool, digest, ckpt = _round(tmp_path, make_task, 0, 3)
    info = _log(tracker, "run-a/round-0", "policy-one", pool, digest, ckpt, 0)
    assert info["model_version"] == "1" and info["model_uri"] == "models:/policy-one/1"
    run = tracker.client.get_run(info["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["group_size"] == "2" and run.data.metrics["success_rate"] == 0.5
    assert run.data.tags["pool_digest"] == digest and run.data.tags["flow_run_id"] == "flow-0"
    assert run.data.tags["round"] == "0"
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name.endswith(f"-{digest}") and digest.startswith(dataset_input.dataset.digest)
    artifacts = {a.path for a in tracker.client.list_artifacts(info["mlflow_run_id"], "pool")}
    assert artifacts == {"pool/pool-000.parquet"}
    version = tracker.client.get_model_version("policy-one", "1")
    assert version.tags["pool_digest"] == digest and version.tags["flow_run_id"] == "flow-0"
    assert tracker.client.get_model_version_by_alias("policy-one", CURRENT_ALIAS).version == version.version
    assert version.source.endswith("/checkpoint")
    copied = {a.path for a in tracker.client.list_artifacts(info["mlflow_run_id"], "checkpoint")}
    assert copied == {"checkpoint/config.json", "checkpoint/model.safetensors"}


def test_excluded_entries_of_the_checkpoint_stay_out_of_the_artifacts(tracker, tmp_path, make_task) -> None:
    pool, digest, ckpt = _round(tmp_path, make_task, 0, 3)
    (ckpt / "adapter").mkdir()
    (ckpt / "adapter" / "adapter_config.json").write_text("{}")
    (ckpt / "trainer_state").mkdir()
    (ckpt / "trainer_state" / "optimizer.pt").write_bytes(b"\0" * 64)
    info = tracker.log_round(
        run_name="run-x/round-0", params={}, metrics={}, pool_path=pool, pool_digest=digest, checkpoint_dir=ckpt,
        registered_model="policy-x", flow_run_id="flow-0", tags={}, checkpoint_exclude=("trainer_state",),
    )  # fmt: skip
    copied = {a.path for a in tracker.client.list_artifacts(info["mlflow_run_id"], "checkpoint")}
    assert copied == {"checkpoint/adapter", "checkpoint/config.json", "checkpoint/model.safetensors"}


def test_lineage_links_pool_digests_and_versions_both_ways(tracker, tmp_path, make_task) -> None:
    logged = [(_round(tmp_path, make_task, r, 2 + r)) for r in range(2)]
    infos = [_log(tracker, f"run-b/round-{r}", "policy-two", *logged[r], r) for r in range(2)]
    digests = [d for _, d, _ in logged]
    assert [i["model_version"] for i in infos] == ["1", "2"]
    assert tracker.find_versions_for_pool(digests[0]) == ["1"]
    assert tracker.find_versions_for_pool(digests[1]) == ["2"]
    assert tracker.find_versions_for_pool("0" * 64) == []
    assert tracker.pool_for_version("2") == digests[1]
    assert tracker.pool_for_version("1", name="policy-two") == digests[0]
    assert str(tracker.client.get_model_version_by_alias("policy-two", CURRENT_ALIAS).version) == "2"


def test_lineage_accepts_an_alias_for_the_version(tracker, tmp_path, make_task) -> None:
    logged = [(_round(tmp_path, make_task, r, 2 + r)) for r in range(2)]
    for r in range(2):
        _log(tracker, f"run-g/round-{r}", "policy-seven", *logged[r], r)
    tracker.client.set_registered_model_alias("policy-seven", "best", "1")
    assert tracker.lineage("policy-seven", CURRENT_ALIAS) == tracker.lineage("policy-seven", "2")
    assert [entry["version"] for entry in tracker.lineage("policy-seven", "best")] == ["1"]
    with pytest.raises(DataError, match="give a version number or an alias"):
        tracker.lineage("policy-seven", "newest")


def test_logging_a_round_again_returns_the_first_result(tracker, tmp_path, make_task) -> None:
    pool, digest, ckpt = _round(tmp_path, make_task, 0, 2)
    first = _log(tracker, "run-c/round-0", "policy-three", pool, digest, ckpt, 0)
    again = _log(tracker, "run-c/round-0", "policy-three", pool, digest, ckpt, 0)
    assert again == first
    runs = tracker.client.search_runs([tracker.experiment_id], f"tags.`{RUN_NAME_TAG}` = 'run-c/round-0'")
    assert len(runs) == 1
    assert len(tracker.client.search_model_versions("name = 'policy-three'")) == 1


def test_a_run_left_running_by_a_crash_is_failed_and_logged_again(tracker, tmp_path, make_task) -> None:
    stale = tracker.client.create_run(tracker.experiment_id, tags={RUN_NAME_TAG: "run-d/round-0"})
    pool, digest, ckpt = _round(tmp_path, make_task, 0, 2)
    info = _log(tracker, "run-d/round-0", "policy-four", pool, digest, ckpt, 0)
    assert info["mlflow_run_id"] != stale.info.run_id
    assert tracker.client.get_run(stale.info.run_id).info.status == "FAILED"


def test_a_missing_pool_snapshot_is_a_data_error(tracker, tmp_path, make_task) -> None:
    _, digest, ckpt = _round(tmp_path, make_task, 0, 2)
    with pytest.raises(DataError, match="nowhere.parquet"):
        _log(tracker, "run-e/round-0", "policy-five", tmp_path / "nowhere.parquet", digest, ckpt, 0)


def test_a_second_tracker_reuses_the_experiment(store, tracker) -> None:
    name = tracker.client.get_experiment(tracker.experiment_id).name
    again = Tracker(f"sqlite:///{store / 'mlflow.db'}", name, store / "artifacts")
    assert again.experiment_id == tracker.experiment_id


def test_a_pool_another_run_logs_at_the_same_moment_is_linked_not_lost(tracker, store, tmp_path, make_task) -> None:
    """Two runs log the same pool (an ablation's seeds share D_0): both look the dataset up, find none and insert
    it. Here the other process's insert lands, through its own connection, just before this run's, which then
    breaks the store's unique key; the run is still linked to the one stored dataset."""
    pool, digest, ckpt = _round(tmp_path, make_task, 1, 3)
    engine = tracker.client._tracking_client.store.engine  # the store's SQLAlchemy engine, to time the other insert
    inserted_first: list[str] = []

    def other_process_inserts_first(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.startswith("INSERT INTO datasets") and not inserted_first:
            rows = parameters if executemany else [parameters]
            with sqlite3.connect(store / "mlflow.db") as other:
                for row in rows:
                    other.execute(statement, (f"other-{row[0]}", *row[1:]))
            inserted_first.append(rows[0][2])

    sqlalchemy.event.listen(engine, "before_cursor_execute", other_process_inserts_first)
    try:
        result = _log(tracker, "round-1", "race-model", pool, digest, ckpt, 1)
    finally:
        sqlalchemy.event.remove(engine, "before_cursor_execute", other_process_inserts_first)
    assert inserted_first, "the other insert did not happen: the test did not race"
    run = tracker.client.get_run(result["mlflow_run_id"])
    (logged,) = run.inputs.dataset_inputs
    assert logged.dataset.name == inserted_first[0] and logged.dataset.digest == digest[: len(logged.dataset.digest)]
    with sqlite3.connect(store / "mlflow.db") as db:
        stored = db.execute(
            "SELECT COUNT(*) FROM datasets WHERE experiment_id = ? AND name = ?",
            (tracker.experiment_id, logged.dataset.name),
        ).fetchone()
    assert stored == (1,)


def test_only_the_stores_duplicate_dataset_error_is_logged_again() -> None:
    assert is_duplicate_dataset(Exception("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id"))
    assert is_duplicate_dataset(Exception('duplicate key value violates unique constraint "datasets_pk" on datasets'))
    assert not is_duplicate_dataset(Exception("UNIQUE constraint failed: model_versions.name"))
    assert not is_duplicate_dataset(Exception("database is locked"))
