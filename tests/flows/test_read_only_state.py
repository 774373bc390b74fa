"""A state folder on a read-only mount: the commands that write refuse it in one line, and `lineage` reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import load_config
from coevolve.errors import PipelineError
from flows import preflight
from flows.cli import main
from storage.pool import write_pool_snapshot
from storage.tracking import Tracker
from storage.warehouse import Warehouse
from tests.small_disk import read_only
from tests.storage.conftest import build_task


@pytest.mark.parametrize("command", [["evolve", "--rounds", "1"], ["round", "--round", "0"]])
def test_a_round_on_a_read_only_state_folder_is_refused_in_one_line(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "source").mkdir()
    with read_only(tmp_path / "source", tmp_path / "state") as state:
        assert main([*command, "--set", f"state_dir={state}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the state folder ") and err.count("\n") == 1, err
    assert "cannot be written (Read-only file system" in err and "--set state_dir=DIR" in err


def test_the_round_lock_probe_of_a_read_only_run_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "source" / "runs").mkdir(parents=True)
    with read_only(tmp_path / "source", tmp_path / "state") as state:
        config = load_config(overrides=[f"state_dir={state}"], environ={})
        with pytest.raises(PipelineError, match="cannot be written"):
            preflight.check(config)


def test_lineage_reads_a_read_only_store_and_prints_where_mlflow_keeps_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    tracker = Tracker(f"sqlite:///{source / 'mlflow.db'}", "coevolve", source / "mlartifacts")
    pool = source / "pool-001.parquet"
    digest = write_pool_snapshot([build_task(i) for i in range(2)], pool)
    checkpoint = source / "round-001"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    tracker.log_round(
        run_name="default/round-0", params={}, metrics={"heldout_success": 0.5}, pool_path=pool, pool_digest=digest,
        checkpoint_dir=checkpoint, registered_model="coevolve-policy-default", flow_run_id="flow-0",
        tags={"run_id": "default", "round": "0"},
    )  # fmt: skip
    with read_only(source, tmp_path / "state") as state:
        before = sorted(p.name for p in state.iterdir())
        assert main(["lineage", "current", "--set", f"state_dir={state}"]) == 0
        assert sorted(p.name for p in state.iterdir()) == before
    out = capsys.readouterr().out
    copy = next(line for line in out.splitlines() if "checkpoint copy" in line).split()[-1]
    assert Path(copy).name == "checkpoint" and Path(copy).is_dir()
    assert (Path(copy) / "model.safetensors").read_bytes() == b"\0" * 64
    assert "run artifacts" in out


def test_sql_reads_a_read_only_state_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its spill folder cannot be made under the state folder there: it is made in the system's instead."""
    source = tmp_path / "source"
    with Warehouse(source / "warehouse") as wh:
        wh.write_tasks([build_task(0)])
    with read_only(source, tmp_path / "state") as state:
        assert main(["sql", "SELECT count(*) AS n FROM tasks", "--set", f"state_dir={state}"]) == 0
    assert capsys.readouterr().out.splitlines()[2].strip() == "1"
