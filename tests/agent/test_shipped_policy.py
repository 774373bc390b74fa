"""The shipped checkpoint 0: what today's recipe builds for the default configuration, used instead of a build.

agent/builtin_tiny/ is the default configuration's checkpoint 0, committed so `make run` starts at round 0.
These tests keep it honest: when the recipe (agent/tiny.py, agent/chat.py), the demonstrations or the
policy settings change, the first test fails and names the command that rebuilds it, and a run with
other inputs builds from the recipe instead of using stale weights.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.checkpoints import checkpoint_digest
from agent.shipped_policy import REBUILD_COMMAND, SHIPPED_DIR, SHIPPED_RECORD, check_shipped, read_record
from agent.tiny import MARKER, code_digest
from coevolve.config import load_config
from tasks.prepare import initial_checkpoint, tiny_policy_inputs
from tasks.splits import build_initial_pools

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_inputs():
    """The default configuration's seed pool, held-out split, run key and demonstrations."""
    config = load_config(data={}, environ={})
    seed_pool, heldout = build_initial_pools(config)
    key, conversations = tiny_policy_inputs(config, seed_pool, heldout)
    return config, seed_pool, heldout, key, conversations


def test_the_shipped_checkpoint_0_is_what_todays_recipe_builds_for_the_default_configuration(default_inputs):
    config, _, _, key, conversations = default_inputs
    check = check_shipped(key, conversations, config.policy, config.start_seed)
    assert check.usable, (
        f"{check.reason}. Rebuild it with `{REBUILD_COMMAND}` (about 7 minutes) and commit "
        f"{SHIPPED_DIR.relative_to(REPO)}/ and {SHIPPED_RECORD.relative_to(REPO)}."
    )


def test_the_shipped_record_says_what_it_was_built_from_and_on():
    record = read_record()
    assert record is not None
    assert record["checkpoint_digest"] == checkpoint_digest(SHIPPED_DIR)
    assert record["build_digest"] == json.loads((SHIPPED_DIR / MARKER).read_text())["digest"]
    assert record["rebuild"] == REBUILD_COMMAND
    assert record["built_with"]["torch"] and record["machine"]["cpu"]
    # A few MB: the 656,128-parameter model in float32 and its tokenizer.
    size = sum(f.stat().st_size for f in SHIPPED_DIR.rglob("*") if f.is_file())
    assert size < 8 * 1024 * 1024


def test_round_0_copies_the_shipped_checkpoint_into_the_state_folder_instead_of_building(default_inputs, tmp_path):
    config, seed_pool, heldout, key, _ = default_inputs
    config = config.model_copy(update={"state_dir": tmp_path / "state"})
    started = time.perf_counter()
    checkpoint = Path(initial_checkpoint(config, seed_pool, heldout))
    assert time.perf_counter() - started < 60, "a build takes minutes; the copy takes a second"
    assert checkpoint == tmp_path / "state" / "models" / f"tiny-{key[:12]}"
    assert checkpoint_digest(checkpoint) == read_record()["checkpoint_digest"]


def test_other_policy_settings_build_from_the_recipe_instead_of_using_the_shipped_weights(default_inputs):
    config, _, _, key, conversations = default_inputs
    changed = config.policy.model_copy(update={"sft_steps": config.policy.sft_steps + 1})
    check = check_shipped(key, conversations, changed, config.start_seed)
    assert not check.usable
    assert "another recipe" in check.reason
    assert not check_shipped("0" * 64, conversations, config.policy, config.start_seed).usable


def test_damaged_shipped_files_are_not_used(default_inputs, tmp_path):
    config, _, _, key, conversations = default_inputs
    copy = tmp_path / "builtin_tiny"
    shutil.copytree(SHIPPED_DIR, copy)
    shutil.copy(SHIPPED_RECORD, copy.with_suffix(".json"))
    assert check_shipped(key, conversations, config.policy, config.start_seed, folder=copy).usable
    with (copy / "tokenizer.json").open("ab") as handle:
        handle.write(b" ")
    check = check_shipped(key, conversations, config.policy, config.start_seed, folder=copy)
    assert not check.usable
    assert "no longer match their digest" in check.reason


def test_the_recipe_digest_sees_code_changes_but_not_comments_docstrings_or_formatting(tmp_path):
    source = (REPO / "agent" / "tiny.py").read_text()
    original = tmp_path / "original.py"
    original.write_text(source)
    reworded = tmp_path / "reworded.py"
    reworded.write_text(
        source.replace('"""The builtin tiny policy', '"""A reworded docstring.\n\nThe builtin tiny policy', 1).replace(
            "WARMUP_FRACTION = 0.05", "WARMUP_FRACTION = (\n    0.05  # a comment\n)", 1
        )
    )
    changed = tmp_path / "changed.py"
    changed.write_text(source.replace("WARMUP_FRACTION = 0.05", "WARMUP_FRACTION = 0.1", 1))
    assert code_digest([reworded]) == code_digest([original])
    assert code_digest([changed]) != code_digest([original])


def test_the_rebuild_command_builds_and_ships_a_checkpoint_that_round_0_then_uses(tmp_path):
    """`coevolve build-policy` (what `make policy` runs), at a reduced size, into another folder."""
    policy = {
        "sft_tasks": 24,
        "sft_steps": 4,
        "hidden_size": 32,
        "num_layers": 1,
        "vocab_size": 400,
        "sft_batch_size": 4,
    }
    config = load_config(data={"state_dir": str(tmp_path / "state"), "policy": policy}, environ={})
    options = [arg for name, value in policy.items() for arg in ("--set", f"policy.{name}={value}")]
    out = tmp_path / "shipped" / "builtin_tiny"
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "build-policy", "--output", str(out),
         "--set", f"state_dir={config.state_dir}", *options],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"written to {out}" in done.stdout
    seed_pool, heldout = build_initial_pools(config)
    key, conversations = tiny_policy_inputs(config, seed_pool, heldout)
    assert check_shipped(key, conversations, config.policy, config.start_seed, folder=out).usable
