"""coevolve/console.py: the table reaches the console, everything else the process writes reaches the log file."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from coevolve import console
from coevolve.errors import DiskFullError
from tests.small_disk import small_disk

REPO = Path(__file__).resolve().parents[2]


def test_the_log_is_named_after_the_command_and_its_utc_start(tmp_path):
    when = datetime(2026, 4, 25, 9, 30, 12, tzinfo=UTC)
    assert console.log_path(tmp_path, "evolve", when) == tmp_path / "logs" / "evolve-20260425T093012Z.log"


def test_two_commands_started_in_the_same_second_get_logs_of_their_own(tmp_path):
    when = datetime(2026, 4, 25, 9, 30, 12, tzinfo=UTC)
    first, second, third = (console.log_path(tmp_path, "evolve", when) for _ in range(3))
    assert first.name == "evolve-20260425T093012Z.log"
    assert second.name == "evolve-20260425T093012Z-2.log" and third.name == "evolve-20260425T093012Z-3.log"
    assert all(path.is_file() and path.stat().st_size == 0 for path in (first, second, third))
    assert console.log_path(tmp_path, "round", when).name == "round-20260425T093012Z.log"


def test_a_log_that_cannot_be_made_on_a_full_disk_is_a_disk_full_error_naming_its_folder(tmp_path):
    with small_disk(tmp_path / "disk", 64, inodes=3) as disk:  # the root, logs/ and one log
        console.log_path(disk, "evolve")
        with pytest.raises(DiskFullError, match=f"no space left on device under {disk / 'logs'}"):
            console.log_path(disk, "evolve")


def test_a_path_below_the_working_directory_is_shown_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert console.shown(tmp_path / ".coevolve") == ".coevolve"
    assert console.shown(Path("/elsewhere/state")) == "/elsewhere/state"


# A process like the CLI's: what it writes, its libraries log or warn, and what its children print.
SCRIPT = """
import logging, subprocess, sys, warnings
from pathlib import Path
from coevolve import console

with console.log_to_file(Path(sys.argv[1]), load_first=()):
    print("the table", file=console.table_stream())
    print("a library's print")
    print("a library's stderr", file=sys.stderr)
    logging.getLogger("some.library").warning("a logged record")
    logging.getLogger("some.library").info("a library's info")
    logging.getLogger("tasks.prepare").info("the project's own info")
    warnings.warn("a python warning", UserWarning, stacklevel=1)
    child = "import sys; print('child stdout'); print('child stderr', file=sys.stderr)"
    subprocess.run([sys.executable, "-c", child], check=True)
    assert console.table_stream() is not sys.stdout
assert console.table_stream() is sys.stdout
print("after the block")
"""


def test_all_but_the_table_goes_to_the_log(tmp_path):
    log = tmp_path / "logs" / "run.log"
    environ = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)],
        cwd=REPO,
        env={**environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the table\nafter the block\n" and done.stderr == ""
    text = log.read_text()
    for line in ("a library's print", "a library's stderr", "child stdout", "child stderr"):
        assert f"{line}\n" in text, line
    assert "WARNING some.library - a logged record" in text
    # The project's INFO records are kept (where checkpoint 0 came from); a library's stay at its own level.
    assert "INFO    tasks.prepare - the project's own info" in text and "a library's info" not in text
    assert "WARNING py.warnings - " in text and "UserWarning: a python warning" in text
