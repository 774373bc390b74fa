"""How the project's processes end (`coevolve`, a training rank): with their status, after their threads and exit
handlers, without the interpreter's teardown."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_command_ends_with_its_status_after_its_threads_and_exit_handlers(tmp_path):
    """`exit_promptly` skips only the interpreter's teardown: a working thread is waited for, then the exit handlers
    run in their order, then the process ends with the command's status."""
    script = (
        "import atexit, threading, time\n"
        "from coevolve.process_exit import exit_promptly\n"
        "atexit.register(print, 'first handler ran last', flush=True)\n"
        "atexit.register(print, 'last handler ran first', flush=True)\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished', flush=True))).start()\n"
        "print('command done', flush=True)\n"
        "exit_promptly(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == [
        "command done", "thread finished", "last handler ran first", "first handler ran last"
    ]  # fmt: skip
