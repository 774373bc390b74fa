"""A whole round end to end: real Prefect flow run, DuckDB file, MLflow store, TRL trainer, bfcl-eval classes."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from agent.checkpoints import checkpoint_digest
from flows.cli import main
from flows.round import coevolve_round
from storage.pool import pool_digest, read_pool_snapshot
from storage.tracking import Tracker
from storage.warehouse import Warehouse

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished_round(prefect_api, tiny_config, tmp_path_factory):
    # Checkpoints registered by URI (a folder on shared storage) instead of copied into the artifacts.
    config = tiny_config(tmp_path_factory.mktemp("state"), tracking={"register_checkpoints": "uri"})
    summary = coevolve_round(round_=0, config=config.model_dump(mode="json"))
    return config, summary


def test_round_stores_every_trajectory_once(finished_round):
    config, summary = finished_round
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rows = wh.sql("SELECT count(*) AS n, count(DISTINCT trajectory_id) AS d FROM trajectories WHERE run_id = 'e2e'")
        steps = wh.sql("SELECT count(*) AS n FROM steps")
    assert rows["n"][0] == rows["d"][0] == 4 * 2 == summary["rollouts"]
    assert steps["n"][0] >= summary["rollouts"]


def test_round_writes_pool_one_with_every_verdict(finished_round):
    config, summary = finished_round
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        pool0 = wh.pool("e2e", 0)
        pool1 = wh.pool("e2e", 1)
        verdicts = wh.sql("SELECT accepted, reason FROM candidates WHERE run_id = 'e2e' AND round = 0")
    assert len(pool1) == len(pool0) + summary["accepted"] == summary["pool_size"]
    assert verdicts.height == summary["accepted"] + summary["rejected"]
    assert all(reason for reason in verdicts["reason"].to_list())


def test_pool_snapshot_matches_its_digest(finished_round):
    config, summary = finished_round
    tasks = read_pool_snapshot(config.pool_path(1), expected_digest=summary["pool_digest"])
    assert len(tasks) == summary["pool_size"]


def test_mlflow_links_checkpoint_pool_and_flow_run(finished_round):
    config, summary = finished_round
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    version = client.get_model_version(config.registered_model_name, summary["model_version"])
    assert version.tags["produced_pool_digest"] == summary["pool_digest"]
    assert version.tags["flow_run_id"] == summary["flow_run_id"] != ""
    run = client.get_run(version.run_id)
    assert run.data.metrics["rollouts"] == summary["rollouts"]
    assert client.get_model_version_by_alias(config.registered_model_name, "current").version == version.version


def test_register_uri_points_the_version_at_the_checkpoint_folder_and_copies_nothing(finished_round):
    config, summary = finished_round
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    version = client.get_model_version(config.registered_model_name, summary["model_version"])
    assert version.source == Path(summary["checkpoint"]).resolve().as_uri()
    assert {a.path for a in client.list_artifacts(version.run_id)} == {"figures", "pool"}


def test_running_a_finished_round_again_changes_nothing(finished_round):
    config, summary = finished_round
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        before = wh.sql(
            "SELECT (SELECT count(*) FROM trajectories) AS t, (SELECT count(*) FROM candidates) AS c, "
            "(SELECT count(*) FROM pool_membership) AS p"
        )
    again = coevolve_round(round_=0, config=config.model_dump(mode="json"))
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        after = wh.sql(
            "SELECT (SELECT count(*) FROM trajectories) AS t, (SELECT count(*) FROM candidates) AS c, "
            "(SELECT count(*) FROM pool_membership) AS p"
        )
    assert before.to_dicts() == after.to_dicts()
    assert again["model_version"] == summary["model_version"]


@pytest.fixture(scope="module")
def second_round(finished_round):
    config, _ = finished_round
    return coevolve_round(round_=1, config=config.model_dump(mode="json"))


def test_the_next_round_starts_from_the_recorded_checkpoint_and_pool(finished_round, second_round):
    config, first = finished_round
    assert second_round["round"] == 1 and second_round["model_version"] == "2"
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        recorded = wh.stage_output("e2e", 0, "version")
    assert recorded["checkpoint_digest"] == checkpoint_digest(first["checkpoint"])
    version = MlflowClient(tracking_uri=config.mlflow_tracking_uri).get_model_version(config.registered_model_name, "1")
    assert version.tags["checkpoint_digest"] == recorded["checkpoint_digest"]


def test_every_round_logs_its_learning_curve_and_best_follows_heldout_success(finished_round, second_round):
    config, first = finished_round
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    for summary in (first, second_round):
        run_id = client.get_model_version(config.registered_model_name, summary["model_version"]).run_id
        names = [a.path for a in client.list_artifacts(run_id, "figures")]
        assert names == [f"figures/learning-curve-{summary['round']:03d}.png"]
    expected = "2" if second_round["heldout_success"] > first["heldout_success"] else "1"
    assert str(client.get_model_version_by_alias(config.registered_model_name, "best").version) == expected
    assert str(client.get_model_version_by_alias(config.registered_model_name, "current").version) == "2"


def test_checkpoint_one_is_tagged_with_the_pool_it_was_trained_from(finished_round):
    config, summary = finished_round
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        pool0 = pool_digest(wh.pool("e2e", 0))
        prepared = wh.stage_output("e2e", 0, "prepare")
        # The update trains on the task groups with both a higher and a lower reward (GRPO's informative groups).
        informative = wh.sql(
            "SELECT coalesce(sum(n), 0) AS n FROM (SELECT count(*) AS n FROM trajectories WHERE run_id = 'e2e' AND "
            f"round = 0 GROUP BY task_id HAVING count(*) = {config.rollout.group_size} AND min(reward) < max(reward))"
        )["n"][0]
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    version = client.get_model_version(config.registered_model_name, summary["model_version"])
    assert version.tags["pool_digest"] == pool0 == prepared["pool_digest"]
    assert version.tags["produced_pool_digest"] == summary["pool_digest"]
    assert version.tags["parent_version"] == ""
    assert version.tags["parent_checkpoint"] == prepared["checkpoint"]
    assert version.tags["parent_checkpoint_digest"] == prepared["checkpoint_digest"]
    assert (version.tags["trajectories.run_id"], version.tags["trajectories.round"]) == ("e2e", "0")
    assert version.tags["trajectories.count"] == str(informative)
    inputs = client.get_run(version.run_id).inputs.dataset_inputs
    contexts = {(i.dataset.name, t.value) for i in inputs for t in i.tags}
    assert {(f"pool-000-{pool0}", "training"), (f"pool-001-{summary['pool_digest']}", "produced")} <= contexts


def test_lineage_walks_version_two_back_to_checkpoint_zero_and_d0(finished_round, second_round):
    config, first = finished_round
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    chain = tracker.lineage(config.registered_model_name, "2")
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        prepared = wh.stage_output("e2e", 0, "prepare")
    assert [entry["version"] for entry in chain] == ["2", "1"]
    assert chain[0]["parent_version"] == "1"
    assert chain[0]["parent_checkpoint_digest"] == chain[1]["checkpoint_digest"]
    assert chain[0]["pool_digest"] == chain[1]["produced_pool_digest"] == first["pool_digest"]
    assert chain[1]["parent_checkpoint_digest"] == prepared["checkpoint_digest"]
    assert chain[1]["pool_digest"] == prepared["pool_digest"]


def test_coevolve_lineage_prints_the_chain(finished_round, second_round, cli, capsys):
    config, _ = finished_round
    file = cli.write_config_file(config, config.state_dir / "lineage.yaml")
    assert main(["lineage", "2", "--config", str(file)]) == 0
    out = capsys.readouterr().out
    assert "version 2" in out and "version 1" in out and "checkpoint 0" in out and "D_0" in out
