"""Stages placed on two work pools: a Prefect server, a coevolve-cpu and a coevolve-gpu process worker, an MLflow
server.

The workers start in two different empty folders with only PREFECT_API_URL and PREFECT_HOME set
(the flows apply the offline switches themselves) and share the state folder by path. A round run
through the per-round deployment places rollout, update and evaluate on the GPU pool and mine,
synthesize and validate on the CPU pool, registers its checkpoint through the MLflow server, and
ends exactly like the same round run inline with `coevolve round`.

One module-scoped setup runs, in order: the inline round (alongside the rest; it is the session's uninterrupted
round of tests/flows/test_crash_resume.py, the same configuration and run id, run once for both modules, in its own
process, state folder and MLflow store as `coevolve round` runs it); two deployment runs of the placed round at once
with placement.round_concurrency=fail, one of which takes the run's slot while the other fails at once; the GPU
worker killed with -9 during the slot holder's rollout, so that the holder fails after its stage timeout; and a
third run with 'wait', started right after a new GPU worker, which waits for the slot and resumes the round there.
The nightly deployment stays deployed as prefect.yaml defines it: the server's scheduler
creates its runs, and the first one, given zero rounds in a state folder of its own and made due
now before any worker starts, runs on the CPU worker. Everything binds 127.0.0.1 on free ports;
every process is stopped by its process id.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient
from test_crash_resume import assert_same_rows
from test_deployments import (
    API_TIMEOUT_S,
    PREFECT,
    REPO,
    TERMINAL,
    WORKER_QUERY_SECONDS,
    _env,
    _flow_run,
    _flow_run_state,
    _free_port,
    _stop,
    _wait_healthy,
)

from coevolve.config import PipelineConfig
from coevolve.errors import PipelineError
from coevolve.stages import STEP_STAGES, record_name
from storage.warehouse import Warehouse
from tests.conftest import MLFLOW
from tests.flows.conftest import CONTENT, CRASH_OVERRIDES, warehouse_content

pytestmark = pytest.mark.slow

# The crash test's run: the inline round is the session's uninterrupted round of it (`crash_round`).
RUN_ID = "e2e"
PLACEMENT = {
    "rollout": "coevolve-stage/rollout-gpu",
    "update": "coevolve-stage/update-gpu",
    "evaluate": "coevolve-stage/evaluate-gpu",
    "mine": "coevolve-stage/mine-cpu",
    "synthesize": "coevolve-stage/synthesize-cpu",
    "validate": "coevolve-stage/validate-cpu",
}
GPU_STAGES, CPU_STAGES = ("rollout", "update", "evaluate"), ("mine", "synthesize", "validate")
# The tracking server without MLflow's job runner (seven huey consumer processes polling a queue), which serves
# its GenAI jobs; registering runs, models and artifacts does not use it.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
# Seconds the first attempt of the killed round waits for its rollout before failing the stage.
KILLED_STAGE_TIMEOUT_S = 60.0


# --- processes ------------------------------------------------------------------------------------


def _worker_env(home: Path, api_url: str) -> dict[str, str]:
    """What a worker started by hand on another machine has: a shell's PATH and HOME, and the server."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(home)),
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PREFECT_WORKER_QUERY_SECONDS": WORKER_QUERY_SECONDS,
    }


def _start_worker(pool: str, name: str, folder: Path, api_url: str) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "worker.log").open("a") as out:
        return subprocess.Popen(
            [str(PREFECT), "worker", "start", "--pool", pool, "--name", name],
            cwd=folder, env=_worker_env(folder / "prefect-home", api_url), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _kill_tree(process: subprocess.Popen) -> None:
    """kill -9 a worker's process group and the group of every flow run it started (each runs in its own session)."""
    groups = {process.pid}
    try:
        groups |= {os.getpgid(child.pid) for child in psutil.Process(process.pid).children(recursive=True)}
    except (psutil.NoSuchProcess, ProcessLookupError):
        pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=60)


