"""The shipped checkpoint 0: what today's recipe builds for an environment's default configuration, used
instead of a build.

Each built-in environment ships its default configuration's checkpoint 0 (`Environment.shipped_checkpoint`:
envs/bfcl/checkpoint0/, envs/workplace/checkpoint0/), committed so a first run starts at round 0.
These tests keep them honest: when the recipe (agent/tiny.py, agent/chat.py), the demonstrations or the
policy settings change, the first test fails and names the command that rebuilds the stale one, and a run
with other inputs builds from the recipe instead of using stale weights.
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
from agent.shipped_policy import REBUILD_COMMAND, check_shipped, read_record, record_path
from agent.tiny import MARKER, code_digest
from coevolve.config import load_config
from envs.registry import BUILT_IN
from tasks.prepare import initial_checkpoint, shipped_folder, tiny_policy, tiny_policy_inputs
from tasks.splits import build_initial_pools

REPO = Path(__file__).resolve().parents[2]
SHIPPING = sorted(name for name, env in BUILT_IN.items() if env.shipped_checkpoint is not None)


def default_config(environment: str):
    return load_config(data={"environment": {"name": environment}}, environ={})


def inputs_of(config):
    """A configuration's seed pool, held-out split, run key and demonstrations."""
    seed_pool, heldout = build_initial_pools(config)
    key, conversations = tiny_policy_inputs(config, seed_pool, heldout)
    return config, seed_pool, heldout, key, conversations


@pytest.fixture(scope="module")
def default_inputs():
    """The default configuration's inputs (the default environment's)."""
    return inputs_of(load_config(data={}, environ={}))


def test_every_built_in_environment_ships_a_checkpoint_0():
    assert SHIPPING == sorted(BUILT_IN)


@pytest.mark.parametrize("environment", SHIPPING)
def test_the_shipped_checkpoint_0_is_what_todays_recipe_builds_for_the_default_configuration(environment):
    config, _, _, key, conversations = inputs_of(default_config(environment))
    folder = shipped_folder(config)
    check = check_shipped(key, conversations, tiny_policy(config), config.start_seed, folder)
    rebuild = REBUILD_COMMAND + ("" if environment == "bfcl" else f' ARGS="--set environment.name={environment}"')
    assert check.usable, (
        f"{check.reason}. Rebuild it with `{rebuild}` (about 7-12 minutes) and commit "
        f"{folder.relative_to(REPO)}/ and {record_path(folder).relative_to(REPO)}."
    )


@pytest.mark.parametrize("environment", SHIPPING)
def test_the_shipped_record_says_what_it_was_built_from_and_on(environment):
    folder = BUILT_IN[environment].shipped_checkpoint
    record = read_record(folder)
    assert record is not None
    assert record["checkpoint_digest"] == checkpoint_digest(folder)
    assert record["build_digest"] == json.loads((folder / MARKER).read_text())["digest"]
    assert record["rebuild"] == REBUILD_COMMAND
    assert record["built_with"]["torch"] and record["machine"]["cpu"]
    # A few MB: a model of about 650,000 parameters in float32 (BFCL 656,128, workplace 631,296) and its tokenizer.
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size < 8 * 1024 * 1024


def test_round_0_copies_the_shipped_checkpoint_into_the_state_folder_instead_of_building(default_inputs, tmp_path):
    config, seed_pool, heldout, key, _ = default_inputs
    config = config.model_copy(update={"state_dir": tmp_path / "state"})
    started = time.perf_counter()
    checkpoint = Path(initial_checkpoint(config, seed_pool, heldout))
    assert time.perf_counter() - started < 60, "a build takes minutes; the copy takes a second"
    assert checkpoint == tmp_path / "state" / "models" / f"tiny-{key[:12]}"
    assert checkpoint_digest(checkpoint) == read_record(shipped_folder(config))["checkpoint_digest"]


def test_other_policy_settings_build_from_the_recipe_instead_of_using_the_shipped_weights(default_inputs):
    config, _, _, key, conversations = default_inputs
    changed = config.policy.model_copy(update={"sft_steps": config.policy.sft_steps + 1})
    folder = shipped_folder(config)
    check = check_shipped(key, conversations, changed, config.start_seed, folder)
    assert not check.usable
    assert "another recipe" in check.reason
    assert not check_shipped("0" * 64, conversations, config.policy, config.start_seed, folder).usable


def test_an_environment_that_ships_none_builds_and_says_why(default_inputs):
    config, _, _, key, conversations = default_inputs
    check = check_shipped(key, conversations, config.policy, config.start_seed, None)
    assert not check.usable
    assert check.reason == "the environment ships no checkpoint 0"


def test_damaged_shipped_files_are_not_used(default_inputs, tmp_path):
    config, _, _, key, conversations = default_inputs
    copy = tmp_path / "checkpoint0"
    shutil.copytree(shipped_folder(config), copy)
    shutil.copy(record_path(shipped_folder(config)), record_path(copy))
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
    out = tmp_path / "shipped" / "checkpoint0"
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
