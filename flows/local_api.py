"""The temporary Prefect API a command runs its flows on when no ``PREFECT_API_URL`` names a server.

Prefect starts such a server on first use (``SubprocessASGIServer``: a uvicorn process in the command's
process group, stopped by an exit handler). That server outlives a command killed with -9, and Ctrl-C at a
terminal reaches it as well, so the flow runs it was about to mark crashed lose their API mid-report. The
server started here runs Prefect's own application (same factory, settings and database under
``PREFECT_HOME``), with three differences:

- it runs in its own session, so a terminal's Ctrl-C interrupts only the command, which records its flow
  runs as crashed and stops the server on its way out;
- it ends when the command ends, however the command ends: the kernel sends it SIGTERM when its parent dies
  (Linux's PR_SET_PDEATHSIG), and a thread in it that watches its parent process does the same elsewhere;
- the command names it as its API (``PREFECT_API_URL`` in its environment and Prefect's settings), so every
  client of the command, in any thread, and every process the command starts (an ablation's process pool)
  uses it. Prefect's clients then never import Prefect's server module, which only the server's own process
  needs (its cost: benchmarks/HISTORY.md).

::

    with console.log_to_file(log):
        local_api.start(while_starting=functools.partial(preload, round_imports(config)))
        coevolve_evolve(...)

The server takes seconds of CPU to answer (its imports, and on a new Prefect home its database's migrations), in a
process of its own: ``while_starting`` runs in the command meanwhile, so the libraries its flow will import are
imported on the other core instead of after the server answers.

``python -m flows.local_api PARENT_PID UVICORN_ARGS...`` is the server process itself.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import importlib
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

import httpx
import prefect
from prefect.context import refresh_global_settings_context
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    get_current_settings,
    temporary_settings,
)

from agent.serve import free_port
from coevolve.errors import DiskFullError, PipelineError, is_disk_full
from coevolve.optional import collector_paused, freeze_long_lived

PR_SET_PDEATHSIG = 1
# Seconds between the server's looks at its parent process, and the seconds it then has to shut down cleanly.
WATCH_INTERVAL_S = 1.0
SHUTDOWN_GRACE_S = 5.0
# Seconds between the command's looks at the starting server's /health (Prefect's own interval).
HEALTH_POLL_S = 0.1
# uvicorn's exit status when its port was taken between choosing it and binding it; the start tries another port.
PORT_TAKEN_EXIT = 3
PORT_ATTEMPTS = 5
# Lines of the server's stderr kept to quote when it fails to start.
ERROR_LINES_KEPT = 40
# Set beside PREFECT_API_URL while that names a command's temporary API, so the command and the processes it
# starts can tell it from a server: `on_temporary_api`.
TEMPORARY_API_VAR = "COEVOLVE_TEMPORARY_PREFECT_API"
# The application the server runs: Prefect's own factory, imported by the server process before uvicorn starts.
APP_MODULE, APP_FACTORY = "prefect.server.api.server", "create_app"
# Prefect's fixed settings for its temporary server, and one more: no block types are registered, since the
# pipeline keeps nothing in Prefect blocks and registering them was a third of the server's start on each new
# Prefect home (benchmarks/HISTORY.md); an operator's own setting, in Prefect's settings, still wins.
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
    "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
}


class TiedServer:
    """Prefect's temporary server, started in its own session and ended with the process that started it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        # The server's last lines of stderr (relayed to the command's stderr, its log), quoted when it fails to
        # start: a full disk can leave the log empty, so the failure's own line must reach the console.
        self._tail: collections.deque[str] = collections.deque(maxlen=ERROR_LINES_KEPT)
        self._disk_full = threading.Event()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _launch(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        command = [
            sys.executable, "-m", "flows.local_api", str(os.getpid()),
            "--app-dir", str(prefect.__module_path__.parent), "--factory", f"{APP_MODULE}:{APP_FACTORY}",
            "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on",
        ]  # fmt: skip
        process = subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.PIPE)
        threading.Thread(target=self._relay, args=(process.stderr,), name="prefect-api-stderr", daemon=True).start()
        return process

    def _relay(self, stream: IO[bytes] | None) -> None:
        """Pass the server's stderr on to the command's, keeping its last lines and noting a full disk."""
        if stream is None:
            return
        with stream:
            for raw in iter(stream.readline, b""):
                text = raw.decode(errors="replace")
                with contextlib.suppress(OSError, ValueError):  # a full disk under the log loses the copy only
                    sys.stderr.write(text)
                    sys.stderr.flush()
                if text.strip():
                    self._tail.append(text.strip())
                if is_disk_full(RuntimeError(text)):
                    self._disk_full.set()

    def start(self, while_starting: Callable[[], object] | None = None) -> None:
        """Start the server, call ``while_starting`` while it starts, and wait until it answers, as long as Prefect
        waits for its own temporary server. The server is stopped if ``while_starting`` raises."""
        env = {**os.environ, **SERVER_ENV, **get_current_settings().to_environment_variables(exclude_unset=True)}
        timeout_s = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
        self.process = self._launch(env)
        atexit.register(self.stop)
        if while_starting is not None:
            try:
                while_starting()
            except BaseException:
                self.stop()
                raise
        # The wait is counted as Prefect counts it for its own temporary server, by the pauses between looks, so
        # a loaded machine, where each look and pause take longer, gives the server the time it gave it before.
        waited_s, attempts = 0.0, 1
        with httpx.Client() as client:
            while waited_s < timeout_s and not self._disk_full.is_set():
                status = self.process.poll()
                if status == PORT_TAKEN_EXIT and attempts < PORT_ATTEMPTS and not self._failed_to_start():
                    self.port, attempts = free_port(), attempts + 1
                    self.process = self._launch(env)
                    continue
                if status is not None:
                    break
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                time.sleep(HEALTH_POLL_S)
                waited_s += HEALTH_POLL_S
        status = self.process.poll()
        self.stop()
        if self._disk_full.is_set():
            # Prefect's database (in its home, the state folder's prefect/ unless set) could not be written.
            raise DiskFullError(get_current_settings().home)
        if status is not None:
            said = f": {self._tail[-1]}" if self._tail else ""
            raise PipelineError(
                f"The command's temporary Prefect API exited with status {status} before answering on {self.api_url}"
                f"{said} (its whole output is in the command's log). To run without it, start a server (prefect "
                "server start) and set PREFECT_API_URL to it."
            )
        raise PipelineError(
            f"The command's temporary Prefect API did not answer on {self.api_url} within {timeout_s:.0f} s. On a "
            "slow machine raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or start a server (prefect server "
            "start) and set PREFECT_API_URL to it."
        )

    def _failed_to_start(self) -> bool:
        """Whether the server's exit status 3 (uvicorn's for any failed start) followed its application's failure to
        start, rather than a port taken between choosing and binding it (which another port cures)."""
        time.sleep(HEALTH_POLL_S)  # its last lines reach the relay after it exits
        return any("Application startup failed" in line for line in self._tail)

    def stop(self) -> None:
        """Stop the server (uvicorn's clean shutdown, then -9 after Prefect's five seconds); idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start(while_starting: Callable[[], object] | None = None) -> TiedServer | None:
    """Start this process's temporary API, name it as the process's Prefect API, and return it; None where a
    server is configured (or one started here already runs). ``while_starting`` is called in this process while the
    server starts (or at once, when none is started): the command's own work that needs no Prefect API.

    Nothing is started when ``PREFECT_API_URL`` is set (a real server, a test harness's, or this process's own
    temporary API) or when Prefect's temporary server is switched off (``PREFECT_SERVER_EPHEMERAL_ENABLED=false``,
    which makes Prefect ask for a URL instead).
    """
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        if while_starting is not None:
            while_starting()
        return None
    server = TiedServer()
    server.start(while_starting)
    # The environment for the processes the command starts and for threads outside any settings context; the
    # global settings context (which Prefect rebuilds from the environment) for the command's own clients.
    os.environ["PREFECT_API_URL"] = os.environ[TEMPORARY_API_VAR] = server.api_url
    refresh_global_settings_context()
    return server  # stopped at exit (`TiedServer.start`)


@contextlib.contextmanager
def no_heartbeats_on_temporary_api() -> Iterator[None]:
    """Within the block, flow runs on a command's temporary API send Prefect no heartbeats; on a server they do.

    Heartbeats let a server's zombie detection mark a run whose process died; nothing watches them on a temporary
    API, which ends with its command. And each one costs time: a flow run's end waits for Prefect's heartbeat
    thread, which looks for it once a second (``prefect.flow_engine._send_heartbeats``), so every flow run, each
    round among them, ended on the next whole second after its start (benchmarks/STEP.md). Prefect's process pool
    carries the settings into an ablation's seed processes.
    """
    if not on_temporary_api():
        yield
        return
    with no_heartbeats():
        yield


def no_heartbeats() -> contextlib.AbstractContextManager[object]:
    """Prefect's settings with flow-run heartbeats off, within the block (`no_heartbeats_on_temporary_api` says why)."""
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def on_temporary_api() -> bool:
    """Whether this process's flows run on a command's temporary API (its own, or the command's that started it)
    rather than on a Prefect server: every flow run is then on this machine."""
    url = os.environ.get("PREFECT_API_URL")
    return not url or os.environ.get(TEMPORARY_API_VAR) == url


def _end_with(parent: int) -> None:
    """In the server: stop when ``parent`` is no longer this process's parent, and exit if shutting down hangs."""
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own clean shutdown
    time.sleep(SHUTDOWN_GRACE_S)
    os._exit(1)


def serve(argv: list[str]) -> None:
    """The server process: ``argv`` is the parent's pid, then uvicorn's arguments."""
    parent = int(argv[0])
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return  # the parent ended before the death signal was set
    threading.Thread(target=_end_with, args=(parent,), name="parent-watch", daemon=True).start()
    with collector_paused():  # about 0.5 of the server's CPU-seconds to start (coevolve/optional.py)
        importlib.import_module(APP_MODULE)
    # Prefect's, SQLAlchemy's and pydantic's module state, out of the walks of the collections its requests trigger.
    freeze_long_lived()
    sys.argv = ["uvicorn", *argv[1:]]
    runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
