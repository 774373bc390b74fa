"""A damaged input of the next round names a way back that works: the MLflow copy its previous round registered.

The round is the session's (`crash_round` in tests/flows/conftest.py); each check damages a copy of its state
folder, runs the command the refusal prints, and the round's inputs check again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coevolve.errors import DataError
from flows import preflight
from storage.relocation import follow_moved_records
from storage.warehouse import Warehouse


@pytest.fixture
def copied(crash_round, tmp_path: Path):
    """The session's finished round 0 in a state folder of this test's own, its records re-rooted there."""
    config = crash_round.wait()
    state = tmp_path / "state"
    shutil.copytree(config.state_dir, state, ignore=shutil.ignore_patterns("prefect", "logs", "*.lock"))
    copy = config.with_overrides({"state_dir": str(state), "policy_cache_dir": None})
    with Warehouse(copy.warehouse_path) as wh:
        follow_moved_records(wh.catalog, state)
    return copy


def _follow(advice: str) -> None:
    command = re.search(r"(cp (?:-r )?\S+ \S+)$", advice.strip())
    assert command is not None, advice
    subprocess.run(["bash", "-c", command.group(1)], check=True)


def test_a_changed_checkpoint_is_restored_by_the_copy_command_its_refusal_prints(copied) -> None:
    weights = next(copied.checkpoint_dir(1).glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="Restore it from MLflow's copy") as refused:
        preflight.check(copied, 1)
    assert "re-run" not in str(refused.value)
    _follow(str(refused.value))
    assert preflight.check(copied, 1) is None


def test_an_unreadable_pool_snapshot_is_restored_by_the_copy_command_its_refusal_prints(copied) -> None:
    snapshot = copied.pool_path(1)
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    with pytest.raises(DataError, match=r"cannot be read .*Restore it from MLflow's copy") as refused:
        preflight.check(copied, 1)
    _follow(str(refused.value))
    assert preflight.check(copied, 1) is None
