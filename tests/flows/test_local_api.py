"""A command's temporary Prefect API (flows/local_api.py) is the one Prefect API of the command and what it starts.

One process starts it as a command does (``local_api.start()``, no ``PREFECT_API_URL`` set, importing a round's
libraries while the server starts) and reports what a client sees from its main thread, from a thread of its own
and from a process it starts, and whether Prefect's server module was imported. How the API ends with a command
killed or interrupted is tests/flows/test_interrupts.py.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

from coevolve.config import PipelineConfig
from flows import local_api
from flows.round import round_imports
from tests.flows.conftest import REPO, cli_env
from tests.small_disk import fill, small_disk

PROBE = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading

    import psutil
    from prefect.client.orchestration import get_client
    from coevolve.config import PipelineConfig
    from coevolve.optional import preload
    from flows import local_api
    from flows.round import round_imports

    imports = round_imports(PipelineConfig())
    during = {}
    def while_starting():
        during["server_running"] = any(
            "flows.local_api" in " ".join(child.cmdline()) for child in psutil.Process().children()
        )
        during["api_named"] = "PREFECT_API_URL" in os.environ
        preload(imports)

    server = local_api.start(while_starting=while_starting)
    seen = {"started": server.api_url, "main": get_client(sync_client=True).api_url.__str__()}
    seen["while_starting"] = during
    seen["preloaded"] = {name: name in sys.modules for name in imports}
    def from_thread():
        seen["thread"] = str(get_client(sync_client=True).api_url)
    thread = threading.Thread(target=from_thread)
    thread.start()
    thread.join()
    child = "from prefect.settings import PREFECT_API_URL as U; from flows import local_api as L; "
    child += "print(U.value(), L.on_temporary_api())"
    seen["child"], seen["child_on_temporary_api"] = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True
    ).stdout.split()
    seen["on_temporary_api"] = local_api.on_temporary_api()
    called = []
    seen["again"] = local_api.start(while_starting=lambda: called.append(True))
    seen["again_called"] = called == [True]
    seen["server_module_imported"] = "prefect.server.api.server" in sys.modules
    print(json.dumps(seen))
    """
)


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    state = tmp_path_factory.mktemp("local-api")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=cli_env(state), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_client_of_the_command_uses_its_temporary_api(seen) -> None:
    assert seen["started"].startswith("http://127.0.0.1:") and seen["started"].endswith("/api")
    assert seen["main"].rstrip("/") == seen["thread"].rstrip("/") == seen["started"]


def test_a_process_the_command_starts_is_given_the_same_api(seen) -> None:
    assert seen["child"] == seen["started"]


def test_the_command_and_its_processes_know_the_api_is_not_a_server(seen) -> None:
    """So a round takes no run slot on it (flows/stage.py `run_slot`): the file lock guards the machine, and a slot
    in the home's database would outlive a command killed with -9."""
    assert seen["on_temporary_api"] is True
    assert seen["child_on_temporary_api"] == "True"


