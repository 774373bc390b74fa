"""A round killed with -9 and run again ends exactly as an uninterrupted round with the same seed.

Both runs go through the real CLI in their own processes and state folders (the uninterrupted one is the
session's, which tests/flows/test_work_pools.py compares its placed rounds with too). The interrupted one
is killed with -9 in the middle of its rollout (as soon as its first batch of episodes is durable),
then dies (os._exit, tests/crash_at.py) at one commit point of each kind: a table of a multi-table
stage written without its stage record, the first training step's checkpoint without its record,
inside the second step's rollout, the second step's checkpoint (trained with the optimizer state the
first step saved) without its record, the MLflow registration without the version record, the version
record without the finished round record; each
time the same command runs again, and the last run completes. Warehouse content, the pool snapshot digest,
the checkpoint digest and the MLflow registry must match the uninterrupted run's.

Exhaustive version (opt-in, about an hour on 2 cores; figures in storage/README.md "Commit points"):
the uninterrupted run is traced (``tests/crash_at.py trace:``), and the crashed run dies just before and
just after every durable write that trace lists (each table file, stage record, round record, pool
snapshot, checkpoint folder publish and MLflow registration), each death followed by the same command
again (after the last point, the finished round record, ``coevolve round --round 0``, which finds the round
finished and does nothing). Its tests carry the ``exhaustive`` marker, deselected unless
``COEVOLVE_CRASH_EXHAUSTIVE=1``; ``make test-crash-exhaustive`` runs them (docs/reproducibility.md):

    COEVOLVE_CRASH_EXHAUSTIVE=1 .venv/bin/python -m pytest -q tests/flows/test_crash_resume.py -m exhaustive
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.cli import main
from storage.warehouse import Warehouse
from tests.crash_at import CRASH_EXIT
from tests.flows.conftest import CONTENT, CRASH_OVERRIDES, REPO, cli_env, warehouse_content

pytestmark = pytest.mark.slow

# Opt-in: a crash before and after every commit point of a round costs about one round per point. Deselected
# unless COEVOLVE_CRASH_EXHAUSTIVE=1 (tests/conftest.py; `make test-crash-exhaustive`).
exhaustive = pytest.mark.exhaustive


def _version_output(config) -> dict:
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return wh.stage_output(config.run_id, 0, "version")


# What the warehouse held right after the kill in the middle of the rollout.
crashed_mid_rollout: dict[str, object] = {}


def _wait_for_first_batch(config, process, timeout_s: float = 600) -> None:
    """Polls for the round's first trajectories file: the moment the rollout has stored its first episode."""
    folder = config.warehouse_path / "tables" / "trajectories" / f"run_id={config.run_id}" / "round=0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the round exited with {process.returncode} before storing an episode")
        if folder.is_dir() and any(folder.glob("*.parquet")):
            return
        time.sleep(0.002)
    raise AssertionError(f"no episode was stored within {timeout_s:.0f} s")


def _step_one_stored(config) -> tuple[int, bool]:
    """Episodes of training step 1 stored (samples from group_size on), and whether its rollout is recorded."""
    group = config.rollout.group_size
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        stored = [sample for _, sample in wh.stored_episodes(config.run_id, 0) if sample >= group]
        return len(stored), wh.stage_output(config.run_id, 0, "rollout@1") is not None


def _stored_episodes(config) -> tuple[int, bool]:
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return len(wh.stored_episodes(config.run_id, 0)), wh.stage_output(config.run_id, 0, "rollout") is not None


