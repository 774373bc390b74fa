"""The warehouse on an S3-compatible object store: moto's server on 127.0.0.1, reached through fsspec and s3fs.

The server runs in this process for the module; credentials are dummies and every client is pointed
at the loopback endpoint (``warehouse.storage_options``, and ``AWS_ENDPOINT_URL`` for anything else),
so no request leaves the machine.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.serve import free_port
from coevolve.errors import DataError
from coevolve.records import RoundSummary, Signal
from flows.cli import main
from storage.single_file_conversion import compare, migrate
from storage.warehouse import Warehouse
from tests.flows.conftest import cli_env, make_tiny_config, write_config_file
from tests.storage.old_warehouse import EXPECTED_ROWS

# The object store is an optional extra (pip install -e '.[s3]'); moto serves it in tests.
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")  # moto's own client, to list what the server holds

REPO = Path(__file__).resolve().parents[2]
BUCKET = "coevolve-test"
RUN = "run-a"


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[str]:
    """The endpoint of a fresh S3-compatible server on loopback with one bucket; stopped after the module."""
    home = tmp_path_factory.mktemp("aws")
    with pytest.MonkeyPatch.context() as mp:
        for key in (
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
            "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ):
            mp.delenv(key, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_CONFIG_FILE", str(home / "config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        port = free_port()
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        mp.setenv("AWS_ENDPOINT_URL", endpoint)  # a client that is not given the endpoint still stays on loopback
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            yield endpoint
        finally:
            server.stop()


def keys(endpoint: str, prefix: str) -> list[str]:
    """Every object key under ``prefix``, straight from the server."""
    client = boto3.client("s3", endpoint_url=endpoint)
    found: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        found.extend(o["Key"] for o in page.get("Contents", []))
    return found


def test_rows_written_to_s3_read_back_through_files_and_views(s3: str, make_task, make_trajectory) -> None:
    tasks = [make_task(i) for i in range(3)]
    trajs = [make_trajectory(tasks[0].task_id, 0, True), make_trajectory(tasks[0].task_id, 1, False),
             make_trajectory(tasks[1].task_id, 0, True)]  # fmt: skip
    summary = RoundSummary(run_id=RUN, round=0, pool_size=3, rollouts=3, success_rate=2 / 3, signals={"boundary": 1},
                           accepted=0, rejected=0, heldout_success=0.5)  # fmt: skip
    with Warehouse(f"s3://{BUCKET}/roundtrip", storage_options={"endpoint_url": s3}) as wh:
        assert not wh.files.is_local and wh.root == f"s3://{BUCKET}/roundtrip"
        wh.ensure_run(RUN, {"seed": 3})
        wh.start_round(RUN, 0, "flow-1")
        wh.write_tasks(tasks)
        wh.set_pool(RUN, 0, [t.task_id for t in reversed(tasks)])
        wh.write_trajectories(trajs)
        wh.write_signals([Signal(run_id=RUN, round=0, kind="boundary", trajectory_id=trajs[1].trajectory_id,
                                 task_id=tasks[0].task_id, evidence={"rate": 0.5})])  # fmt: skip
        wh.write_evaluations(RUN, 0, "heldout", [(tasks[2].task_id, True, 1.0, "x")])
        wh.mark_stage(RUN, 0, "rollout", {"rollouts": 3})
        wh.finish_round(RUN, 0, summary)

    stored = keys(s3, "roundtrip/")
    assert "roundtrip/catalog/layout.json" in stored
    assert any(k.startswith(f"roundtrip/tables/trajectories/run_id={RUN}/round=0/part-") for k in stored)
    assert any(k.startswith(f"roundtrip/tables/steps/run_id={RUN}/round=0/part-") for k in stored)
    assert not [k for k in stored if k.endswith(".partial")]

    with Warehouse(f"s3://{BUCKET}/roundtrip", read_only=True, storage_options={"endpoint_url": s3}) as wh:
        assert wh.trajectories(RUN, 0) == sorted(trajs, key=lambda t: (t.task_id, t.sample))
        assert wh.pool(RUN, 0) == list(reversed(tasks))
        assert wh.rounds(RUN) == [summary]
        assert wh.stage_output(RUN, 0, "rollout") == {"rollouts": 3}
        assert wh.evaluation_outcomes(RUN, 0, "heldout") == {tasks[2].task_id: True}
        curve = wh.sql("SELECT run_id, round, trajectories, successes FROM v_success_by_round").rows()
        assert curve == [(RUN, 0, 3, 2)]
        assert wh.sql("SELECT kind, signals FROM v_signal_mix").rows() == [("boundary", 1)]
        assert wh.sql("SELECT pool_size FROM v_pool_growth").rows() == [(3,)]
        assert wh.sql("SELECT count(*) FROM steps").item() == 2 * len(trajs)
        config = wh.sql("SELECT config FROM runs").item()
        assert json.loads(config) == {"seed": 3}
        assert wh.sql("SELECT status FROM rounds").item() == "finished"


def test_a_damaged_file_on_s3_names_its_url_and_a_move_aside_that_works_there(s3: str, make_task, make_trajectory):
    tasks = [make_task(i) for i in range(3)]
    with Warehouse(f"s3://{BUCKET}/damaged", storage_options={"endpoint_url": s3}) as wh:
        wh.write_tasks(tasks)
        wh.write_trajectories([make_trajectory(t.task_id, 0, True) for t in tasks])
    (key,) = [k for k in keys(s3, "damaged/tables/trajectories/") if "run_id=_empty" not in k]
    boto3.client("s3", endpoint_url=s3).put_object(Bucket=BUCKET, Key=key, Body=b"not parquet" * 20)
    url = f"s3://{BUCKET}/{key}"
    with Warehouse(f"s3://{BUCKET}/damaged", read_only=True, storage_options={"endpoint_url": s3}) as wh:
        with pytest.raises(DataError) as caught:
            wh.sql("SELECT count(*) FROM trajectories")
    message = str(caught.value)
    assert message.startswith(f"Warehouse file {url} is not a readable Parquet file") and "\n" not in message
    assert f"`aws s3 mv {url} {url}.damaged`" in message and "(mv " not in message
    client = boto3.client("s3", endpoint_url=s3)  # the printed fix, as the object store's own client does it
    client.copy_object(Bucket=BUCKET, Key=f"{key}.damaged", CopySource={"Bucket": BUCKET, "Key": key})
    client.delete_object(Bucket=BUCKET, Key=key)
    with Warehouse(f"s3://{BUCKET}/damaged", read_only=True, storage_options={"endpoint_url": s3}) as wh:
        assert wh.sql("SELECT count(*) FROM trajectories").item() == 0


def test_an_open_session_sees_files_another_process_writes(s3: str, make_task, make_trajectory) -> None:
    root = f"s3://{BUCKET}/live"
    options = {"endpoint_url": s3}
    task = make_task(0)
    with Warehouse(root, storage_options=options) as wh:
        wh.write_trajectories([make_trajectory(task.task_id, 0, True)])
        con = wh.connect()
        try:
            assert con.sql("SELECT count(*) FROM trajectories").fetchall() == [(1,)]
            assert len(wh.files.files("trajectories", RUN, 0)) == 1
            # A second writer in its own process (its own fsspec filesystem and cache), as a stage is.
            writer = (
                "import sys; sys.path[:0] = [sys.argv[3], sys.argv[3] + '/tests/storage']\n"
                "from conftest import build_trajectory\n"
                "from storage.warehouse import Warehouse\n"
                "with Warehouse(sys.argv[1], storage_options={'endpoint_url': sys.argv[2]}) as wh:\n"
                "    wh.write_trajectories([build_trajectory('t-other', s, s == 0, round=1) for s in range(2)])\n"
            )
            subprocess.run([sys.executable, "-c", writer, root, s3, str(REPO)], check=True, timeout=300, cwd=REPO)
            # The held session and this filesystem list the store again: the new files are there.
            assert con.sql("SELECT round, count(*) FROM trajectories GROUP BY round ORDER BY round").fetchall() == [
                (0, 1),
                (1, 2),
            ]
            assert len(wh.files.files("trajectories", RUN, 1)) == 1
            assert con.sql("SELECT count(*) FROM v_success_by_round").fetchall() == [(2,)]
        finally:
            con.close()
        # Deletes go through the same filesystem: clearing the rollout removes round 1's files.
        wh.mark_stage(RUN, 1, "rollout", {"rollouts": 2})
        wh.clear_round(RUN, 1, "rollout")
        assert wh.files.files("trajectories", RUN, 1) == [] and wh.files.files("steps", RUN, 1) == []
        assert wh.stage_output(RUN, 1, "rollout") is None
        assert wh.sql("SELECT count(*) FROM trajectories").item() == 1
    assert not [k for k in keys(s3, "live/tables/trajectories/") if "round=1" in k]


def test_a_single_file_warehouse_converts_onto_s3(s3: str, old_warehouse) -> None:
    root = f"s3://{BUCKET}/migrated"
    options = {"endpoint_url": s3}
    report = migrate(old_warehouse["path"], root, storage_options=options)
    assert report.ok, report.format()
    assert report.target == root
    assert {c.table: c.new_rows for c in report.checks} == EXPECTED_ROWS
    assert any(k.startswith("migrated/tables/steps/run_id=run-a/round=0/") for k in keys(s3, "migrated/"))
    with Warehouse(root, read_only=True, storage_options=options) as wh:
        assert wh.rounds("run-a") == old_warehouse["summaries"]
    assert compare(old_warehouse["path"], root, storage_options=options).ok


def test_coevolve_sql_on_s3_reads_the_views_and_nothing_outside_the_warehouse(
    s3: str, tmp_path: Path, capsys, make_trajectory
) -> None:
    root = f"s3://{BUCKET}/door"
    options = {"endpoint_url": s3}
    with Warehouse(root, storage_options=options) as wh:
        wh.write_trajectories([make_trajectory("t0", 0, True), make_trajectory("t0", 1, False)])
    # A Parquet file of the same bucket, beside the warehouse but not in it.
    beside = io.BytesIO()
    pq.write_table(pa.table({"secret": [1]}), beside)
    boto3.client("s3", endpoint_url=s3).put_object(Bucket=BUCKET, Key="beside/x.parquet", Body=beside.getvalue())
    client = boto3.client("s3", endpoint_url=s3)
    stored = {k: client.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in keys(s3, "door/")}
    settings = ["--set", f"state_dir={tmp_path}", "--set", f"warehouse.uri={root}",
                "--set", f"warehouse.storage_options={json.dumps(options)}"]  # fmt: skip

    query = "SELECT run_id, trajectories, successes FROM v_success_by_round"
    assert main(["sql", query, "--format", "json", *settings]) == 0
    assert json.loads(capsys.readouterr().out) == [{"run_id": RUN, "trajectories": 2, "successes": 1}]
    for refused in (
        f"COPY (SELECT 1 AS a) TO '{root}/tables/trajectories/x.parquet'",
        f"SELECT * FROM read_parquet('s3://{BUCKET}/beside/x.parquet')",
        "SELECT * FROM read_csv('/etc/passwd')",
    ):
        assert main(["sql", refused, *settings]) == 2, refused
        err = capsys.readouterr().err
        assert err.startswith("error: query refused:") and err.count("\n") == 1, err
    assert {k: client.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in keys(s3, "door/")} == stored


# --- A whole round with its warehouse on s3 ------------------------------------------------------


@pytest.mark.slow
def test_a_round_with_its_warehouse_on_s3_answers_coevolve_sql(s3: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    options = {"endpoint_url": s3}
    config = make_tiny_config(state, warehouse={"uri": f"s3://{BUCKET}/e2e", "storage_options": options})
    assert config.warehouse_path == f"s3://{BUCKET}/e2e"
    config_file = write_config_file(config, tmp_path / "config.yaml")
    env = cli_env(state)
    log = tmp_path / "round.log"
    t0 = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "flows.cli", "round", "--round", "0", "--config", str(config_file)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900,
        )  # fmt: skip
    assert done.returncode == 0, log.read_text()[-4000:]
    round_s = time.monotonic() - t0

    # Nothing of the warehouse is local; checkpoints, pool snapshots and MLflow are.
    assert not (state / "warehouse").exists()
    assert (state / "mlflow.db").exists()
    stored = keys(s3, "e2e/")
    assert "e2e/catalog/layout.json" in stored
    assert any(k.startswith("e2e/tables/trajectories/run_id=e2e/round=0/") for k in stored)
    assert any(
        k.startswith("e2e/catalog/stage_runs/run_id=e2e/round=0/") and k.endswith("version.json") for k in stored
    )

    query = subprocess.run(
        [sys.executable, "-m", "flows.cli", "sql", "SELECT * FROM v_success_by_round", "--format", "csv",
         "--config", str(config_file)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    rows = [row for row in csv.DictReader(io.StringIO(query.stdout)) if row["run_id"] == "e2e"]
    assert len(rows) == 1, query.stdout
    played = config.rollout.tasks_per_batch * config.rollout.group_size
    assert (rows[0]["round"], rows[0]["trajectories"]) == ("0", str(played))

    with Warehouse(config.warehouse_path, read_only=True, storage_options=options) as wh:
        assert wh.round_status("e2e", 0) == "finished"
        (summary,) = wh.rounds("e2e")
        assert summary.rollouts == 8
        assert len(wh.pool("e2e", 1)) == summary.pool_size
    print(f"round on s3: {round_s:.0f}s")
