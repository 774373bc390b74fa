"""A checkpoint folder is published whole, digested over its files, and verified against its digest."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checkpoints import checkpoint_digest, save_atomically, verify_checkpoint
from coevolve.errors import DataError


def _write(files: dict[str, bytes]):
    def write(folder: Path) -> None:
        folder.mkdir()
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)

    return write


def test_a_saved_checkpoint_replaces_the_old_one_whole_and_leaves_no_staging_folder(tmp_path):
    target = tmp_path / "round-001"
    save_atomically(target, _write({"config.json": b"{}", "old.safetensors": b"old"}))
    save_atomically(target, _write({"config.json": b"{}", "model.safetensors": b"new"}))
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-001"]


def test_a_writer_that_fails_leaves_the_previous_checkpoint_untouched(tmp_path):
    target = tmp_path / "round-001"
    save_atomically(target, _write({"model.safetensors": b"kept"}))

    def failing(folder: Path) -> None:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_atomically(target, failing)
    assert (target / "model.safetensors").read_bytes() == b"kept"


def test_the_digest_covers_names_and_contents_but_not_the_tiny_policys_build_report(tmp_path):
    save_atomically(
        tmp_path / "a", _write({"config.json": b"{}", "adapter/w.safetensors": b"1", "tiny_policy.json": b"12 s"})
    )
    save_atomically(
        tmp_path / "b", _write({"config.json": b"{}", "adapter/w.safetensors": b"1", "tiny_policy.json": b"31 s"})
    )
    save_atomically(tmp_path / "c", _write({"config.json": b"{}", "adapter/w.safetensors": b"2"}))
    assert checkpoint_digest(tmp_path / "a") == checkpoint_digest(tmp_path / "b") != checkpoint_digest(tmp_path / "c")


def test_the_digest_covers_the_optimizer_state_but_not_the_process_rng_snapshot(tmp_path):
    state = tmp_path / "trainer_state"
    state.mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (state / "optimizer.pt").write_bytes(b"moments")
    (state / "rng_state.pth").write_bytes(b"generators at save time")
    before = checkpoint_digest(tmp_path)
    (state / "rng_state.pth").write_bytes(b"another thread drew a number")
    assert checkpoint_digest(tmp_path) == before
    (state / "optimizer.pt").write_bytes(b"other moments")
    assert checkpoint_digest(tmp_path) != before


def test_a_checkpoint_whose_files_changed_after_recording_is_refused_naming_it(tmp_path):
    folder = tmp_path / "round-002"
    save_atomically(folder, _write({"config.json": b"{}", "model.safetensors": b"w"}))
    recorded = checkpoint_digest(folder)
    verify_checkpoint(str(folder), recorded, "Checkpoint 2")
    (folder / "model.safetensors").write_bytes(b"x")
    with pytest.raises(DataError, match=f"Checkpoint 2 at {folder} has digest"):
        verify_checkpoint(str(folder), recorded, "Checkpoint 2")
