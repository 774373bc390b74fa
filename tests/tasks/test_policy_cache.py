"""``policy_cache_dir``: checkpoint 0 of the builtin tiny policy is built once and copied into other state folders.

Every state folder still holds its own copy (a copy can be moved or backed up alone); only a build of today's
recipe for the same inputs is copied, and the shared folder never loses a build another run may be reading.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agent.checkpoints import checkpoint_digest
from agent.tiny import MARKER
from tasks.prepare import initial_checkpoint
from tasks.splits import build_initial_pools
from tests.conftest import make_tiny_config


def _checkpoint_0(state: Path, cache: Path, **overrides) -> Path:
    config = make_tiny_config(state, policy_cache_dir=str(cache), **overrides)
    seed_pool, heldout = build_initial_pools(config)
    return Path(initial_checkpoint(config, seed_pool, heldout))


def test_a_second_state_folder_copies_the_first_ones_build(tmp_path) -> None:
    cache = tmp_path / "cache"
    first = _checkpoint_0(tmp_path / "a", cache)
    (published,) = cache.iterdir()
    second = _checkpoint_0(tmp_path / "b", cache)

    assert first.is_relative_to(tmp_path / "a") and second.is_relative_to(tmp_path / "b")
    assert checkpoint_digest(first) == checkpoint_digest(second) == checkpoint_digest(published)
    # A build records its own duration; the copy carries the first build's record, so nothing was built again.
    assert json.loads((second / MARKER).read_text()) == json.loads((first / MARKER).read_text())
    assert [p.name for p in cache.iterdir()] == [published.name]


def test_other_settings_build_their_own_checkpoint_and_add_it(tmp_path) -> None:
    cache = tmp_path / "cache"
    first = _checkpoint_0(tmp_path / "a", cache)
    other = _checkpoint_0(tmp_path / "b", cache, policy={"sft_steps": 8})

    assert checkpoint_digest(first) != checkpoint_digest(other)
    assert json.loads((other / MARKER).read_text())["sft_steps"] == 8
    assert len(list(cache.iterdir())) == 2


def test_a_damaged_build_in_the_shared_folder_is_not_copied_and_not_replaced(tmp_path, caplog) -> None:
    cache = tmp_path / "cache"
    first = _checkpoint_0(tmp_path / "a", cache)
    (published,) = cache.iterdir()
    (published / MARKER).write_text("{}")  # not today's recipe any more

    with caplog.at_level(logging.INFO, logger="tasks.prepare"):
        second = _checkpoint_0(tmp_path / "b", cache)

    assert json.loads((second / MARKER).read_text())["digest"] == json.loads((first / MARKER).read_text())["digest"]
    # Built anew from the recipe, not copied: the build's own log line, and a build report written after the first's.
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoint 0:")]
    assert any(f"building from the recipe into {second}" in line for line in said), said
    assert not any(f"copied to {second}" in line for line in said), said
    assert (second / MARKER).stat().st_mtime_ns > (first / MARKER).stat().st_mtime_ns
    assert (published / MARKER).read_text() == "{}"  # another run may be reading it: left as it was
