"""Stopping `coevolve evolve` and `coevolve round`: nothing they started is left, the console gets a few lines.

One tiny run, through the real CLI, each command in its own session with its console (stdout and stderr
together) in a file:

1. `coevolve evolve` is killed with -9 (its own pid only) once its temporary Prefect API answers and round 0
   runs: within seconds no process it started is left and the API's port is free;
2. the same command resumes round 0 and says so; while it runs, a third command on the run is refused by the
   round lock within seconds, before any Prefect server starts; once the round's prepare stage is recorded,
   the second command gets SIGINT, as a terminal's Ctrl-C sends it to the foreground process group;
3. `coevolve round` resumes the round with a setting changed, which the round refuses once Prefect runs;
4. (the tests) the checkpoint and the pool the round starts from, damaged, are refused within seconds.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
import polars as pl
import pytest
from filelock import FileLock, Timeout

from coevolve.errors import PipelineError
from storage.warehouse import Warehouse
from tests.conftest import live_server_processes
from tests.flows.conftest import REPO, cli_env, kill_group, wait_for_stage, write_config_file

pytestmark = pytest.mark.slow

CONSOLE_LINES = 5  # the most an interrupted, refused or failed command may print
GONE_WITHIN_S = 5.0  # after the command ends, what it started must be gone within this
REFUSED_WITHIN_S = 10.0  # a refusal before Prefect starts, on a slow shared machine
# The records of a round of one training step, in the order it writes them.
RECORDS = ("prepare", "rollout", "update", "mine", "synthesize", "validate", "evaluate", "version")
SERVER_APP = "prefect.server.api.server:create_app"  # on the command line of Prefect's temporary API


def _processes() -> dict[int, tuple[int, str, int, str]]:
    """Every process: pid -> (parent pid, state, start time in clock ticks, command line), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found[int(entry.name)] = (int(fields[1]), fields[0], int(fields[19]), cmdline)
    return found


