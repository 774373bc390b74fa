"""Credentials never reach what stores the configuration: Prefect's flow-run parameters, the warehouse's run record,
MLflow's params.

Object-store credentials in ``warehouse.storage_options`` are refused with the environment variables to set
instead; set there, they work (an S3-compatible server on 127.0.0.1) and no store holds them, nor the API
keys named by ``*_api_key_env``. What still reaches a record by another way is masked.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import boto3
import prefect.settings
import pytest
from mlflow.tracking import MlflowClient

from coevolve.config import PipelineConfig, load_config
from coevolve.errors import ConfigError
from coevolve.redact import REDACTED
from flows.cli import main
from flows.stage import coevolve_stage
from storage.tracking import Tracker
from storage.warehouse import Warehouse
from tasks.version import flatten
from tests.storage.test_object_storage import BUCKET, keys, s3  # noqa: F401 - s3 is a fixture

SECRET = "wJalrXUtnFEMI-K7MDENG-s3cr3t"
KEY_ID = "AKIAQ7RUNKEYID"
API_KEY = "sk-rollout-api-key-4417"
LLM_KEY = "sk-llm-judge-key-9902"
RUN = "credentials-probe"


@pytest.mark.parametrize(
    "options",
    [
        {"key": KEY_ID, "secret": SECRET},
        {"endpoint_url": "http://127.0.0.1:9000", "token": SECRET},
        {"client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": SECRET}},
        {"config_kwargs": {"retries": {"max_attempts": 1}}, "password": SECRET},
    ],
)
def test_credentials_in_storage_options_are_refused_with_the_variables_to_set(options, tmp_path, capsys, monkeypatch):
    as_json = json.dumps(options)
    code = main(["status", "--set", f"state_dir={tmp_path}", "--set", f"warehouse.storage_options={as_json}"])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: warehouse.storage_options holds credentials (")
    assert "AWS_ACCESS_KEY_ID" in err and "AWS_SECRET_ACCESS_KEY" in err
    assert SECRET not in out + err and KEY_ID not in out + err
    assert list(tmp_path.iterdir()) == []
    # The same from the environment, and from a flow's parameters (a deployment run with them).
    monkeypatch.setenv("COEVOLVE_WAREHOUSE__STORAGE_OPTIONS", as_json)
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY") as refused:
        load_config(overrides=[f"state_dir={tmp_path}"])
    assert SECRET not in str(refused.value)
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY"):
        PipelineConfig.model_validate({"state_dir": str(tmp_path), "warehouse": {"storage_options": options}})


def files_holding(folder: Path, texts: list[str]) -> list[tuple[str, str]]:
    """(file, text) for every file under ``folder`` whose bytes hold one of ``texts``."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found.extend((str(path), text) for text in texts if text.encode() in data)
    return found


def prefect_database() -> Path:
    url = prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value()
    return Path(url.split(":///", 1)[1])


def test_credentials_from_the_environment_work_and_no_store_holds_them(s3, prefect_api, tmp_path, monkeypatch):  # noqa: F811
    # The fix the refusal names: the credentials in AWS_* variables, the API keys in the variables named by
    # rollout.api_key_env (its default) and synthesis.llm_api_key_env.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("COEVOLVE_OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("COEVOLVE_TEST_LLM_KEY", LLM_KEY)
    state = tmp_path / "state"
    root = f"s3://{BUCKET}/credentials"
    config = load_config(
        overrides=[
            f"run_id={RUN}",
            f"state_dir={state}",
            f"warehouse.uri={root}",
            f"warehouse.storage_options={json.dumps({'endpoint_url': s3})}",
            "synthesis.llm_api_key_env=COEVOLVE_TEST_LLM_KEY",
        ]
    )
    data = config.model_dump(mode="json")
    # Passed: a real flow run of the stage flow (a deployed stage's), which opens the warehouse on the server.
    coevolve_stage(stage="mine", inputs={"round_": 0}, config=data)
    # Recorded: the run record, as round 0's prepare stage writes it.
    with Warehouse(root, storage_options=config.warehouse.storage_options) as wh:
        wh.ensure_run(RUN, data)
    # Logged: the flattened configuration as MLflow params, through the tracker the version stage uses.
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    mlflow_run = tracker.log_evaluation(f"{RUN}-probe", {"accuracy": 1.0}, flatten(data), {})

    secrets = [SECRET, KEY_ID, API_KEY, LLM_KEY]
    database = prefect_database()
    # Each store was searched where it keeps the configuration: the run id is there, the secrets are not.
    assert files_holding(database.parent, [RUN])
    assert files_holding(database.parent, secrets) == []
    assert files_holding(state, [RUN]) and files_holding(state, secrets) == []
    stored = keys(s3, "credentials/")
    assert f"credentials/catalog/runs/{RUN}.json" in stored
    client = boto3.client("s3", endpoint_url=s3)
    objects = [client.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in stored]
    assert any(RUN.encode() in data for data in objects)
    assert not [key for key, data in zip(stored, objects, strict=True) if any(t.encode() in data for t in secrets)]
    # The variables' names are settings and stay as they were.
    params = MlflowClient(config.mlflow_tracking_uri).get_run(mlflow_run).data.params
    assert params["rollout.api_key_env"] == "COEVOLVE_OPENAI_API_KEY"
    assert params["synthesis.llm_api_key_env"] == "COEVOLVE_TEST_LLM_KEY"


def test_a_credential_that_reaches_a_record_is_masked(tmp_path):
    # A configuration given as plain data (no PipelineConfig to refuse it), and a URL with a password.
    config = {
        "run_id": RUN,
        "state_dir": str(tmp_path),
        "tracking": {"mlflow_uri": f"postgresql://coevolve:{SECRET}@db.internal:5432/mlflow"},
        "warehouse": {
            "uri": "s3://bucket/prefix",
            "storage_options": {
                "endpoint_url": "http://127.0.0.1:9000",
                "key": KEY_ID,
                "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": SECRET},
                "headers": [{"Authorization": f"Bearer {API_KEY}"}],
            },
        },
        "rollout": {"api_key_env": "COEVOLVE_OPENAI_API_KEY"},
    }
    with Warehouse(tmp_path / "warehouse") as wh:
        wh.ensure_run(RUN, config)
        record = wh.sql("SELECT config FROM runs").item()
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "coevolve", tmp_path / "mlartifacts")
    mlflow_run = tracker.log_evaluation(f"{RUN}-probe", {"accuracy": 1.0}, flatten(config), {})

    assert files_holding(tmp_path, [SECRET, KEY_ID, API_KEY]) == []
    options = json.loads(record)["warehouse"]["storage_options"]
    assert options == {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": REDACTED,
        "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": REDACTED},
        "headers": [{"Authorization": REDACTED}],
    }
    params = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(mlflow_run).data.params
    assert params["tracking.mlflow_uri"] == f"postgresql://coevolve:{REDACTED}@db.internal:5432/mlflow"
    assert params["warehouse.storage_options.client_kwargs.aws_secret_access_key"] == REDACTED
    assert params["warehouse.storage_options.client_kwargs.region_name"] == "eu-west-1"
    assert params["rollout.api_key_env"] == "COEVOLVE_OPENAI_API_KEY"
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        assert con.execute("SELECT count(*) FROM params WHERE instr(value, ?) > 0", (SECRET,)).fetchone() == (0,)
