"""A state folder copied elsewhere, its original deleted, is a run of its own: its next round runs from its own
checkpoint, its lineage names only the copy, and MLflow logs into the copy."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.cli import main
from flows.round import coevolve_round
from storage.relocation import follow_moved_mlflow_store, reroot_text, rewrites
from tests.conftest import make_tiny_config
from tests.flows.conftest import write_config_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moved_run(prefect_api, tmp_path_factory):
    """Round 0 in one folder; the folder copied, the original deleted; round 1 in the copy."""
    original = tmp_path_factory.mktemp("original")
    coevolve_round(round_=0, config=make_tiny_config(original).model_dump(mode="json"))
    copy = tmp_path_factory.mktemp("restored") / "state"
    shutil.copytree(original, copy, symlinks=True)
    shutil.rmtree(original)
    config = make_tiny_config(copy)
    summary = coevolve_round(round_=1, config=config.model_dump(mode="json"))
    return original, config, summary


def cells_naming(store: Path, text: str) -> list[tuple[str, str, str]]:
    """Every (table, column, value) of an SQLite file whose text holds ``text``."""
    found = []
    with sqlite3.connect(store) as con:
        tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for column in [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]:
                rows = con.execute(
                    f'SELECT "{column}" FROM "{table}" WHERE instr(CAST("{column}" AS TEXT), ?) > 0', (text,)
                )
                found.extend((table, column, str(value)) for (value,) in rows)
    return found


def test_the_copy_runs_its_next_round_on_its_own_files(moved_run):
    original, config, summary = moved_run
    assert summary["round"] == 1 and summary["model_version"] == "2"
    assert Path(summary["checkpoint"]) == config.checkpoint_dir(2) and config.checkpoint_dir(2).is_dir()
    records = sorted((config.state_dir / "warehouse" / "catalog").rglob("*.json"))
    assert records and not [p for p in records if str(original) in p.read_text()]
    checkpoints = [p for p in records if '"checkpoint"' in p.read_text()]
    assert checkpoints and all(str(config.state_dir) in p.read_text() for p in checkpoints)


def test_lineage_names_only_the_copy(moved_run, capsys):
    original, config, _ = moved_run
    file = write_config_file(config, config.state_dir.parent / "lineage.yaml")
    assert main(["lineage", "current", "--config", str(file)]) == 0
    out = capsys.readouterr().out
    assert "version 2" in out and "version 1" in out
    assert f"checkpoint 0  {config.state_dir / 'models'}" in out and f"D_0           {config.state_dir}" in out
    assert str(original) not in out


def test_mlflow_logs_into_the_copy_and_names_no_path_of_the_original(moved_run):
    original, config, summary = moved_run
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri, registry_uri=config.mlflow_tracking_uri)
    artifacts = config.artifacts_dir.resolve().as_uri() + "/"
    assert client.get_experiment_by_name(config.tracking.experiment).artifact_location + "/" == artifacts
    versions = client.search_model_versions(f"name = '{config.registered_model_name}'")
    assert sorted(int(v.version) for v in versions) == [1, 2]
    assert all(v.source.startswith(artifacts) for v in versions)
    new_run = client.get_run(summary["mlflow_run_id"])
    assert new_run.info.artifact_uri.startswith(artifacts)
    logged = config.artifacts_dir / summary["mlflow_run_id"] / "artifacts"
    assert (logged / "pool" / "pool-002.parquet").is_file() and (logged / "checkpoint").is_dir()
    assert cells_naming(config.state_dir / "mlflow.db", str(original)) == []


def test_an_mlflow_store_outside_its_state_folder_is_left_alone(moved_run, tmp_path):
    # A database elsewhere may serve state folders in several places: none of them re-roots it.
    _, config, _ = moved_run
    shared = tmp_path / "shared" / "mlflow.db"
    shared.parent.mkdir()
    shutil.copy(config.state_dir / "mlflow.db", shared)
    before = shared.read_bytes()
    assert follow_moved_mlflow_store(shared, tmp_path / "elsewhere" / "mlartifacts") == []
    assert shared.read_bytes() == before


def test_only_values_under_the_old_root_move():
    pairs = rewrites(Path("/data/run"), Path("/backup/run copy"))
    assert reroot_text("/data/run/models/tiny", pairs) == "/backup/run copy/models/tiny"
    assert reroot_text("/data/run", pairs) == "/backup/run copy"
    assert reroot_text("file:///data/run/mlartifacts/x", pairs) == "file:///backup/run%20copy/mlartifacts/x"
    for untouched in ("/data/run-2/models", "/data/runs", "/models/checkpoint-0", "Qwen/Qwen3-4B", "see /data/run/x"):
        assert reroot_text(untouched, pairs) == untouched
    inside = rewrites(Path("/data/run"), Path("/data/run/copy"))
    assert reroot_text(reroot_text("/data/run/models", inside), inside) == "/data/run/copy/models"
