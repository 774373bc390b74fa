"""MLflow registry extras on a real SQLite store: crash recovery without duplicate versions, the "best" alias."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.entities import Metric

from storage.pool import write_pool_snapshot
from storage.tracking import BEST_ALIAS, CURRENT_ALIAS, RUN_NAME_TAG, VERSION_TAG, Tracker


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mlflow-recovery")


@pytest.fixture
def tracker(store: Path, request: pytest.FixtureRequest) -> Tracker:
    return Tracker(f"sqlite:///{store / 'mlflow.db'}", f"exp-{request.node.name}", store / "artifacts")


def _log(tracker: Tracker, tmp_path: Path, make_task, model: str, r: int, heldout: float) -> dict[str, str]:
    pool = tmp_path / f"pool-{r:03d}.parquet"
    digest = write_pool_snapshot([make_task(i) for i in range(2 + r)], pool)
    ckpt = tmp_path / f"round-{r:03d}"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    return tracker.log_round(
        run_name=f"{model}/round-{r}",
        params={},
        metrics={"heldout_success": heldout},
        pool_path=pool,
        pool_digest=digest,
        checkpoint_dir=ckpt,
        registered_model=model,
        flow_run_id=f"flow-{r}",
        tags={},
    )


def _alias(tracker: Tracker, name: str, alias: str) -> str:
    """The version an alias points at, read from the registry."""
    return str(tracker.client.get_model_version_by_alias(name, alias).version)


def test_a_round_that_crashed_after_registering_keeps_its_one_version(tracker, tmp_path, make_task) -> None:
    # What a process killed between create_model_version and closing the run leaves behind.
    crashed = tracker.client.create_run(
        tracker.experiment_id, tags={RUN_NAME_TAG: "m1/round-0", "registered_model": "m1"}
    )
    tracker.client.log_batch(crashed.info.run_id, metrics=[Metric("heldout_success", 0.5, 0, 0)])
    tracker.client.create_registered_model("m1")
    tracker.client.create_model_version("m1", f"{crashed.info.artifact_uri}/checkpoint", run_id=crashed.info.run_id)

    info = _log(tracker, tmp_path, make_task, "m1", 0, 0.5)

    assert info["mlflow_run_id"] == crashed.info.run_id and info["model_version"] == "1"
    assert len(tracker.client.search_model_versions("name = 'm1'")) == 1
    run = tracker.client.get_run(crashed.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[VERSION_TAG] == "1"
    assert _alias(tracker, "m1", CURRENT_ALIAS) == "1"


def test_best_points_at_the_highest_heldout_success_and_keeps_the_earliest_on_ties(
    tracker, tmp_path, make_task
) -> None:
    seen = []
    for r, heldout in enumerate([0.25, 0.5, 0.5, 0.0]):
        _log(tracker, tmp_path, make_task, "m2", r, heldout)
        seen.append(tracker.update_best("m2"))
    assert seen == ["1", "2", "2", "2"]
    assert _alias(tracker, "m2", BEST_ALIAS) == "2"
    assert _alias(tracker, "m2", CURRENT_ALIAS) == "4"


def test_best_is_none_for_a_model_without_versions(tracker) -> None:
    assert tracker.update_best("never-registered") is None


def test_an_artifact_can_be_attached_to_a_finished_run(tracker, tmp_path, make_task) -> None:
    info = _log(tracker, tmp_path, make_task, "m3", 0, 0.0)
    figure = tmp_path / "learning-curve-000.png"
    figure.write_bytes(b"\x89PNG")
    tracker.attach_artifact(info["mlflow_run_id"], figure)
    assert [a.path for a in tracker.client.list_artifacts(info["mlflow_run_id"], "figures")] == [
        "figures/learning-curve-000.png"
    ]
