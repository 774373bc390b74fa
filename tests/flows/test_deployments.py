"""prefect.yaml end to end: a real local Prefect server, `prefect deploy`, a process worker, one deployment run.

Everything binds 127.0.0.1 on a free port with its own PREFECT_HOME; the worker is stopped before
the server, both by their process ids.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agent.serve import free_port as _free_port
from storage.warehouse import Warehouse
from tests.conftest import PREFECT, migrated_prefect_home

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# How long a test waits for the Prefect server to answer: Prefect's own clients wait 60 s
# (PREFECT_API_REQUEST_TIMEOUT). On two cores busy with rounds, workers and flow-run processes starting up,
# the server can take longer than 10 s to answer one read.
API_TIMEOUT_S = 60.0
# What _flow_run_state says when the server did not answer in time: not terminal, so a poller asks again.
UNANSWERED = "UNANSWERED"
# Prefect's workers ask for due runs every 10 s; every stage of a placed round is a flow run that waits for
# that query, so at 2 s the rounds spend their time in the stages, not in the wait. Not every second: on two
# cores the same server answers the workers' queries too.
WORKER_QUERY_SECONDS = "2"


def _env(home: Path, api_url: str, state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DO_NOT_TRACK="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        TOKENIZERS_PARALLELISM="false",
        PREFECT_HOME=str(migrated_prefect_home(home)),  # the server's database, migrated once per test process
        PREFECT_API_URL=api_url,
        PREFECT_WORKER_QUERY_SECONDS=WORKER_QUERY_SECONDS,
        BFCL_PROJECT_ROOT=str(state_dir / "bfcl"),
        PYTHONPATH=str(REPO),
        PWD=str(REPO),  # prefect.yaml's pull step records {{ $PWD }}: the checkout flow runs start in
    )
    return env


def _stop(process: subprocess.Popen) -> None:
    """Interrupt the process group (Prefect shuts down cleanly on SIGINT); kill it if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _wait_healthy(api_url: str, server: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"the Prefect server was not healthy after {timeout_s:.0f} s")


def _flow_run(api_url: str, flow_run_id: str) -> dict:
    return httpx.get(f"{api_url}/flow_runs/{flow_run_id}", timeout=API_TIMEOUT_S).json()


def _flow_run_state(api_url: str, flow_run_id: str) -> str:
    """The flow run's state type, or UNANSWERED when the server was too busy to answer within API_TIMEOUT_S."""
    try:
        return _flow_run(api_url, flow_run_id)["state"]["type"]
    except httpx.TimeoutException:
        return UNANSWERED


def test_the_per_round_deployment_runs_a_round_on_a_process_worker(tiny_config, tmp_path) -> None:
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    config = tiny_config(tmp_path / "state", run_id="deployed")
    env = _env(tmp_path / "prefect-home", api_url, config.state_dir)

    def prefect(*args: str) -> str:
        done = subprocess.run([str(PREFECT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    with server_log.open("w") as out:
        server = subprocess.Popen(
            [str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = None
    try:
        _wait_healthy(api_url, server, server_log)
        prefect("work-pool", "create", "coevolve-cpu", "--type", "process")
        prefect("--no-prompt", "deploy", "-n", "per-round")
        with worker_log.open("w") as out:
            worker = subprocess.Popen(
                [str(PREFECT), "worker", "start", "--pool", "coevolve-cpu"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        created = prefect(
            "deployment",
            "run",
            "coevolve-round/per-round",
            "--params",
            json.dumps({"round_": 0, "config": config.model_dump(mode="json")}),
        )
        flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", created).group(1)
        deadline = time.monotonic() + 600
        state = _flow_run_state(api_url, flow_run_id)
        while state not in TERMINAL and time.monotonic() < deadline:
            time.sleep(2)
            state = _flow_run_state(api_url, flow_run_id)
        assert state == "COMPLETED", worker_log.read_text()[-4000:]
    finally:
        if worker is not None:
            _stop(worker)  # the worker first: it reports to the server while it shuts down
        _stop(server)

    with Warehouse(config.warehouse_path, read_only=True) as wh:
        (summary,) = wh.rounds("deployed")
    assert summary.round == 0 and summary.flow_run_id == flow_run_id
