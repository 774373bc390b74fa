"""`coevolve evolve` (what `make run` runs) as a user sees it: the round table on the console, the rest in a log file.

The real CLI runs one tiny round in its own process, with its output on pipes (as under CI or `make run > file`);
then a second round runs on a pseudo-terminal, where progress bars may draw but nothing else may reach it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.table import COLUMNS, format_row
from tests.flows.conftest import REPO, cli_env, run_on_terminal, screen_lines, write_config_file

pytestmark = pytest.mark.slow

LOG_LINE = re.compile(r"^log: (?P<path>\S+/logs/evolve-\d{8}T\d{6}Z\.log)$")
BASELINE_LINE = re.compile(r"^ {7}checkpoint 0 held-out success: \d\.\d{3}$")
ROW = re.compile(
    r"^ +(?P<round>\d+) +\d+ +\d+ +\d\.\d{3} +\d+ +\d+/\d+/\d+ +\d+ +\d+ +\d\.\d{3} +\d+s$"
)  # round, pool, rollouts, success, opt-steps, signals f/b/r, accepted, rejected, held-out, time
DONE_LINE = re.compile(
    r"^done in \d+s; query with: (?P<command>\S+ sql --set state_dir=\S+ 'SELECT \* FROM v_success_by_round')$"
)
# What must stay off the console: tqdm's bars, TRL's loss dictionaries, Prefect's run lines, warnings.
CHATTER = ("%|", "it/s", "{'loss'", "Finished in state", "flow run", "Warning", "Traceback")


def _shown(path: Path) -> str:
    """The state folder as the command prints it from the repository root."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _command(config_file: Path, rounds: int = 1) -> list[str]:
    """Until rounds 0..rounds-1 are finished: round 0 first, then round 1 on the terminal."""
    return [sys.executable, "-m", "flows.cli", "evolve", "--config", str(config_file), "--rounds", str(rounds)]


def _check_table(lines: list[str], state_dir: Path, round_: int) -> Path:
    """The exact lines of a one-round run; returns the log file the first line names."""
    expected_count = 6 if round_ == 0 else 5
    assert len(lines) == expected_count, lines
    log = LOG_LINE.match(lines[0])
    assert log, lines[0]
    assert lines[1] == f"run 'e2e': rounds {round_}..{round_}, state in {_shown(state_dir)}"
    assert lines[2] == format_row(COLUMNS)
    if round_ == 0:
        assert BASELINE_LINE.match(lines[3]), lines[3]
    row = ROW.match(lines[-2])
    assert row and int(row["round"]) == round_ and len(lines[-2]) == len(lines[2]), lines[-2]
    assert DONE_LINE.match(lines[-1]), lines[-1]
    path = Path(log["path"])
    return path if path.is_absolute() else REPO / path


@pytest.fixture(scope="module")
def piped_run(tiny_config, tmp_path_factory):
    """Round 0 of a tiny run through the real CLI, its stdout and stderr on pipes."""
    state_dir = tmp_path_factory.mktemp("evolve-console") / "state"
    # Built here, not copied from the session's policy cache: the log must show the build's SFT losses.
    config = tiny_config(state_dir, policy_cache_dir=None)
    state_dir.mkdir(parents=True)
    config_file = write_config_file(config, state_dir.parent / "tiny.yaml")
    done = subprocess.run(
        _command(config_file), cwd=REPO, env=cli_env(state_dir), capture_output=True, text=True, timeout=900
    )
    return SimpleNamespace(done=done, state_dir=state_dir, config_file=config_file)


def test_the_console_gets_the_table_and_the_log_files_name_only(piped_run):
    done = piped_run.done
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    _check_table(done.stdout.splitlines(), piped_run.state_dir, 0)
    assert not [marker for marker in CHATTER if marker in done.stdout]
    assert "\r" not in done.stdout


def test_the_last_line_names_a_query_that_runs_as_written_on_this_runs_state(piped_run):
    """The hint is the executable beside the interpreter and this run's state folder: copied into a shell in the
    folder the run started from, it prints the run's round, not another folder's run of the same name."""
    done = DONE_LINE.match(piped_run.done.stdout.splitlines()[-1])
    assert done, piped_run.done.stdout
    command = shlex.split(done["command"])
    assert command[0] == _shown(Path(sys.executable).with_name("coevolve"))
    assert command[3] == f"state_dir={_shown(piped_run.state_dir)}"
    queried = subprocess.run(
        command, cwd=REPO, env=cli_env(piped_run.state_dir), capture_output=True, text=True, timeout=300
    )
    assert queried.returncode == 0, queried.stderr
    rows = [[cell.strip() for cell in line.split("|")] for line in queried.stdout.splitlines()]
    header = rows[0]
    assert [row[header.index("round")] for row in rows if row[0] == "e2e"] == ["0"], queried.stdout


def test_the_log_file_holds_prefects_lines_and_the_sft_losses(piped_run):
    log = _check_table(piped_run.done.stdout.splitlines(), piped_run.state_dir, 0)
    assert log.parent == piped_run.state_dir / "logs" and log.is_file()
    text = log.read_text()
    assert "Beginning flow run" in text and "Finished in state Completed()" in text
    assert "{'loss': " in text  # TRL's losses while the tiny policy builds
    # No bar was drawn on a pipe, not even into the log.
    assert "%|" not in text and "\r" not in text


def test_on_a_terminal_only_progress_bars_join_the_table(piped_run):
    """Round 1 on a pseudo-terminal: bars may draw and clear themselves, nothing else reaches the screen."""
    assert piped_run.done.returncode == 0
    code, screen = run_on_terminal(_command(piped_run.config_file, rounds=2), cli_env(piped_run.state_dir))
    assert code == 0, screen
    lines = screen_lines(screen)
    assert lines[-1] == ""
    log = _check_table([line.rstrip() for line in lines[:-1]], piped_run.state_dir, 1)
    assert "rollout" in screen and "%|" in screen  # the round's rollout bar drew on the terminal
    assert not [marker for marker in CHATTER if marker in "\n".join(lines)]
    assert "Finished in state Completed()" in log.read_text()
    assert log != _check_table(piped_run.done.stdout.splitlines(), piped_run.state_dir, 0)  # one log per run
