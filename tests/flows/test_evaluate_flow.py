"""The evaluation flow end to end: a tiny checkpoint scored on official categories, the held-out and the dev split.

Real Prefect flow run, DuckDB warehouse, MLflow store and bfcl-eval classes; ``limit`` keeps it short.
"""

import pytest
from mlflow.tracking import MlflowClient

from agent.tiny import build_tiny_policy
from envs.bfcl.explorer import build_tasks
from envs.registry import make_environment
from flows.evaluate import coevolve_evaluate
from storage.warehouse import Warehouse
from tasks.common import open_warehouse
from tasks.splits import EXTERNAL_ROUND, HELDOUT_ROUND, build_initial_pools

pytestmark = pytest.mark.slow

LIMIT = 3


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tiny_config):
    """A tiny policy fine-tuned briefly on demonstrations of a few explored tasks."""
    config = tiny_config(tmp_path_factory.mktemp("model"), policy={"sft_steps": 20})
    env = make_environment(config.environment)
    conversations = [env.demonstration(task) for task in build_tasks(6, seed=11)]
    return str(build_tiny_policy(tmp_path_factory.mktemp("ckpt") / "tiny", conversations, config.policy, config.seed))


@pytest.fixture(scope="module")
def evaluated(prefect_api, tiny_config, tiny_checkpoint, tmp_path_factory):
    config = tiny_config(tmp_path_factory.mktemp("state"), run_id="evalflow")
    results = coevolve_evaluate(
        checkpoint=tiny_checkpoint,
        categories=["base", "multi_turn_long_context"],
        heldout=True,
        config=config.model_dump(mode="json"),
        limit=LIMIT,
        dev=True,
    )
    return config, results


def test_flow_returns_accuracy_per_category_heldout_and_dev(evaluated):
    config, results = evaluated
    assert list(results) == ["multi_turn_base", "multi_turn_long_context", "heldout", "dev"]
    assert all(0.0 <= value <= 1.0 for value in results.values())


def test_rows_are_stored_per_split_and_long_context_twins_do_not_collide(evaluated):
    config, results = evaluated
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rows = wh.sql("SELECT round, split, task_id, success FROM evaluations WHERE run_id = 'evalflow'")
    by_split = {split: rows.filter(rows["split"] == split) for split in results}
    assert {split: frame.height for split, frame in by_split.items()} == dict.fromkeys(results, LIMIT)
    # An official long-context entry has its base twin's task_id; the split keeps both rows.
    assert sorted(by_split["multi_turn_base"]["task_id"]) == sorted(by_split["multi_turn_long_context"]["task_id"])
    assert set(rows["round"]) == {EXTERNAL_ROUND}
    for split, frame in by_split.items():
        assert frame["success"].mean() == pytest.approx(results[split])


def test_a_run_without_a_heldout_split_gets_the_one_round_zero_would_build(evaluated):
    config, _ = evaluated
    with open_warehouse(config) as wh:
        stored = wh.pool(config.run_id, HELDOUT_ROUND)
    assert [t.task_id for t in stored] == [t.task_id for t in build_initial_pools(config)[1]]


def test_accuracy_is_logged_to_mlflow(evaluated):
    config, results = evaluated
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(config.tracking.experiment)
    runs = client.search_runs([experiment.experiment_id], "tags.`coevolve.kind` = 'evaluation'")
    assert len(runs) == 1
    metrics = runs[0].data.metrics
    assert {k: metrics[f"accuracy.{k}"] for k in results} == pytest.approx(results)
    assert metrics["tasks.multi_turn_base"] == LIMIT
    assert runs[0].data.tags["flow_run_id"]
    # The leaderboard's multi-turn overall: the two categories not evaluated count as 0.
    overall = (results["multi_turn_base"] + results["multi_turn_long_context"]) / 4
    assert metrics["accuracy.multi_turn_overall"] == pytest.approx(overall)
    assert runs[0].data.params["prompt_style"] == "compact"


def test_an_evaluation_with_no_split_to_score_returns_nothing_and_logs_no_run(prefect_api, tiny_config, tmp_path):
    """What the ablation asks of an environment without an official benchmark: its default official splits, none."""
    config = tiny_config(tmp_path, run_id="nothing", environment={"name": "workplace"})
    results = coevolve_evaluate(
        checkpoint=str(tmp_path / "never-loaded"), categories=None, heldout=False, config=config.model_dump(mode="json")
    )
    assert results == {}
    experiment = MlflowClient(tracking_uri=config.mlflow_tracking_uri).get_experiment_by_name(
        config.tracking.experiment
    )
    assert experiment is None or not MlflowClient(tracking_uri=config.mlflow_tracking_uri).search_runs(
        [experiment.experiment_id], "tags.`coevolve.kind` = 'evaluation'"
    )
