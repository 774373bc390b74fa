"""The ablation flow end to end on a tiny config: every (arm, seed) is its own run, and a report comes out."""

import pytest

from flows.ablation import ARMS, arm_config

pytestmark = pytest.mark.slow


def test_arms_share_checkpoint_zero_but_not_their_runs(tiny_config, tmp_path):
    base = tiny_config(tmp_path)
    static, full = arm_config(base, "static", 2, "abl"), arm_config(base, "full", 2, "abl")
    assert static.run_id == "abl-static-s2" and full.run_id == "abl-full-s2"
    assert static.start_seed == full.start_seed == base.start_seed
    assert static.synthesis.mode == "off" and full.synthesis.mode == "signal"
    assert arm_config(base, "no-rare", 1, "abl").signals.enabled == ["forgetting", "boundary"]
    assert set(ARMS) >= {"static", "random", "full", "no-forgetting", "no-boundary", "no-rare"}


@pytest.fixture(scope="module")
def ablation_run(prefect_api, tiny_config, tmp_path_factory):
    from flows.ablation import coevolve_ablation

    config = tiny_config(tmp_path_factory.mktemp("ablation"))
    out = coevolve_ablation(arms=["static", "random"], seeds=[1, 2], rounds=1, official_limit=2, name="t", config=config.model_dump(mode="json"))
    return config, out


def test_an_ablation_runs_every_arm_and_seed_and_writes_a_report(ablation_run):
    from storage.warehouse import Warehouse

    config, out = ablation_run
    assert set(out["arms"]) == {"static", "random"}
    assert out["tests"] == {}  # no "full" arm to compare against
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        runs = wh.sql("SELECT DISTINCT run_id FROM rounds ORDER BY run_id")["run_id"].to_list()
        static_pool = wh.sql("SELECT count(*) AS n FROM pool_membership WHERE run_id = 't-static-s1' AND round = 1")["n"][0]
        seed_pool = wh.sql("SELECT count(*) AS n FROM pool_membership WHERE run_id = 't-static-s1' AND round = 0")["n"][0]
    assert runs == ["t-random-s1", "t-random-s2", "t-static-s1", "t-static-s2"]
    assert static_pool == seed_pool
    assert "| static |" in open(out["report"]).read()


def test_each_runs_registry_aliases_point_at_its_own_versions(ablation_run):
    from mlflow.tracking import MlflowClient

    config, _ = ablation_run
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    for run_id in ("t-static-s1", "t-static-s2", "t-random-s1", "t-random-s2"):
        name = config.with_overrides({"run_id": run_id}).registered_model_name
        for alias in ("current", "best"):
            version = client.get_model_version_by_alias(name, alias)
            assert version.tags["coevolve.run_id"] == run_id