def _wait_http(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


# --- the Prefect API --------------------------------------------------------------------------------


def _flow_runs(api_url: str) -> list[dict]:
    response = httpx.post(
        f"{api_url}/flow_runs/filter", json={"limit": 200, "sort": "EXPECTED_START_TIME_ASC"}, timeout=API_TIMEOUT_S
    )
    response.raise_for_status()
    return response.json()


def _stage_runs(api_url: str, config) -> dict[str, list[dict]]:
    """The coevolve-stage flow runs started for ``config``'s state folder, by the record they are for
    (``rollout``, ``update``, ``rollout@1``, ...: a training step's stages run once per step)."""
    runs: dict[str, list[dict]] = {}
    for run in _flow_runs(api_url):
        params = run.get("parameters") or {}
        if "stage" in params and (params.get("config") or {}).get("state_dir") == str(config.state_dir):
            runs.setdefault(run["name"].rsplit("-round-", 1)[0], []).append(run)
    return runs


def _wait_terminal(api_url: str, flow_run_id: str, logs: list[Path], timeout_s: float = 900) -> str:
    deadline = time.monotonic() + timeout_s
    state = _flow_run_state(api_url, flow_run_id)
    while state not in TERMINAL and time.monotonic() < deadline:
        time.sleep(2)
        state = _flow_run_state(api_url, flow_run_id)
    assert state in TERMINAL, f"flow run {flow_run_id} is still {state}:\n" + "\n".join(
        p.read_text()[-3000:] for p in logs
    )
    return state


def _scheduled_nightly_runs(api_url: str, server: subprocess.Popen, log: Path, timeout_s: float = 180) -> list[dict]:
    """The flow runs the server's scheduler created for coevolve-evolve/nightly, earliest first."""
    deployment = httpx.get(f"{api_url}/deployments/name/coevolve-evolve/nightly", timeout=API_TIMEOUT_S).json()
    query = {"deployments": {"id": {"any_": [deployment["id"]]}}, "sort": "EXPECTED_START_TIME_ASC"}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        runs = httpx.post(f"{api_url}/flow_runs/filter", json=query, timeout=API_TIMEOUT_S).json()
        if runs:
            return runs
        time.sleep(2)
    raise AssertionError(
        f"no scheduled run of coevolve-evolve/nightly after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
    )


def _retarget_nightly_run(api_url: str, flow_run_id: str, state_dir: Path) -> str:
    """Give a scheduled nightly run zero rounds in ``state_dir`` and make it due now; a worker then picks it up."""
    config = PipelineConfig.model_validate({"run_id": "nightly", "state_dir": str(state_dir)})
    parameters = {"rounds": 0, "config": config.model_dump(mode="json")}
    httpx.patch(
        f"{api_url}/flow_runs/{flow_run_id}", json={"parameters": parameters}, timeout=API_TIMEOUT_S
    ).raise_for_status()
    now = datetime.datetime.now(datetime.UTC).isoformat()
    state = {"type": "SCHEDULED", "name": "Scheduled", "state_details": {"scheduled_time": now}}
    httpx.post(
        f"{api_url}/flow_runs/{flow_run_id}/set_state", json={"state": state, "force": True}, timeout=API_TIMEOUT_S
    ).raise_for_status()
    return flow_run_id


# --- the setup ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Prefect server, MLflow server, both pools with a worker each, prefect.yaml deployed; torn down after the
    module."""
    root = tmp_path_factory.mktemp("cluster")
    port, mlflow_port = _free_port(), _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = _env(root / "prefect-home", api_url, root / "shared")

    def prefect(*args: str) -> str:
        done = subprocess.run([str(PREFECT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    logs = SimpleNamespace(server=root / "server.log", mlflow=root / "mlflow.log")
    processes: dict[str, subprocess.Popen] = {}
    with logs.server.open("w") as out:
        processes["server"] = subprocess.Popen(
            [str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    with logs.mlflow.open("w") as out:
        processes["mlflow"] = subprocess.Popen(
            [
                str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
                "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
            ],
            cwd=root, env={**env, **MLFLOW_SERVER_ENV}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    ns = SimpleNamespace(
        root=root,
        api_url=api_url,
        mlflow_uri=f"http://127.0.0.1:{mlflow_port}",
        artifacts=root / "artifacts",
        prefect=prefect,
        processes=processes,
    )
    try:
        _wait_healthy(api_url, processes["server"], logs.server)
        _wait_http(f"{ns.mlflow_uri}/health", processes["mlflow"], logs.mlflow)
        prefect("work-pool", "create", "coevolve-cpu", "--type", "process")
        prefect("work-pool", "create", "coevolve-gpu", "--type", "process")
        prefect("--no-prompt", "deploy", "--all")
        # Before any worker starts: the scheduler's runs of the nightly deployment, the first one moved to now
        # on a state folder of its own (prefect.yaml's parameters would run three rounds in the checkout).
        ns.nightly_scheduled = _scheduled_nightly_runs(api_url, processes["server"], logs.server)
        ns.nightly_run = _retarget_nightly_run(api_url, ns.nightly_scheduled[0]["id"], root / "nightly" / "state")
        processes["cpu-worker"] = _start_worker("coevolve-cpu", "cpu-worker", root / "cpu-box", api_url)
        processes["gpu-worker"] = _start_worker("coevolve-gpu", "gpu-worker", root / "gpu-box", api_url)
        yield ns
    finally:
        for name in [n for n in processes if n.endswith("worker")] + ["mlflow", "server"]:
            _stop(processes[name])  # the workers first: they report to the server while they shut down


def _placed_config(tiny_config, state_dir: Path, **overrides):
    """The round of the crash test (rows in every table), every stage placed on a pool."""
    sections = {**CRASH_OVERRIDES, "placement": PLACEMENT}
    merged = {key: {**sections.get(key, {}), **overrides.get(key, {})} for key in {*sections, *overrides} - {"run_id"}}
    return tiny_config(state_dir, run_id=overrides.get("run_id", RUN_ID), **merged)


def _start_round(cluster, config) -> str:
    created = cluster.prefect(
        "deployment", "run", "coevolve-round/per-round",
        "-p", "round_=0", "-p", "config=" + json.dumps(config.model_dump(mode="json")),
    )  # fmt: skip
    return re.search(r"UUID: ([0-9a-f-]{36})", created).group(1)


def _trajectory_files(config) -> list[Path]:
    """The round's stored trajectory files (storage/VIEWS.md: tables/<table>/run_id=<run>/round=<round>/)."""
    return list(
        (Path(config.warehouse_path) / "tables" / "trajectories" / f"run_id={RUN_ID}" / "round=0").glob("*.parquet")
    )


def _stage_done(config, stage: str) -> bool:
    try:
        with Warehouse(config.warehouse_path, read_only=True) as wh:
            return wh.stage_output(config.run_id, 0, stage) is not None
    except PipelineError:
        return False


@pytest.fixture(scope="module")
def rounds(cluster, tiny_config, crash_round):
    root = cluster.root
    worker_logs = [root / "cpu-box" / "worker.log", root / "gpu-box" / "worker.log", root / "gpu-box-2" / "worker.log"]

    def wait(run_id, timeout_s=900):
        return _wait_terminal(cluster.api_url, run_id, [p for p in worker_logs if p.exists()], timeout_s)

    # The same round inline, in its own process, state folder and MLflow store: the session's uninterrupted round
    # of the crash test (tests/flows/test_crash_resume.py), shared with it.
    crash_round.start()
    # Two runs of the placed round at once with 'fail': one takes the run's slot, the other fails at once.
    placed = _placed_config(
        tiny_config, root / "shared" / "placed",
        placement={"round_concurrency": "fail", "stage_timeout_s": KILLED_STAGE_TIMEOUT_S},
        tracking={"mlflow_uri": cluster.mlflow_uri},
    )  # fmt: skip
    racing = [_start_round(cluster, placed), _start_round(cluster, placed)]
    # The GPU worker dies with -9 during the winner's rollout, and a new one starts.
    deadline = time.monotonic() + 600
    while not _trajectory_files(placed) and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill_tree(cluster.processes["gpu-worker"])
    durable_at_kill = len(_trajectory_files(placed))
    rollout_done_at_kill = _stage_done(placed, "rollout")
    cluster.processes["gpu-worker"] = _start_worker("coevolve-gpu", "gpu-worker-2", root / "gpu-box-2", cluster.api_url)
    # Started at once with 'wait': it waits for the run's slot until the winner gives up on its rollout, then
    # resumes the round on the new worker.
    waiting = _start_round(
        cluster,
        placed.with_overrides(
            {"placement": {"round_concurrency": "wait", "round_wait_s": 900, "stage_timeout_s": 3600}}
        ),
    )
    racing_states = {r: wait(r) for r in racing}
    waiting_state = wait(waiting)
    # The racer that fails at once ends first; the winner ends when it gives up on the dead worker's stage.
    loser, winner = sorted(racing, key=lambda r: _flow_run(cluster.api_url, r)["end_time"])
    inline = crash_round.wait()
    return SimpleNamespace(
        inline=inline, placed=placed, racing_states=racing_states, loser=loser, winner=winner, waiting=waiting,
        waiting_state=waiting_state, durable_at_kill=durable_at_kill, rollout_done_at_kill=rollout_done_at_kill,
    )  # fmt: skip


# --- helpers for the checks ---------------------------------------------------------------------------


def _version(config):
    """The round's registered model version, read back through the config's tracking URI (once per finished round)."""
    uri = config.mlflow_tracking_uri
    return _version_of(str(config.warehouse_path), config.run_id, uri, config.registered_model_name)


@functools.cache
def _version_of(warehouse_path: str, run_id: str, tracking_uri: str, model_name: str):
    with Warehouse(warehouse_path, read_only=True) as wh:
        recorded = wh.stage_output(run_id, 0, "version")
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    return client, recorded, client.get_model_version(model_name, recorded["model_version"])


# --- placement ------------------------------------------------------------------------------------------


def test_the_racing_rounds_both_fail_and_the_waiting_round_completes(rounds) -> None:
    assert list(rounds.racing_states.values()) == ["FAILED", "FAILED"]
    assert rounds.waiting_state == "COMPLETED"


@pytest.mark.parametrize("stage", GPU_STAGES + CPU_STAGES)
def test_each_stage_runs_on_the_worker_of_its_pool(cluster, rounds, stage) -> None:
    pool = "coevolve-gpu" if stage in GPU_STAGES else "coevolve-cpu"
    # Rollout and update run once per training step (CRASH_OVERRIDES: two), each named after its step; every GPU
    # stage that completed ran after the first GPU worker was killed.
    steps = rounds.placed.training.batches_per_round if stage in STEP_STAGES else 1
    placed = _stage_runs(cluster.api_url, rounds.placed)
    for k in range(steps):
        (run,) = [r for r in placed[record_name(stage, k)] if r["state"]["type"] == "COMPLETED"]
        assert run["work_pool_name"] == pool
        assert run["labels"]["prefect.worker.name"] == ("gpu-worker-2" if stage in GPU_STAGES else "cpu-worker")


@pytest.mark.parametrize("table", list(CONTENT))
def test_the_placed_round_writes_the_inline_rounds_rows(rounds, table) -> None:
    # Episodes replayed after the kill are batched with fewer others (see test_crash_resume).
    assert_same_rows(table, warehouse_content(rounds.placed)[table], warehouse_content(rounds.inline)[table])


def test_the_placed_round_registers_the_inline_rounds_pool_and_checkpoint_once(rounds) -> None:
    _, inline_record, inline_version = _version(rounds.inline)
    client, placed_record, placed_version = _version(rounds.placed)
    assert placed_record["pool_digest"] == inline_record["pool_digest"]
    for tag in ("pool_digest", "produced_pool_digest", "checkpoint_digest"):
        assert placed_version.tags[tag] == inline_version.tags[tag] != ""
    versions = client.search_model_versions(f"name = '{rounds.placed.registered_model_name}'")
    assert [str(v.version) for v in versions] == ["1"]


# --- the run's slot -----------------------------------------------------------------------------------------


def test_a_second_round_of_the_run_fails_at_once_naming_the_run(cluster, rounds) -> None:
    message = _flow_run(cluster.api_url, rounds.loser)["state"]["message"]
    assert f"Run '{RUN_ID}' is already running a round on another machine" in message
    assert f"coevolve-run-{RUN_ID}" in message


def test_a_waiting_round_takes_the_slot_when_the_round_holding_it_ends(cluster, rounds) -> None:
    holder, waiting = _flow_run(cluster.api_url, rounds.winner), _flow_run(cluster.api_url, rounds.waiting)
    assert waiting["start_time"] < holder["end_time"] <= waiting["end_time"]
    runs = _stage_runs(cluster.api_url, rounds.placed)
    assert {name: len(r) for name, r in runs.items() if len(r) != 1} == {record_name("rollout", 0): 2}


# --- a worker killed with -9 ------------------------------------------------------------------------------------


def test_the_gpu_worker_died_during_rollout(rounds) -> None:
    assert rounds.durable_at_kill >= 1 and not rounds.rollout_done_at_kill


def test_the_round_waiting_on_the_dead_worker_fails_after_the_stage_timeout(cluster, rounds) -> None:
    message = _flow_run(cluster.api_url, rounds.winner)["state"]["message"]
    assert "Stage rollout of round 0 ran as deployment coevolve-stage/rollout-gpu" in message
    assert f"was still Running after {KILLED_STAGE_TIMEOUT_S:.0f} s (placement.stage_timeout_s)" in message


def test_the_round_cancels_the_stage_it_gave_up_on(cluster, rounds) -> None:
    """The given-up run is CANCELLING while no worker of its pool is alive; the new GPU worker's cancellation
    check may have finished it (CANCELLED) by the time it is read, depending on how loaded the machine is."""
    states = sorted(r["state"]["type"] for r in _stage_runs(cluster.api_url, rounds.placed)["rollout"])
    assert states in (["CANCELLING", "COMPLETED"], ["CANCELLED", "COMPLETED"])


def test_the_round_run_again_on_a_new_worker_completes(cluster, rounds) -> None:
    rollout = [r for r in _stage_runs(cluster.api_url, rounds.placed)["rollout"] if r["state"]["type"] == "COMPLETED"]
    assert [r["labels"]["prefect.worker.name"] for r in rollout] == ["gpu-worker-2"]


# --- MLflow ----------------------------------------------------------------------------------------------------


def test_the_version_is_registered_through_the_tracking_server(cluster, rounds) -> None:
    client, _, version = _version(rounds.placed)
    assert rounds.placed.mlflow_tracking_uri == cluster.mlflow_uri
    assert client.get_model_version_by_alias(rounds.placed.registered_model_name, "current").version == version.version
    assert not (rounds.placed.state_dir / "mlflow.db").exists()


def test_the_tracking_server_stores_the_copied_checkpoint(cluster, rounds) -> None:
    client, _, version = _version(rounds.placed)
    assert version.source.startswith("mlflow-artifacts:/")
    assert "checkpoint" in {a.path for a in client.list_artifacts(version.run_id)}
    experiment = client.get_experiment_by_name(rounds.placed.tracking.experiment)
    stored = [p for p in (cluster.artifacts / experiment.experiment_id).rglob("*") if p.is_file()]
    assert [p for p in stored if "checkpoint" in p.parts and p.name == "model.safetensors"]


# --- the nightly deployment ------------------------------------------------------------------------------------


def test_the_scheduler_creates_the_nightly_runs_prefect_yaml_defines(cluster) -> None:
    (nightly,) = [
        d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"] if d["name"] == "nightly"
    ]
    assert nightly["schedules"][0]["cron"] == "0 1 * * *"
    runs = cluster.nightly_scheduled
    assert len(runs) >= 1 and all(r["auto_scheduled"] for r in runs)
    starts = [datetime.datetime.fromisoformat(r["expected_start_time"]) for r in runs]
    assert all((s.astimezone(datetime.UTC).hour, s.minute, s.second) == (1, 0, 0) for s in starts)
    assert all(r["parameters"] == nightly["parameters"] for r in runs)
    assert "bulk DML" not in (cluster.root / "server.log").read_text()


def test_a_worker_runs_a_scheduled_nightly_run_to_completion(cluster) -> None:
    state = _wait_terminal(
        cluster.api_url, cluster.nightly_run, [cluster.root / "cpu-box" / "worker.log"], timeout_s=300
    )
    run = _flow_run(cluster.api_url, cluster.nightly_run)
    assert state == "COMPLETED", run["state"]["message"]
    assert run["auto_scheduled"] and run["work_pool_name"] == "coevolve-cpu"
    assert run["labels"]["prefect.worker.name"] == "cpu-worker"
