"""A round through the real command line, stopped by a damaged MLflow store and then by a full disk, resumed by
following each printed fix.

One state folder, three runs of ``coevolve evolve`` (one round), in order:

1. its MLflow store is damaged (a real store whose SQLite header is overwritten): the round refuses before its
   first stage, with one line naming the store and the way back, and no rollout is written;
2. the printed ``mv`` is run, and the run's checkpoints folder is a tmpfs too small for the update's optimizer
   state (tests/small_disk.py, root only): the round stops at that save with one line, exit 2, and what the
   round had written before (its rollouts, checkpoint 0) is intact;
3. space is freed and the same command runs the round to its end, from the update on.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from agent.checkpoints import checkpoint_digest
from storage.tracking import Tracker
from storage.warehouse import Warehouse
from tests.flows.conftest import cli_env, write_config_file
from tests.small_disk import mount, resize, unmount

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUN = "e2e"


def evolve(config_file: Path, state_dir: Path) -> subprocess.CompletedProcess:
    """``coevolve evolve --config FILE`` in its own process group, killed whole if it outlives the limit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "evolve", "--config", str(config_file)],
        cwd=REPO,
        env=cli_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def trajectory_files(config) -> list[Path]:
    return sorted((config.warehouse_path / "tables" / "trajectories").glob(f"run_id={RUN}/*/*.parquet"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_config):
    state = tmp_path_factory.mktemp("store-failures") / "state"
    config = tiny_config(state, rounds=1)
    config_file = write_config_file(config, state.parent / "config.yaml")
    found = SimpleNamespace(config=config)
    with ExitStack() as cleanup:
        # 1. A real MLflow store whose header is overwritten.
        Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
        store = state / "mlflow.db"
        data = bytearray(store.read_bytes())
        data[:100] = random.Random(0).randbytes(100)
        store.write_bytes(bytes(data))
        found.damaged_store, found.damaged_bytes = store, bytes(data)
        found.refused = evolve(config_file, state)
        found.after_refusal = SimpleNamespace(
            trajectories=trajectory_files(config),
            checkpoints=config.checkpoint_dir(1).parent.exists(),
            models=(state / "models").exists(),
        )
        # 2. Follow the printed fix; the run's checkpoints go to a disk the update's optimizer state fills.
        found.fix = re.findall(r"\(mv (\S+) (\S+)\)", found.refused.stderr)
        if len(found.fix) == 1:
            subprocess.run(["mv", *found.fix[0]], check=True)
        checkpoints = config.checkpoint_dir(1).parent
        found.no_disk = mount(checkpoints, 128)
        if found.no_disk is None:
            cleanup.callback(unmount, checkpoints)
            found.full = evolve(config_file, state)
            with Warehouse(config.warehouse_path, read_only=True) as wh:
                prepared = wh.stage_output(RUN, 0, "prepare") or {}
                found.after_full = SimpleNamespace(
                    rollout=wh.stage_output(RUN, 0, "rollout"),
                    trajectories=len(wh.trajectories(RUN, 0)),
                    checkpoint0=prepared.get("checkpoint"),
                    checkpoint0_digest=prepared.get("checkpoint_digest"),
                    left_in_checkpoints=sorted(p.name for p in checkpoints.iterdir()),
                )
            resize(checkpoints, 64 * 1024)  # space freed
        # 3. The same command again.
        found.done = evolve(config_file, state)
        yield found


def test_a_damaged_mlflow_store_stops_the_round_before_its_first_stage_with_one_line(runs):
    refused = runs.refused
    assert refused.returncode == 2, refused.stderr
    # One line (the console may name the round it stopped in before the message).
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: "), refused.stderr
    assert f"MLflow store {runs.damaged_store} is damaged" in refused.stderr and "from a backup" in refused.stderr
    # Nothing of the round's compute ran: no rollout, no checkpoint 0 built, no update.
    assert runs.after_refusal.trajectories == [] and not runs.after_refusal.checkpoints
    assert not runs.after_refusal.models


def test_a_full_disk_at_the_updates_save_is_one_line_naming_the_folder_and_keeps_what_was_written(runs):
    if runs.no_disk is not None:
        pytest.skip(runs.no_disk)
    full, checkpoints = runs.full, runs.config.checkpoint_dir(1).parent
    assert full.returncode == 2, full.stderr
    assert full.stderr.count("\n") == 1 and full.stderr.startswith("error: "), full.stderr
    assert full.stderr.endswith(
        f"no space left on device under {checkpoints}; free space and run the same command again\n"
    )
    after = runs.after_full
    assert after.rollout is not None and after.trajectories == 4 * 2, "the rollout before it is recorded whole"
    assert checkpoint_digest(after.checkpoint0) == after.checkpoint0_digest
    assert after.left_in_checkpoints == [], "the half-written optimizer state is deleted, freeing its space"


def test_following_the_printed_fixes_runs_the_round_to_its_end(runs):
    done, config = runs.done, runs.config
    assert runs.fix == [(str(runs.damaged_store), f"{runs.damaged_store}.damaged")]
    assert Path(f"{runs.damaged_store}.damaged").read_bytes() == runs.damaged_bytes, "kept as it was"
    assert done.returncode == 0, done.stderr
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        assert wh.round_status(RUN, 0) == "finished"
        rows = wh.sql(
            f"SELECT count(*) AS n, count(DISTINCT trajectory_id) AS d FROM trajectories WHERE run_id = '{RUN}'"
        )
        version = wh.stage_output(RUN, 0, "version")
    assert rows["n"][0] == rows["d"][0] == 4 * 2
    assert checkpoint_digest(config.checkpoint_dir(1)) == version["checkpoint_digest"]
    registered = MlflowClient(tracking_uri=config.mlflow_tracking_uri).get_model_version(
        config.registered_model_name, version["model_version"]
    )
    assert registered.tags["checkpoint_digest"] == version["checkpoint_digest"]