class Command:
    """A `coevolve` command in a new session (as a terminal starts a job), and every process it started."""

    def __init__(self, folder: Path, name: str, args: list[str], env: dict[str, str]) -> None:
        self.console = folder / f"{name}.console"
        self.marker = str(folder)
        with self.console.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flows.cli", *args],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Every process it started that was seen: pid -> (start time, command line), which tell a reused pid.
        self.started: dict[int, tuple[int, str]] = {}

    def look(self) -> None:
        """Note the processes it runs now (its descendants, wherever their session)."""
        processes = _processes()
        parents = {self.process.pid}
        for _ in range(len(processes)):
            children = {pid for pid, (ppid, *_) in processes.items() if ppid in parents} - parents
            if not children:
                break
            parents |= children
            for pid in children:
                start, cmdline = processes[pid][2], processes[pid][3]
                # A child seen between fork and exec still shows its parent's command line: the same process
                # (same start time) seen later is noted with the line it runs (a zombie's line is empty).
                if pid not in self.started or (self.started[pid][0] == start and cmdline):
                    self.started[pid] = (start, cmdline)

    def wait_until(self, condition: Callable[[], object], what: str, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.look()
            if condition():
                return
            if self.process.poll() is not None:
                raise AssertionError(f"exited with {self.process.returncode} before {what}:\n{self.text()[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"no {what} within {timeout_s:.0f} s:\n{self.text()[-3000:]}")

    def finish(self, timeout_s: float = 600) -> int:
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            assert time.monotonic() < deadline, f"still running after {timeout_s:.0f} s"
            self.look()
            time.sleep(0.2)
        return self.process.returncode

    def server(self) -> tuple[int, int] | None:
        """Its temporary Prefect API's process id and port, once the API answers."""
        for pid, (_, cmdline) in self.started.items():
            port = re.search(r"--port (\d+)", cmdline)
            if SERVER_APP in cmdline and port:
                try:
                    if httpx.get(f"http://127.0.0.1:{port[1]}/api/health", timeout=2).status_code == 200:
                        return pid, int(port[1])
                except httpx.HTTPError:
                    pass
        return None

    def left(self) -> list[tuple[int, str]]:
        """Processes it started that still run (a zombie holds nothing), its group's included."""
        processes = _processes()
        alive = [
            (pid, cmdline[:200])
            for pid, (start, cmdline) in self.started.items()
            if pid in processes and processes[pid][2] == start and processes[pid][1] != "Z"
        ]
        groups = [self.process.pid, *self.started]
        return sorted(set(alive) | set(live_server_processes(groups, self.marker)))

    def left_after(self, seconds: float) -> tuple[list[tuple[int, str]], float]:
        """What is still left ``seconds`` after it ended (checked as it goes), and how long the rest took to go."""
        t0 = time.monotonic()
        while (left := self.left()) and time.monotonic() - t0 < seconds:
            time.sleep(0.1)
        return left, time.monotonic() - t0

    def text(self) -> str:
        return self.console.read_text()

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def stop(self) -> None:
        """Ends what the test started: the command's group, and what it started elsewhere."""
        if self.process.poll() is None:
            kill_group(self.process)
        for pid, _ in self.left():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _evolve(config_file: Path) -> list[str]:
    return ["evolve", "--rounds", "1", "--config", str(config_file)]


def _round_record(config) -> dict | None:
    """Round 0's record (status, flow run id), read as an analyst would; None before the round starts."""
    try:
        with Warehouse(config.warehouse_path, read_only=True) as wh:
            records = wh.round_records(config.run_id)
    except PipelineError:
        return None  # no warehouse yet
    return records[0] if records else None


def _next_record(config) -> str:
    """Where round 0 stands: its first stage without a record."""
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return next((r for r in RECORDS if wh.stage_output(config.run_id, 0, r) is None), "none: round 0 finished")


def _port_is_free(port: int) -> bool:
    """Nothing listens on ``port`` (the killed server's closed connections may linger in TIME_WAIT)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _lock_is_held(config) -> bool:
    lock = FileLock(str(config.run_dir() / "round.lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


def _refused(folder: Path, config, name: str, args: list[str]) -> SimpleNamespace:
    """A command expected to be refused before Prefect starts, with a Prefect home of its own to tell.

    It is stopped after a while if it is not refused by then, so the command it is refused beside runs on.
    """
    home = folder / f"prefect-{name}"
    command = Command(folder, name, args, cli_env(config.state_dir, home, migrated=False))
    t0 = time.monotonic()
    try:
        returncode = command.process.wait(timeout=2 * REFUSED_WITHIN_S)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        command.stop()
    return SimpleNamespace(
        returncode=returncode,
        lines=command.lines(),
        seconds=time.monotonic() - t0,
        prefect_started=(home / "prefect.db").exists(),
    )


@pytest.fixture(scope="module")
def run(tiny_config, tmp_path_factory):
    folder = tmp_path_factory.mktemp("interrupts")
    # A longer policy build than the tiny round's keeps the resumed command in prepare, holding the round lock,
    # well past the second command's refusal.
    config = tiny_config(folder / "state", policy={"sft_steps": 120})
    config_file = write_config_file(config, folder / "tiny.yaml")
    env = cli_env(config.state_dir)
    out = SimpleNamespace(config=config, config_file=config_file, folder=folder)
    commands: list[Command] = []
    try:
        # 1. kill -9 of the command alone, once its API answers and round 0 runs.
        killed = Command(folder, "killed", _evolve(config_file), env)
        commands.append(killed)
        killed.wait_until(lambda: killed.server() and (_round_record(config) or {}).get("status") == "running", "API")
        server = killed.server()
        assert server is not None
        out.killed_port = server[1]
        out.killed_flow_run = (_round_record(config) or {})["flow_run_id"]
        killed.process.send_signal(signal.SIGKILL)
        killed.process.wait(timeout=60)
        out.killed_left, out.killed_gone_s = killed.left_after(GONE_WITHIN_S)
        out.killed_port_free = _port_is_free(out.killed_port)
        out.stage_after_kill = _next_record(config)

        # 2. The same command resumes; a third is refused by the lock; Ctrl-C once prepare is recorded.
        resumed = Command(folder, "resumed", _evolve(config_file), env)
        commands.append(resumed)
        resumed.wait_until(
            lambda: (
                (_round_record(config) or {}).get("flow_run_id") not in (None, out.killed_flow_run)
                and _lock_is_held(config)
            ),
            "round 0 taken over by the resumed command",
        )
        out.refused_by_lock = _refused(folder, config, "lock", _evolve(config_file))
        out.lock_holder_ran_on = resumed.process.poll() is None
        try:
            wait_for_stage(config, 0, "prepare", resumed.process)
        except AssertionError:
            pass  # it ended first: the tests say how
        else:
            resumed.look()
            os.killpg(resumed.process.pid, signal.SIGINT)
        out.interrupted_rc = resumed.finish(timeout_s=300)
        out.interrupted_left, _ = resumed.left_after(GONE_WITHIN_S)
        out.interrupted = resumed.lines()
        out.stage_after_interrupt = _next_record(config)

        # 3. `coevolve round` resumes it with a setting the round was not started with.
        changed = Command(
            folder,
            "changed",
            ["round", "--round", "0", "--config", str(config_file), "--set", "rollout.group_size=3"],
            env,
        )
        commands.append(changed)
        out.failed_rc = changed.finish()
        out.failed_left, _ = changed.left_after(GONE_WITHIN_S)
        out.failed = changed.lines()
        yield out
    finally:
        for command in commands:
            command.stop()


def test_kill_9_of_the_command_leaves_nothing_it_started_and_the_same_command_resumes(run):
    assert run.killed_left == [], f"left {run.killed_gone_s:.1f} s after kill -9: {run.killed_left}"
    assert run.killed_port_free, f"port {run.killed_port} of the killed command's API is still bound"
    assert run.stage_after_kill == "prepare"
    assert run.interrupted[1] == "resuming round 0 at stage prepare", run.interrupted


def test_ctrl_c_prints_where_it_stopped_and_that_the_same_command_resumes(run):
    console = run.interrupted
    assert run.interrupted_rc == 130, console
    assert len(console) <= CONSOLE_LINES, console
    assert re.fullmatch(r"log: \S+/logs/evolve-\d{8}T\d{6}Z\.log", console[0]), console
    stage = run.stage_after_interrupt
    assert stage != "prepare", "prepare was recorded before the interrupt"
    assert console[-1] == f"interrupted in round 0 ({stage}); run the same command to resume", console
    assert run.interrupted_left == [], run.interrupted_left


def test_a_second_command_on_a_running_run_is_refused_within_seconds_before_prefect_starts(run):
    refused = run.refused_by_lock
    assert refused.returncode == 2, refused.lines
    assert len(refused.lines) == 1, refused.lines
    assert refused.lines[0].startswith("error: Run 'e2e' is already running a round in another process (lock ")
    assert refused.seconds < REFUSED_WITHIN_S, f"refused after {refused.seconds:.1f} s"
    assert not refused.prefect_started, "the refused command started a Prefect server"
    assert run.lock_holder_ran_on


def test_a_round_that_fails_inside_prefect_prints_its_round_stage_and_error_only(run):
    console, stage = run.failed, run.stage_after_interrupt
    assert run.failed_rc == 2, console
    assert len(console) <= CONSOLE_LINES, console
    log = re.fullmatch(r"log: (\S+/logs/round-\d{8}T\d{6}Z\.log)", console[0])
    assert log, console
    assert console[1] == f"resuming round 0 at stage {stage}", console
    assert console[-1].startswith(
        f"error: round 0 ({stage}): Round 0 of run 'e2e' was started with other settings (rollout.group_size: 2 -> 3)"
    ), console
    path = Path(log[1]) if Path(log[1]).is_absolute() else REPO / log[1]
    assert "Traceback" in path.read_text(), "the details go to the log"
    assert run.failed_left == [], run.failed_left


def _damage_pool(config) -> Callable[[], object]:
    path = config.pool_path(0)
    kept = path.read_bytes()
    frame = pl.read_parquet(path)
    frame.head(len(frame) - 1).write_parquet(path)
    return lambda: path.write_bytes(kept)


def _remove_checkpoint(config) -> Callable[[], object]:
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        prepared = wh.stage_output(config.run_id, 0, "prepare")
    assert prepared is not None
    checkpoint = Path(prepared["checkpoint"])
    aside = checkpoint.with_name(checkpoint.name + ".aside")
    checkpoint.rename(aside)
    return lambda: aside.rename(checkpoint)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_damage_pool, r"Pool snapshot \S+/pools/pool-000\.parquet has digest \w+, expected \w+"),
        (_remove_checkpoint, r"Checkpoint \S+ is missing \(no such folder\)"),
    ],
    ids=["pool digest", "missing checkpoint"],
)
def test_damaged_inputs_of_the_round_are_refused_within_seconds_before_prefect_starts(run, damage, said):
    restore = damage(run.config)
    try:
        refused = _refused(
            run.folder, run.config, damage.__name__, ["round", "--round", "0", "--config", str(run.config_file)]
        )
    finally:
        restore()
    assert refused.returncode == 2, refused.lines
    assert len(refused.lines) == 1, refused.lines
    assert re.match(rf"error: round 0 \(prepare\): {said}", refused.lines[0]), refused.lines
    assert refused.seconds < REFUSED_WITHIN_S, f"refused after {refused.seconds:.1f} s"
    assert not refused.prefect_started, "the refused command started a Prefect server"


def test_the_commands_temporary_api_registers_no_prefect_block_types(run):
    """The pipeline keeps nothing in Prefect blocks, so its temporary API skips registering Prefect's block types
    (flows/local_api.py), which cost about 4 CPU-seconds on every new Prefect home."""
    with sqlite3.connect(run.config.state_dir / "prefect" / "prefect.db") as db:
        assert db.execute("SELECT count(*) FROM block_type").fetchone() == (0,)