def test_a_configured_server_is_not_taken_for_a_temporary_api(monkeypatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.delenv(local_api.TEMPORARY_API_VAR, raising=False)
    assert local_api.on_temporary_api() is False


def test_a_second_start_in_the_same_process_starts_nothing(seen) -> None:
    assert seen["again"] is None
    assert seen["again_called"] is True  # the command's own work still runs, at once


def test_the_command_imports_its_rounds_libraries_while_the_server_starts(seen) -> None:
    """The server (its imports; a new home's migrations) starts in its own process while the command imports."""
    assert seen["while_starting"] == {"server_running": True, "api_named": False}
    assert seen["preloaded"] == {
        "mlflow": True, "torch": True, "mlflow.store.tracking.sqlalchemy_store": True,
        "transformers.models.auto.modeling_auto": True,
    }  # fmt: skip


def test_a_round_imports_here_only_what_its_inline_stages_and_its_store_need() -> None:
    placed = {"rollout": "coevolve-stage/rollout-gpu", "evaluate": "coevolve-stage/evaluate-gpu"}
    config = PipelineConfig.model_validate({"placement": placed, "tracking": {"mlflow_uri": "http://127.0.0.1:5000"}})
    assert round_imports(config) == ["mlflow", "torch"]
    assert "transformers.models.auto.modeling_auto" in round_imports(
        config.with_overrides({"placement": {"evaluate": "inline"}})
    )


def test_a_failure_while_the_server_starts_stops_the_server_and_is_raised(tmp_path: Path) -> None:
    probe = textwrap.dedent(
        """
        import json, psutil
        from flows import local_api
        servers = []
        def while_starting():
            servers.extend(c for c in psutil.Process().children() if "flows.local_api" in " ".join(c.cmdline()))
            raise ModuleNotFoundError("no torch here")
        try:
            local_api.start(while_starting=while_starting)
        except ModuleNotFoundError as exc:
            running = [server.is_running() for server in servers]
            print(json.dumps({"raised": str(exc), "servers": len(servers), "running": running}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "raised": "no torch here",
        "servers": 1,
        "running": [False],
    }


def test_the_command_does_not_import_prefects_server_module(seen) -> None:
    """The server module (about 4 CPU-seconds to import) is imported by the API's own process only."""
    assert seen["server_module_imported"] is False


def test_the_api_ends_with_the_command(seen) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{seen['started']}/health", timeout=5)


def test_a_server_that_never_answers_fails_with_the_setting_that_gives_it_longer(tmp_path: Path) -> None:
    env = cli_env(tmp_path) | {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0"}
    done = subprocess.run(
        [sys.executable, "-c", "from flows import local_api; local_api.start()"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in done.stderr


def test_a_server_that_exits_before_answering_fails_with_its_status_and_the_way_around_it(tmp_path: Path) -> None:
    # A setting the server cannot read (the command read its own before the value was spoiled).
    probe = "import os; from flows import local_api; "
    probe += "os.environ['PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS'] = 'soon'; local_api.start()"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "temporary Prefect API exited with status 1 before answering" in done.stderr
    assert "set PREFECT_API_URL" in done.stderr


def test_a_full_disk_while_the_server_starts_is_one_line_naming_the_folder_to_free(tmp_path: Path) -> None:
    """The server's error went to the command's log, which a full disk leaves empty: the line must carry it."""
    probe = textwrap.dedent(
        """
        from coevolve.errors import PipelineError
        from flows import local_api
        try:
            local_api.start()
        except PipelineError as exc:
            print(f"error: {exc}")
        """
    )
    with small_disk(tmp_path / "disk", 4096) as disk:
        fill(disk, 40 * 1024)
        home = disk / "prefect"
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO, env=cli_env(tmp_path, home, migrated=False),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.stdout.strip().splitlines() == [
        f"error: no space left on device under {home}; free space and run the same command again"
    ], done.stderr[-3000:]


def test_flow_runs_on_a_temporary_api_send_no_heartbeats(monkeypatch) -> None:
    """Nothing watches them there, and a flow run's end waits up to a second for Prefect's heartbeat thread."""
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.setenv(local_api.TEMPORARY_API_VAR, "http://127.0.0.1:4200/api")
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 180}):  # Prefect's default: on
        with local_api.no_heartbeats_on_temporary_api():
            assert get_current_settings().flows.heartbeat_frequency is None
        assert get_current_settings().flows.heartbeat_frequency == 180


def test_flow_runs_on_a_server_keep_prefects_heartbeats(monkeypatch) -> None:
    """A server's zombie detection marks a run whose process died by its missing heartbeats."""
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.delenv(local_api.TEMPORARY_API_VAR, raising=False)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 180}):
        with local_api.no_heartbeats_on_temporary_api():
            assert get_current_settings().flows.heartbeat_frequency == 180
