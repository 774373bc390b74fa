"""Old state folders, finished rounds and a damaged step's file, through the real command line.

- A state folder made by commit 9079251 (tests/fixtures/state-9079251) is refused before any work, with one
  line naming a new state folder; following that, the same command runs in the new folder.
- A damaged trajectories file of training step 2 names step 2's record (``rollout@2.json``); following the
  advice plays step 2's episodes again, and the rows come back as they were.
- A finished round is never opened again: ``coevolve round --round 0`` on it prints one line, exits 0 and
  changes nothing on disk, even under a configuration with more training steps than it ran, and the round
  flow (what an ablation resuming or a deployment run calls) returns its records without running it.

One real round serves all of it: started in the new state folder with three training steps, killed right
after step 2's rollout record (tests/crash_at.py), finished by following the damaged file's advice.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flows.round import coevolve_round
from storage import layouts
from storage.warehouse import Warehouse
from tests.crash_at import CRASH_EXIT
from tests.flows.conftest import REPO, cli_env, write_config_file

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "state-9079251"
STEPS = 3
STEP_TWO_ROWS = "SELECT * EXCLUDE (duration_s) FROM trajectories WHERE sample >= 4 ORDER BY trajectory_id"


def current_versions() -> dict[str, int]:
    """The stamp this code writes: the latest version of each list in storage/layouts.py."""
    return {"layout": layouts.LATEST_VERSION, "records": layouts.LATEST_RECORDS, "schedule": layouts.LATEST_SCHEDULE}


def coevolve(
    state_dir: Path, *args: str, crash_at: str | None = None, migrated: bool = True
) -> subprocess.CompletedProcess:
    """``coevolve ARGS`` in its own process, as a user runs it (dying at ``crash_at`` when given); ``migrated``
    as in `cli_env`."""
    entry = ["-m", "tests.crash_at", crash_at] if crash_at else ["-m", "flows.cli"]
    return subprocess.run(
        [sys.executable, *entry, *args], cwd=REPO, env=cli_env(state_dir, migrated=migrated), capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def error_line(done: subprocess.CompletedProcess) -> str:
    """The command's one line on stderr, which must be all it printed."""
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr[-3000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def setup(tiny_config, tmp_path_factory):
    """The tiny round's configuration file (three training steps), a copy of the 9079251 folder, a new folder."""
    base = tmp_path_factory.mktemp("folders")
    new = base / "new-state"
    config = tiny_config(new, training={"batches_per_round": STEPS})
    old = base / "old-state"
    shutil.copytree(FIXTURE / "warehouse", old / "warehouse")
    return config, write_config_file(config, base / "config.yaml"), old, new


@pytest.mark.parametrize(
    "command", [["round", "--round", "1"], ["round", "--round", "0"], ["evolve", "--rounds", "2"]], ids=" ".join
)
def test_a_state_folder_made_by_9079251_is_refused_before_any_work(setup, command):
    _, config_file, old, _ = setup
    before = tree(old)
    # A home without a database, as a user's: the folder must not change at all.
    done = coevolve(old, *command, "--config", str(config_file), "--set", f"state_dir={old}", migrated=False)
    line = error_line(done)
    assert f"State folder {old} holds run 'e2e', made with " in line and "training schedule 1 (" in line
    assert "Start a new state folder (--set state_dir=NEW_FOLDER)" in line
    assert tree(old) == before, "no new trajectories, records or files"


@pytest.fixture(scope="module")
def step_two_damaged(setup):
    """The refusal's fix followed (the same config, a new state folder), round 0 killed after step 2's rollout
    record, step 2's trajectories file damaged; what `coevolve sql` then says and what the rows were."""
    config, config_file, _, new = setup
    died = coevolve(
        new, "evolve", "--rounds", "1", "--config", str(config_file), "--set", f"state_dir={new}",
        crash_at="after:stage_runs/run_id=e2e/round=0/rollout@2.json",
    )  # fmt: skip
    assert died.returncode == CRASH_EXIT, died.stderr[-3000:]
    folder = config.warehouse_path / "tables" / "trajectories" / "run_id=e2e" / "round=0"
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rows = wh.sql(STEP_TWO_ROWS).to_dicts()
    samples = {
        p: set(pq.read_table(p, columns=["sample"]).column("sample").to_pylist()) for p in folder.glob("*.parquet")
    }
    step_two = sorted(p for p, found in samples.items() if found <= {4, 5})  # step 2 plays samples 4 and 5
    assert len(rows) == 8 and step_two  # 4 tasks x 2 samples, in one file or more
    data = step_two[0].read_bytes()
    step_two[0].write_bytes(data[: len(data) // 2])
    said = coevolve(new, "sql", "SELECT count(*) FROM trajectories", "--config", str(config_file))
    return config, config_file, rows, step_two[0], error_line(said)


@pytest.fixture(scope="module")
def advice_followed(step_two_damaged):
    """Does what the damaged file's line says: moves the file aside, deletes the record it names, runs the command."""
    config, config_file, rows, path, line = step_two_damaged
    moved = re.search(r"\(mv (\S+) (\S+)\)", line)
    record = re.search(r"delete the record of the stage that wrote it[^(]*\((\S+)\)", line)
    command = re.search(r"run `coevolve (round --round \d+)` again", line)
    assert moved and record and command, line
    shutil.move(moved[1], moved[2])
    Path(record[1]).unlink()
    done = coevolve(config.state_dir, *command[1].split(), "--config", str(config_file))
    assert done.returncode == 0, done.stderr[-3000:]
    return config, config_file, rows


def test_a_damaged_file_of_step_2_names_step_2s_record(step_two_damaged):
    config, _, _, path, line = step_two_damaged
    records = config.warehouse_path / "catalog" / "stage_runs" / "run_id=e2e" / "round=0"
    assert f"Warehouse file {path} is not a readable Parquet file" in line
    assert f"the rollout of training step 2 ({records / 'rollout@2.json'})" in line
    assert str(records / "rollout.json") not in line and "run `coevolve round --round 0` again" in line


def test_following_the_advice_brings_step_2s_rows_back_as_they_were(advice_followed):
    config, _, rows = advice_followed
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        assert wh.sql(STEP_TWO_ROWS).to_dicts() == rows
        assert wh.sql("SELECT count(*) AS n FROM trajectories")["n"][0] == STEPS * 4 * 2
        assert wh.round_status("e2e", 0) == "finished"
        assert wh.rounds("e2e")[0].rollouts == STEPS * 4 * 2


def test_the_refusals_fix_ran_the_round_in_the_new_state_folder_and_stamped_it(advice_followed):
    config, _, _ = advice_followed
    stamp = json.loads((config.state_dir / "state.json").read_text())
    assert {k: v for k, v in stamp.items() if k != "stamped_at"} == current_versions()
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        run = wh.catalog.get(wh.catalog.run_path("e2e")) or {}
    assert run["versions"] == {"records": layouts.LATEST_RECORDS, "schedule": layouts.LATEST_SCHEDULE}


@pytest.mark.parametrize("more_steps", [False, True], ids=["same config", "one more training step"])
def test_coevolve_round_on_a_finished_round_prints_one_line_and_changes_nothing(advice_followed, more_steps):
    config, config_file, _ = advice_followed
    before = tree(config.state_dir)
    extra = ["--set", f"training.batches_per_round={STEPS + 1}"] if more_steps else []
    done = coevolve(config.state_dir, "round", "--round", "0", "--config", str(config_file), *extra)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("round 0 of run 'e2e' finished at ")
    assert lines[0].endswith("nothing was done (coevolve status shows its results)")
    assert tree(config.state_dir) == before
    status = coevolve(config.state_dir, "status", "--config", str(config_file))
    row = status.stdout.splitlines()[-1].split()  # round, pool, rollouts, ...
    assert status.returncode == 0 and row[0] == "0" and row[2] == str(STEPS * 8)


def test_the_round_flow_returns_a_finished_rounds_records_without_running_it(prefect_api, advice_followed):
    config, _, _ = advice_followed
    before = tree(config.warehouse_path)
    more = config.with_overrides({"training": {"batches_per_round": STEPS + 1}})
    said: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = said.append  # type: ignore[method-assign]
    flow_runs = logging.getLogger("prefect.flow_runs")  # the flow run's log: what a worker and the UI show
    flow_runs.addHandler(handler)
    try:
        result = coevolve_round(round_=0, config=more.model_dump(mode="json"))
    finally:
        flow_runs.removeHandler(handler)
    assert tree(config.warehouse_path) == before, "no rollout@3, no trajectory, no record rewritten"
    assert [r.getMessage() for r in said if "already finished" in r.getMessage()] == [
        f"round 0 of run 'e2e' was already finished; nothing was run, its recorded results are returned (coevolve "
        f"status --set state_dir={config.state_dir} shows them)"
    ]
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        recorded = wh.stage_output("e2e", 0, "version")
        prepared = wh.stage_output("e2e", 0, "prepare")
    assert result["rollouts"] == STEPS * 8 and result["model_version"] == recorded["model_version"]
    assert result["baseline_heldout_success"] == prepared["baseline_heldout_success"]


def test_a_folder_this_code_made_before_it_was_stamped_continues_and_is_stamped(advice_followed):
    config, config_file, _ = advice_followed
    (config.state_dir / "state.json").unlink()
    with Warehouse(config.warehouse_path) as wh:  # the run record as the code before the stamp wrote it
        run = wh.catalog.get(wh.catalog.run_path("e2e")) or {}
        wh.catalog.put(wh.catalog.run_path("e2e"), {k: v for k, v in run.items() if k != "versions"})
    done = coevolve(config.state_dir, "round", "--round", "0", "--config", str(config_file))
    assert done.returncode == 0 and done.stdout.startswith("round 0 of run 'e2e' finished at "), done.stderr[-3000:]
    stamp = json.loads((config.state_dir / "state.json").read_text())
    assert {k: v for k, v in stamp.items() if k != "stamped_at"} == current_versions()
