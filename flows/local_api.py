"""The temporary Prefect API a command runs its flows on when no ``PREFECT_API_URL`` names a server.

Prefect starts such a server on first use (``SubprocessASGIServer``: a uvicorn process in the command's
process group, stopped by an exit handler). That server outlives a command killed with -9, and Ctrl-C at a
terminal reaches it as well, so the flow runs it was about to mark crashed lose their API mid-report. The
server started here is Prefect's own (same application, settings and database under ``PREFECT_HOME``), with
two differences:

- it runs in its own session, so a terminal's Ctrl-C interrupts only the command, which records its flow
  runs as crashed and stops the server on its way out;
- it ends when the command ends, however the command ends: the kernel sends it SIGTERM when its parent dies
  (Linux's PR_SET_PDEATHSIG), and a thread in it that watches its parent process does the same elsewhere.

It is registered where Prefect looks for its temporary server, so every client of the command uses it::

    with console.log_to_file(log):
        local_api.start()
        coevolve_evolve(...)

``python -m flows.local_api PARENT_PID UVICORN_ARGS...`` is the server process itself.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, get_current_settings

PR_SET_PDEATHSIG = 1
# Seconds between the server's looks at its parent process, and the seconds it then has to shut down cleanly.
WATCH_INTERVAL_S = 1.0
SHUTDOWN_GRACE_S = 5.0


class TiedServer(SubprocessASGIServer):
    """Prefect's temporary server, started in its own session and ended with the process that started it."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        # Prefect's own command line and environment for its temporary server (SubprocessASGIServer), run
        # through this module's entry point, which ties the server's life to this process. One difference: it
        # registers no block types, since the pipeline keeps nothing in Prefect blocks and registering them took
        # about 4 of the server's 11 CPU-seconds to start on each new Prefect home (benchmarks/README.md, "Where
        # the time went at c44023e"); an operator's own setting, in Prefect's settings below, still wins.
        server_env = {
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
        }
        return subprocess.Popen(
            args=[
                sys.executable,
                "-m",
                "flows.local_api",
                str(os.getpid()),
                "--app-dir",
                str(prefect.__module_path__.parent),
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env={
                **os.environ,
                **server_env,
                **get_current_settings().to_environment_variables(exclude_unset=True),
            },
            start_new_session=True,
        )


def start() -> SubprocessASGIServer | None:
    """Start this process's temporary API and return it; None where a server is configured or one already runs.

    Nothing is started when ``PREFECT_API_URL`` is set (a real server, or a test harness's) or when Prefect's
    temporary server is switched off (``PREFECT_SERVER_EPHEMERAL_ENABLED=false``, which makes Prefect ask for
    a URL instead).
    """
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    current = SubprocessASGIServer._instances.get(None)
    if current is not None:
        if current.running:
            return None
        del SubprocessASGIServer._instances[None]  # a stopped one: Prefect would hand it out and start it as it is
    server = TiedServer()  # registered under Prefect's key for its temporary server (None: no port asked for)
    server.start()
    return server


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
    sys.argv = ["uvicorn", *argv[1:]]
    runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
