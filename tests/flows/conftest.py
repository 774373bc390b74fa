"""A real Prefect API for flow tests: Prefect's own test harness (a temporary database and server)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import yaml
from prefect.testing.utilities import prefect_test_harness

from coevolve.errors import PipelineError
from storage.warehouse import Warehouse
from tests.conftest import make_tiny_config, migrated_prefect_home


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny_config():
    return make_tiny_config


# --- Rounds in their own processes, through the real CLI -----------------------------------------

REPO = Path(__file__).resolve().parents[2]


def write_config_file(config, path: Path) -> Path:
    """The configuration as the YAML file a user would pass to ``coevolve --config``."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return path


def cli_env(state_dir: Path, prefect_home: Path | None = None, *, migrated: bool = True) -> dict[str, str]:
    """Offline switches plus a Prefect home of its own (default: the state folder's), for a temporary API per
    process. The home's database comes migrated (`tests.conftest.migrated_prefect_home`) unless ``migrated`` is
    False: a test that tells from the home whether Prefect started leaves it as a user's new home is."""
    home = prefect_home or state_dir / "prefect"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DO_NOT_TRACK="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        TOKENIZERS_PARALLELISM="false",
        PREFECT_HOME=str(migrated_prefect_home(home) if migrated else home),
        BFCL_PROJECT_ROOT=str(state_dir / "bfcl"),
        PYTHONPATH=str(REPO),
    )
    return env


def install_package(folder: Path, module: str, source: str, group: str, entry: str) -> Path:
    """``folder`` holding one module and the metadata of a package that declares ``entry`` (``name = module:Class``)
    under the entry-point group ``group``, as installing such a package leaves them; returns ``folder``."""
    folder.mkdir()
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    return folder


def env_with_package(state_dir: Path, package: Path) -> dict[str, str]:
    """`cli_env` for a command that runs where the package in ``package`` (`install_package`) is installed."""
    env = cli_env(state_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(package), env["PYTHONPATH"]])
    return env


def start_round(
    config_file: Path, state_dir: Path, round_: int, log: Path, prefect_home: Path | None = None
) -> subprocess.Popen:
    """``coevolve round --round R --config FILE`` in a new process group (its temporary Prefect API joins it)."""
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "round", "--round", str(round_), "--config", str(config_file)],
            cwd=REPO,
            env=cli_env(state_dir, prefect_home),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen) -> None:
    """kill -9 the round and every process it started (its group), by the round's process id."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def wait_for_stage(config, round_: int, stage: str, process: subprocess.Popen, timeout_s: float = 600) -> None:
    """Polls the warehouse (read-only, like an analyst) until ``stage`` of the round is marked finished."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the round exited with {process.returncode} before stage {stage} finished")
        if config.warehouse_path.exists():
            try:
                with Warehouse(config.warehouse_path, read_only=True) as wh:
                    if wh.stage_output(config.run_id, round_, stage) is not None:
                        return
            except PipelineError:
                pass  # the round has not created the warehouse yet
        time.sleep(0.1)
    raise AssertionError(f"stage {stage} of round {round_} did not finish within {timeout_s:.0f} s")


@pytest.fixture(scope="session")
def cli():
    """Helpers to run rounds through the CLI in separate processes and kill them."""
    return types.SimpleNamespace(
        write_config_file=write_config_file,
        start_round=start_round,
        kill_group=kill_group,
        wait_for_stage=wait_for_stage,
    )
