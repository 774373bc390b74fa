"""Helpers for flow tests: rounds through the real CLI in their own processes, and the crash test's round. (The
Prefect API of flows run in the test process, `prefect_api`, is in tests/conftest.py.)"""

from __future__ import annotations

import fcntl
import functools
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

from coevolve.errors import PipelineError
from storage.warehouse import Warehouse
from tasks.prepare import initial_checkpoint
from tasks.splits import build_initial_pools
from tests.conftest import make_tiny_config, migrated_mlflow_store, migrated_prefect_home, session_folder


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
    process. The home's database and the state folder's MLflow store come migrated
    (`tests.conftest.migrated_prefect_home`, `tests.conftest.migrated_mlflow_store`) unless ``migrated`` is False: a
    test that tells from the folders what a command made leaves them as a user's new folders are."""
    home = prefect_home or state_dir / "prefect"
    if migrated:
        migrated_mlflow_store(state_dir)
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


def run_on_terminal(command: list[str], env: dict[str, str], timeout_s: float = 900) -> tuple[int, str]:
    """Run ``command`` on a pseudo-terminal of 40 x 120 (where progress bars draw), in a process group of its own
    from the repository; its exit status and everything it wrote to the terminal."""
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, start_new_session=True
    )
    os.close(terminal)
    received = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: every process holding it has exited
                break
            if not chunk:
                break
            received += chunk
        return process.wait(timeout=60), received.decode(errors="replace")
    finally:
        os.close(master)
        kill_group(process)


def screen_lines(screen: str) -> list[str]:
    """What stays on a terminal's screen: each line as its last carriage return left it."""
    return [line.split("\r")[-1] for line in screen.split("\r\n")]


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


# --- the crash test's round, run once per session ------------------------------------------------------


def build_checkpoint_0(config) -> None:
    """Checkpoint 0 of ``config`` (the builtin tiny policy) built into the session's policy cache, once per session.

    Rounds started at once in new state folders would each build it (the cache holds a build only once one
    finishes); built here first, under a lock every pytest-xdist worker shares, each round copies it, as a round
    does whenever another run built the same recipe before (`tasks.prepare.initial_checkpoint`).
    """
    cache = Path(config.policy_cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{cache}.lock"):
        scratch = Path(tempfile.mkdtemp(prefix="checkpoint-0-", dir=cache.parent))
        try:
            here = config.with_overrides({"state_dir": str(scratch / "state")})
            initial_checkpoint(here, *build_initial_pools(here))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


# A round with signals, candidates and a growing pool, so every table has rows to compare (tests/flows/
# test_crash_resume.py kills and resumes it, tests/flows/test_work_pools.py places it on work pools).
CRASH_OVERRIDES = {
    "policy": {"sft_tasks": 80, "sft_steps": 160, "hidden_size": 48},
    "rollout": {"group_size": 4},
    # One episode per durable batch, so the rollout can be killed between its writes.
    "warehouse": {"flush_every": 1},
    # Two training steps, so a kill lands inside the second one, which resumes the first one's optimizer state.
    "training": {"batches_per_round": 2},
}


# Deterministic content of each table (no timestamps or durations), in a fixed order.
CONTENT = {
    "trajectories": "SELECT * EXCLUDE (duration_s) FROM trajectories ORDER BY trajectory_id",
    "steps": "SELECT * FROM steps ORDER BY trajectory_id, step_index",
    "signals": "SELECT * FROM signals ORDER BY signal_id",
    "candidates": "SELECT * FROM candidates ORDER BY task_id, signal_key",
    "pool_membership": "SELECT * FROM pool_membership ORDER BY round, position",
    "tasks": "SELECT * FROM tasks ORDER BY task_id",
    "evaluations": "SELECT * FROM evaluations ORDER BY round, split, task_id",
}


@functools.cache
def _content_of(warehouse_path: str) -> dict[str, list[dict]]:
    with Warehouse(warehouse_path, read_only=True) as wh:
        return {table: wh.sql(query).to_dicts() for table, query in CONTENT.items()}


def warehouse_content(config) -> dict[str, list[dict]]:
    """Every `CONTENT` table of the finished run's warehouse, read once per test process: the tests of each table
    compare the same finished runs (reading all tables takes seconds)."""
    return _content_of(str(config.warehouse_path))


class SessionRound:
    """``coevolve round --round 0`` of one configuration, uninterrupted, in its own process and state folder, run
    once per test session: the modules that compare their own runs of that round with it (every pytest-xdist
    worker together) share it.

    `start` builds its checkpoint 0 into the session's policy cache first (`build_checkpoint_0`: a
    module's own rounds of the same settings, started next, copy it), then runs the round in a thread unless another
    module has run it or is running it (a lock in the session's folder, which the second one waits on); `wait`
    returns its configuration once it finished with exit code 0.
    """

    def __init__(self, folder: Path, config) -> None:
        self.folder, self.config = folder, config
        self.log = folder / "round.log"
        self.process: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._run, name=f"session-round-{folder.name}", daemon=True)

    def start(self) -> SessionRound:
        if self.thread.ident is None:
            build_checkpoint_0(self.config)
            self.thread.start()
        return self

    def _run(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{self.folder}.lock"):
            if (self.folder / "exit_code").exists():
                return
            config_file = write_config_file(self.config, self.folder / "config.yaml")
            self.process = start_round(config_file, self.config.state_dir, 0, self.log)
            try:
                code = self.process.wait(timeout=1800)
            finally:
                kill_group(self.process)  # the temporary Prefect API it started, if still there
            (self.folder / "exit_code").write_text(str(code))

    def wait(self, timeout_s: float = 1800):
        self.start().thread.join(timeout_s)
        assert not self.thread.is_alive(), f"the session's round did not finish within {timeout_s:.0f} s"
        exit_code = self.folder / "exit_code"
        # Missing: the thread failed before the round ended (pytest shows its exception as a warning).
        assert exit_code.exists(), "the session's round did not finish:\n" + (
            self.log.read_text()[-3000:] if self.log.exists() else "(no log)"
        )
        code = int(exit_code.read_text())
        assert code == 0, f"the session's round exited with {code}:\n" + self.log.read_text()[-3000:]
        return self.config

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process)


@pytest.fixture(scope="session")
def crash_round(tmp_path_factory):
    """The crash test's round (`CRASH_OVERRIDES`, run id ``e2e``) uninterrupted, once per session (`SessionRound`)."""
    folder = session_folder(tmp_path_factory, "crash-round")
    shared = SessionRound(folder, make_tiny_config(folder / "state", **CRASH_OVERRIDES))
    yield shared
    shared.stop()
