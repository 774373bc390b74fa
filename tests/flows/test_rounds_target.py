"""`coevolve evolve --rounds N` is a target that running it again reaches and never passes, and the nightly
deployment's `more_rounds` K is fixed once per flow run, so a retried flow run stops where it would have.

One tiny run, shared by the tests below. Through the real CLI, each command in its own process:
`coevolve evolve --rounds 3` killed with -9 early in round 1, the same command again (it must end with rounds
0..2, not go on to a fourth), then again on the finished run, and `coevolve evolve` as `make run` runs it (both
must do nothing and write nothing). Then a nightly flow run on the same run, created through the Prefect
client with the deployment's parameters (more_rounds=2): round 3 finishes, round 4 stops at a real refusal
(another pool's snapshot where round 4 writes pool 5), and `prefect flow-run retry` runs that same flow run
again once the obstacle is gone: it must finish round 4 and stop at the target its first start fixed (rounds
0..4), not run round 5.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.settings import get_current_settings

from coevolve.errors import ConfigError
from flows.cli import build_parser
from flows.evolve import coevolve_evolve
from flows.rounds_target import evolve_target, finished_rounds, fixed_target, target_record
from storage.pool import read_pool_snapshot, write_pool_snapshot
from storage.warehouse import Warehouse
from tests.conftest import PREFECT
from tests.flows.conftest import REPO, cli_env

pytestmark = pytest.mark.slow

# The nightly flow run's K: round 3 finishes within the first attempt, round 4 is the one that fails.
MORE_ROUNDS = 2


def _nightly() -> dict:
    (nightly,) = [
        d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"] if d["name"] == "nightly"
    ]
    return nightly


def _shown(path: Path) -> str:
    """The state folder as the command prints it from the repository root."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder below ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _statuses(config, rounds: range) -> list[str | None]:
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return [wh.round_status(config.run_id, r) for r in rounds]


def _run(cli, command: list[str], env: dict[str, str], out: Path, timeout_s: float) -> SimpleNamespace:
    """``command`` in its own process group, waited for, then the group killed (a Prefect API it started too).

    ``code`` is None when it was still running after ``timeout_s``: a command that should do nothing went on.
    """
    with (out.with_suffix(".out")).open("w") as stdout, (out.with_suffix(".err")).open("w") as stderr:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            cli.kill_group(process)
    return SimpleNamespace(code=code, out=out.with_suffix(".out").read_text(), err=out.with_suffix(".err").read_text())