# Where the crashed run dies, in order, each in its own process after the kill in the middle of the
# rollout: one point of each kind of commit (tests/crash_at.py). Every process runs the same command,
# ``coevolve evolve --rounds 1``, which resumes the run's first unfinished round.
CRASH_POINTS = (
    "before:stage_runs/run_id=e2e/round=0/update.json",  # step 0's checkpoint written, its update record not
    "after:tables/trajectories/run_id=e2e/round=0/#2",  # inside step 1's rollout: two of its episodes durable
    "before:stage_runs/run_id=e2e/round=0/update@1.json",  # checkpoint 1 (step 1's) written, its record not
    "after:tables/candidates/run_id=e2e/round=0/",  # a table of a multi-table stage (validate) written, its record not
    "before:stage_runs/run_id=e2e/round=0/version.json",  # MLflow run and model version registered, the record not
    "before:rounds/run_id=e2e/0.json#2",  # the version record written, the round record not yet "finished"
)

# What the crashed run's processes did: exit codes of the crashing ones, round 0's status after the
# crash before the version record, and `coevolve status` at the end.
crash_log: dict[str, object] = {}


def _evolve(config_file, state_dir, log, crash_at: str | None = None):
    """``coevolve evolve --rounds 1`` in a new process group, dying at ``crash_at`` when given."""
    entry = ["-m", "tests.crash_at", crash_at] if crash_at else ["-m", "flows.cli"]
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, *entry, "evolve", "--rounds", "1", "--config", str(config_file)],
            cwd=REPO, env=cli_env(state_dir), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _round_status(config) -> str | None:
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return wh.round_status(config.run_id, 0)


def _two_state_folders(tiny_config, cli, tmp_path_factory, names, overrides):
    """(folder, configuration, configuration file) of state folders with the same tiny round settings, one per name:
    for the uninterrupted run and the crashed run."""
    folders = []
    for name in names:
        folder = tmp_path_factory.mktemp(name)
        config = tiny_config(folder / "state", **overrides)
        folders.append((folder, config, cli.write_config_file(config, folder / "config.yaml")))
    return folders


@pytest.fixture(scope="module")
def both_runs(tiny_config, cli, tmp_path_factory, crash_round):
    """(uninterrupted, crashed): the uninterrupted round is the session's (`crash_round`, shared with
    tests/flows/test_work_pools.py); it runs while the crashed one dies and resumes."""
    crash_round.start()
    ((crashed_dir, crashed, crashed_file),) = _two_state_folders(
        tiny_config, cli, tmp_path_factory, ("crashed",), CRASH_OVERRIDES
    )
    log = crashed_dir / "round.log"

    during = _evolve(crashed_file, crashed.state_dir, log)
    try:
        _wait_for_first_batch(crashed, during)
    finally:
        cli.kill_group(during)
    crashed_mid_rollout["stored"], crashed_mid_rollout["marked"] = _stored_episodes(crashed)
    codes = []
    for point in CRASH_POINTS:
        process = _evolve(crashed_file, crashed.state_dir, log, crash_at=point)
        try:
            codes.append(process.wait(timeout=900))
        finally:
            cli.kill_group(process)  # the Prefect API it started dies with it
        if point.startswith("before:stage_runs") and point.endswith("version.json"):
            crash_log["status_before_version_record"] = _round_status(crashed)
        if point.startswith("after:tables/trajectories"):
            crash_log["inside_step_one"] = _step_one_stored(crashed)
    crash_log["codes"] = codes
    last = _evolve(crashed_file, crashed.state_dir, log)
    assert last.wait(timeout=900) == 0, log.read_text()[-3000:]
    return crash_round.wait(), crashed


def test_the_crashed_run_died_at_every_crash_point(both_runs) -> None:
    assert crash_log["codes"] == [CRASH_EXIT] * len(CRASH_POINTS)


def test_the_first_kill_left_a_rollout_with_some_episodes_stored(both_runs) -> None:
    assert crashed_mid_rollout["marked"] is False
    assert 1 <= crashed_mid_rollout["stored"] < 16  # of 4 tasks x 4 samples


def test_the_kill_inside_the_second_step_left_its_rollout_part_stored_and_unrecorded(both_runs) -> None:
    assert crash_log["inside_step_one"] == (2, False)


