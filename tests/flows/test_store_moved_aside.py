"""The documented way back from a damaged MLflow store, followed to the end: move it aside, run the next round, and
every lineage question still answers, naming where the earlier versions' lineage is kept.

The first round is the session's (`crash_round` in tests/flows/conftest.py); the next one runs on a copy of it.
"""

from __future__ import annotations

import shlex
import shutil

import pytest

from flows.cli import main
from storage.tracking import Tracker
from tests.flows.conftest import start_round, write_config_file

# A round of its own on the session's: handed out early, so it does not run alone at the end of `make test`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moved_aside(crash_round, tmp_path_factory):
    """Round 1 of a copy of the session's round, run after its MLflow store was moved aside."""
    config = crash_round.wait()
    folder = tmp_path_factory.mktemp("moved-aside")
    state = folder / "state"
    shutil.copytree(config.state_dir, state, ignore=shutil.ignore_patterns("prefect", "logs", "*.lock"))
    copy = config.with_overrides({"state_dir": str(state), "policy_cache_dir": None})
    store = state / "mlflow.db"
    store.rename(store.with_name("mlflow.db.damaged"))  # what the damaged store's message says to do
    config_file = write_config_file(copy, folder / "config.yaml")
    process = start_round(config_file, state, 1, folder / "round.log")
    assert process.wait(timeout=1800) == 0, (folder / "round.log").read_text()[-3000:]
    return copy, config_file


def test_the_first_version_of_the_new_store_names_no_version_of_the_old_one(moved_aside) -> None:
    config, _ = moved_aside
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir, read_only=True)
    (entry,) = tracker.lineage(config.registered_model_name, "current")
    assert entry["version"] == "1" and entry["coevolve.round"] == "1"
    assert entry["parent_version"] == ""
    assert entry["parent_checkpoint_digest"]  # checkpoint 1, which the moved-aside store registered


@pytest.mark.parametrize("version", ["1", "current", "best"])
def test_lineage_answers_and_says_where_the_earlier_rounds_lineage_is(
    moved_aside, version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, config_file = moved_aside
    assert main(["lineage", version, "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "round 1's input checkpoint, not registered in this MLflow store" in out
    advice = out.strip().splitlines()[-1]
    assert advice.startswith("rounds 0..0 were registered in an earlier MLflow store")
    query = shlex.split(advice.split("in the warehouse: ", 1)[1])
    assert query[:2] == ["coevolve", "sql"]
    assert main(["sql", query[2], "--config", str(config_file), "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 3  # the header, round 0 (the old store's version) and round 1