@pytest.fixture(scope="module")
def commands(tiny_config, cli, tmp_path_factory):
    """The run's commands through the real CLI: killed, again, and twice more on the finished run."""
    folder = tmp_path_factory.mktemp("rounds-target")
    config = tiny_config(folder / "state")
    config_file = cli.write_config_file(config, folder / "config.yaml")
    evolve = [sys.executable, "-m", "flows.cli", "evolve", "--config", str(config_file)]
    ns = SimpleNamespace(config=config, folder=folder)

    # --rounds 3, killed with -9 as soon as round 1's rollout is recorded.
    with (folder / "killed.log").open("w") as log:
        killed = subprocess.Popen(
            [*evolve, "--rounds", "3"], cwd=REPO, env=cli_env(config.state_dir), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        cli.wait_for_stage(config, 1, "rollout", killed)
    finally:
        cli.kill_group(killed)
    ns.after_kill = _statuses(config, range(3))
    ns.again = _run(cli, [*evolve, "--rounds", "3"], cli_env(config.state_dir), folder / "again", 900)
    ns.after_again = _statuses(config, range(4))

    # The finished run, asked again: with --rounds 3, and as `make run` asks (no flag: the configuration's 3).
    before = _files(config.state_dir)
    ns.finished = _run(cli, [*evolve, "--rounds", "3"], cli_env(config.state_dir), folder / "finished", 120)
    ns.make_run = _run(cli, evolve, cli_env(config.state_dir), folder / "make-run", 120)
    # The same state folder and run id asked for another environment's run: the finished run must not answer.
    other = [*evolve, "--set", "environment.name=workplace"]
    ns.other_environment = _run(cli, other, cli_env(config.state_dir), folder / "other-environment", 120)
    ns.unchanged = before == _files(config.state_dir)
    return ns


@pytest.fixture(scope="module")
def nightly(commands, cli, prefect_api):
    """A nightly flow run on the same run with the deployment's parameters, its first attempt failing in round 4,
    then `prefect flow-run retry`."""
    config, folder = commands.config, commands.folder
    ns = SimpleNamespace(config=config)
    # Where round 4's version stage writes pool 5, a snapshot of another pool (D_0 less one task): snapshots are
    # never overwritten. (Tiny rounds may accept no task, so pool 5 can equal D_0 itself.)
    stale = config.pool_path(3 + MORE_ROUNDS)
    assert not stale.exists(), "the commands went past round 2"
    write_pool_snapshot(read_pool_snapshot(config.pool_path(0))[:-1], stale)
    parameters = {**_nightly()["parameters"], "more_rounds": MORE_ROUNDS, "config": config.model_dump(mode="json")}
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(coevolve_evolve, parameters=parameters)
    ns.flow_run_id = str(flow_run.id)
    ns.first_attempt = run_flow(coevolve_evolve, flow_run=flow_run, parameters=parameters, return_type="state")
    ns.after_first_attempt = _statuses(config, range(6))
    stale.unlink()

    # `prefect flow-run retry` (a flow run without a deployment runs where the command runs), same flow run id.
    env = {
        **cli_env(config.state_dir, folder / "prefect-retry"),
        "PREFECT_API_URL": str(get_current_settings().api.url),
    }
    retry = [str(PREFECT), "flow-run", "retry", ns.flow_run_id,
             "--entrypoint", "flows/evolve.py:coevolve_evolve"]  # fmt: skip
    ns.retry = _run(cli, retry, env, folder / "retry", 900)
    with get_client(sync_client=True) as client:
        ns.retried = client.read_flow_run(flow_run.id)
    ns.after_retry = _statuses(config, range(7))
    return ns


def test_the_killed_command_left_round_0_finished_and_round_1_running(commands) -> None:
    assert commands.after_kill == ["finished", "running", None]


def test_the_same_command_again_resumes_round_1_and_stops_after_round_2(commands) -> None:
    assert commands.again.code == 0, commands.again.out[-3000:] + commands.again.err[-3000:]
    assert commands.after_again == ["finished", "finished", "finished", None]
    assert f"run 'e2e': rounds 1..2, state in {_shown(commands.config.state_dir)}" in commands.again.out.splitlines()


@pytest.mark.parametrize("command", ["finished", "make_run"])
def test_a_finished_run_asked_again_does_nothing(commands, command) -> None:
    done = getattr(commands, command)
    assert done.code == 0, done.out + done.err
    state = _shown(commands.config.state_dir)
    expected = f"run 'e2e': rounds 0..2 are finished (target: 3 rounds), nothing to run; state in {state}"
    assert done.out.splitlines() == [expected]
    assert done.err == ""


def test_a_finished_run_refuses_in_one_line_to_answer_for_another_environment(commands) -> None:
    done = commands.other_environment
    assert done.code == 2 and done.out == "", done.out + done.err
    (line,) = done.err.splitlines()
    assert line.startswith(f"error: run 'e2e' in {_shown(commands.config.state_dir)} finished round 2 with other ")
    assert "environment.name: 'bfcl' -> 'workplace'" in line and "--set state_dir=DIR" in line


def test_a_finished_run_asked_again_writes_nothing(commands) -> None:
    assert commands.unchanged


def test_the_nightly_deployment_asks_for_more_rounds() -> None:
    parameters = _nightly()["parameters"]
    assert "rounds" not in parameters and parameters["more_rounds"] >= 1


def test_the_nightly_flow_runs_first_attempt_finished_round_3_and_failed_in_round_4(nightly) -> None:
    assert nightly.first_attempt.is_failed()
    assert "already exists with different content" in str(nightly.first_attempt.message)
    assert nightly.after_first_attempt == ["finished"] * 4 + ["running", None]


def test_the_retried_flow_run_reaches_its_target_and_stops(nightly) -> None:
    assert nightly.retry.code == 0, nightly.retry.out[-3000:] + nightly.retry.err[-3000:]
    assert str(nightly.retried.id) == nightly.flow_run_id and nightly.retried.state.is_completed()
    assert nightly.after_retry == ["finished"] * 5 + [None, None]
    assert finished_rounds(nightly.config) == 3 + MORE_ROUNDS
    assert fixed_target(nightly.config, nightly.flow_run_id, 5, MORE_ROUNDS) == 3 + MORE_ROUNDS
    assert target_record(nightly.config, nightly.flow_run_id).is_file()


# --- the target itself, without rounds ---------------------------------------------------------------------


def test_a_flow_runs_target_is_fixed_once_and_a_new_flow_run_fixes_its_own(tiny_config, tmp_path) -> None:
    config = tiny_config(tmp_path / "state")
    assert fixed_target(config, "night-1", 3, 2) == 5
    assert fixed_target(config, "night-1", 4, 2) == 5  # the same flow run, retried after round 3 finished
    assert fixed_target(config, "night-2", 5, 2) == 7  # the next night
    assert fixed_target(config, None, 4, 2) == 6  # no flow run: nothing can retry it
    assert sorted(p.name for p in target_record(config, "x").parent.iterdir()) == ["night-1.json", "night-2.json"]


def test_rounds_is_a_target_and_defaults_to_the_configurations(tiny_config, tmp_path) -> None:
    config = tiny_config(tmp_path / "state", rounds=4)
    assert evolve_target(config, 2, None, None, "any") == 4
    assert evolve_target(config, 2, 3, None, "any") == 3
    with pytest.raises(ConfigError, match="give one"):
        evolve_target(config, 2, 3, 1, "any")


def test_the_help_says_which_option_is_which(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["evolve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rounds N Run until rounds 0..N-1 of the run are finished" in text
    assert "--more K Run K more rounds from the first unfinished one" in text and "nightly" in text
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["evolve", "--rounds", "3", "--more", "1"])
    assert refused.value.code == 2