def test_a_round_is_not_finished_before_its_version_stage_is_recorded(both_runs) -> None:
    assert crash_log["status_before_version_record"] == "running"


def test_status_shows_the_round_finished_with_its_real_duration(both_runs, capsys) -> None:
    """Round 0 ran from the first attempt's start to the last one's finish: far more than a second."""
    _, crashed = both_runs
    config_file = crashed.state_dir.parent / "config.yaml"
    saved = dict(os.environ)  # the command sets its offline switches and state locations
    try:
        assert main(["status", "--config", str(config_file)]) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[0] == "0" and row[-1].endswith("s") and int(row[-1][:-1]) >= 5


def assert_same_rows(table: str, actual: list[dict], expected: list[dict]) -> None:
    """Rows equal, behaviour logprobs included: episodes replayed after the kill in the middle of the
    rollout are sampled in smaller batches, and their logprobs are scored per episode (agent/transformers_engine.py),
    so they carry the same bits as the uninterrupted run's."""
    assert len(actual) == len(expected)
    assert actual == expected


@pytest.mark.parametrize("table", list(CONTENT))
def test_the_warehouse_holds_the_same_rows(both_runs, table) -> None:
    plain, crashed = both_runs
    assert_same_rows(table, warehouse_content(crashed)[table], warehouse_content(plain)[table])


def test_the_first_steps_folder_is_deleted_once_the_second_step_is_recorded(both_runs) -> None:
    plain, crashed = both_runs
    assert not plain.checkpoint_after(0, 0).exists() and not crashed.checkpoint_after(0, 0).exists()
    assert crashed.checkpoint_after(0, 1) == crashed.checkpoint_dir(1) and crashed.checkpoint_dir(1).is_dir()


def test_pool_snapshot_and_checkpoint_digests_match(both_runs) -> None:
    plain, crashed = both_runs
    a, b = _version_output(plain), _version_output(crashed)
    assert a["pool_digest"] == b["pool_digest"]
    assert a["checkpoint_digest"] == b["checkpoint_digest"]


def test_the_registry_has_one_version_and_no_run_left_running(both_runs) -> None:
    _, crashed = both_runs
    client = MlflowClient(tracking_uri=crashed.mlflow_tracking_uri)
    versions = client.search_model_versions(f"name = '{crashed.registered_model_name}'")
    assert [str(v.version) for v in versions] == ["1"]
    experiment = client.get_experiment_by_name(crashed.tracking.experiment)
    statuses = [r.info.status for r in client.search_runs([experiment.experiment_id])]
    assert "RUNNING" not in statuses and statuses.count("FINISHED") == 1


# -- every commit point (opt-in) --------------------------------------------------------------------------

# The round's default batch size: one batch of episodes, so the rollout's commit points are one batch's
# three files (the crash between batches is the default test's kill in the middle of the rollout).
EXHAUSTIVE_OVERRIDES = {key: value for key, value in CRASH_OVERRIDES.items() if key != "warehouse"}


def commit_points(trace: Path, traced_state: Path, crashed_state: Path) -> list[str]:
    """Every write of a traced run as a crash point of another state folder: its target there, numbered
    by how often the run had written that target before (a round record is written running, then finished)."""
    seen: Counter[str] = Counter()
    points = []
    for target in trace.read_text().splitlines():
        target = target.replace(str(traced_state), str(crashed_state), 1)
        seen[target] += 1
        points.append(f"{target}#{seen[target]}")
    return points


# What the exhaustive crashed run did: its points, each crashing process's exit code, the final run's code.
exhaustive_log: dict[str, object] = {}


