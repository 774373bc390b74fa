"""How the project's own processes end: with their status, without the interpreter's teardown."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_promptly(code: int) -> NoReturn:
    """End the process with ``code`` as the interpreter's own exit begins, without its teardown after that.

    After a round or a training rank, freeing every module and object one by one (torch, transformers, Prefect,
    MLflow) took about 3 s of CPU after the command's last line (benchmarks/HISTORY.md). The two steps of an ordinary
    exit before that teardown still run, in its order: the other threads are waited for and their exit hooks run
    (Prefect's log and event workers send what they hold while the temporary API still answers), then the exit
    handlers (the temporary API stopped, MLflow's run ended, the log files flushed and closed).
    """
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or full stream loses only what it still held
            stream.flush()
    os._exit(code)