@pytest.fixture(scope="module")
def every_point_runs(tiny_config, cli, tmp_path_factory):
    (plain_dir, plain, plain_file), (crashed_dir, crashed, crashed_file) = _two_state_folders(
        tiny_config, cli, tmp_path_factory, ("plain-traced", "crashed-everywhere"), EXHAUSTIVE_OVERRIDES
    )
    plain_log, crashed_log = plain_dir / "round.log", crashed_dir / "round.log"
    trace = plain_dir / "writes.txt"
    started = time.monotonic()
    traced = _evolve(plain_file, plain.state_dir, plain_log, crash_at=f"trace:{trace}")
    try:
        assert traced.wait(timeout=900) == 0, plain_log.read_text()[-3000:]
    finally:
        cli.kill_group(traced)
    points = commit_points(trace, plain.state_dir, crashed.state_dir)
    exhaustive_log["points"], codes = points, []

    for spec in (f"{when}:{point}" for point in points for when in ("before", "after")):
        process = _evolve(crashed_file, crashed.state_dir, crashed_log, crash_at=spec)
        try:
            codes.append((spec, process.wait(timeout=900)))
        finally:
            cli.kill_group(process)
        with crashed_log.open("a") as out:
            out.write(f"=== {spec} exited {codes[-1][1]} at {time.monotonic() - started:.0f} s\n")
        if codes[-1][1] != CRASH_EXIT:
            break  # the round finished or failed short of the point: later points cannot be reached
    exhaustive_log["codes"] = codes
    # The last point is after the finished round record: round 0 has nothing left, and `evolve` would go on
    # to round 1 by design, so the last re-run is round 0's own command, which reads its records back.
    exhaustive_log["status_after_last_crash"] = _round_status(crashed)
    last = cli.start_round(crashed_file, crashed.state_dir, 0, crashed_log)
    try:
        exhaustive_log["last"] = last.wait(timeout=900)
    finally:
        cli.kill_group(last)
    exhaustive_log["wall_s"] = round(time.monotonic() - started)
    print(f"\n{len(points)} commit points, {len(codes)} crashes, {exhaustive_log['wall_s']} s")
    return plain, crashed


@exhaustive
def test_exhaustive_every_point_kind_is_traced(every_point_runs) -> None:
    kinds = ("/warehouse/tables/", "/warehouse/catalog/stage_runs/", "/warehouse/catalog/rounds/", "/pools/",
             "/checkpoints/", "mlflow-registry/")  # fmt: skip
    points = exhaustive_log["points"]
    assert all(any(kind in point for point in points) for kind in kinds), points


@exhaustive
def test_exhaustive_the_run_died_at_every_point_and_then_completed(every_point_runs) -> None:
    assert [point for point, code in exhaustive_log["codes"] if code != CRASH_EXIT] == []
    assert exhaustive_log["status_after_last_crash"] == "finished"
    assert exhaustive_log["last"] == 0


@exhaustive
@pytest.mark.parametrize("table", list(CONTENT))
def test_exhaustive_the_warehouse_holds_the_same_rows(every_point_runs, table) -> None:
    plain, crashed = every_point_runs
    assert_same_rows(table, warehouse_content(crashed)[table], warehouse_content(plain)[table])


@exhaustive
def test_exhaustive_pool_snapshot_and_checkpoint_digests_match(every_point_runs) -> None:
    plain, crashed = every_point_runs
    a, b = _version_output(plain), _version_output(crashed)
    assert (a["pool_digest"], a["checkpoint_digest"]) == (b["pool_digest"], b["checkpoint_digest"])


@exhaustive
def test_exhaustive_the_registry_has_one_version_and_no_run_left_running(every_point_runs) -> None:
    _, crashed = every_point_runs
    client = MlflowClient(tracking_uri=crashed.mlflow_tracking_uri)
    versions = client.search_model_versions(f"name = '{crashed.registered_model_name}'")
    assert [str(v.version) for v in versions] == ["1"]
    experiment = client.get_experiment_by_name(crashed.tracking.experiment)
    statuses = [r.info.status for r in client.search_runs([experiment.experiment_id])]
    assert "RUNNING" not in statuses and statuses.count("FINISHED") == 1
