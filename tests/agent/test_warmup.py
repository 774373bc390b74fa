"""A pretrained policy's warm-up: SFT on the environment's demonstrations before round 0 (agent/warmup.py).

The tiny policy of the shared fixtures stands in for a pretrained model: what is checked is the route
(the tiny recipe run on another model's weights and template, written whole, reused, named by its
inputs), not what SmolLM2 learns; docs/engines.md has that, measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agent.warmup import MARKER, is_warmed, warm_up, warmup_digest
from coevolve.config import PolicyConfig, load_config
from coevolve.records import Message
from tasks.prepare import initial_checkpoint
from tasks.splits import build_initial_pools


def warmup_settings(learning_rate: float = 1e-3) -> PolicyConfig:
    return PolicyConfig(warmup_steps=3, warmup_learning_rate=learning_rate, warmup_batch_size=2)


def test_warm_up_fine_tunes_the_model_on_the_demonstrations_and_marks_the_folder(
    tiny_dir: Path, demos: list[list[Message]], tmp_path: Path
) -> None:
    settings = warmup_settings()
    out = warm_up(str(tiny_dir), tmp_path, demos, settings, seed=0)

    report = json.loads((out / MARKER).read_text())
    assert report["digest"] == warmup_digest(str(tiny_dir), demos, settings, 0)
    assert report["warmup_steps"] == 3 and report["conversations"] == len(demos)
    assert report["first_loss"] is not None and report["final_loss"] is not None
    before, after = load_file(tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not before[name].equal(after[name]) for name in before), "the warm-up changed no weight"
    assert (out / "tokenizer.json").read_text() == (tiny_dir / "tokenizer.json").read_text()


def test_a_second_warm_up_of_the_same_inputs_returns_the_folder_without_training(
    tiny_dir: Path, demos: list[list[Message]], tmp_path: Path
) -> None:
    settings = warmup_settings()
    out = warm_up(str(tiny_dir), tmp_path, demos, settings, seed=0)
    written = (out / MARKER).stat().st_mtime_ns

    assert warm_up(str(tiny_dir), tmp_path, demos, settings, seed=0) == out
    assert (out / MARKER).stat().st_mtime_ns == written
    # Other settings are another warm-up: the folder no longer counts as done for them.
    assert not is_warmed(out, warmup_digest(str(tiny_dir), demos, warmup_settings(learning_rate=2e-3), 0))
    assert not is_warmed(out, warmup_digest(str(tiny_dir), demos[:2], settings, 0))


def test_round_zero_starts_from_the_warm_up_only_when_warmup_steps_are_set(tiny_dir: Path, tmp_path: Path) -> None:
    overrides = [f"state_dir={tmp_path / 'state'}", f"policy.model={tiny_dir}", "policy.sft_tasks=6"]
    overrides += ["rollout.heldout_tasks=4", "pool.seed_size=6"]
    as_given = load_config(None, overrides)
    seed_pool, heldout = build_initial_pools(as_given)
    assert initial_checkpoint(as_given, seed_pool, heldout) == str(tiny_dir)

    warmed = load_config(None, [*overrides, "policy.warmup_steps=2", "policy.warmup_batch_size=2"])
    checkpoint = Path(initial_checkpoint(warmed, seed_pool, heldout))
    assert checkpoint.parent == warmed.state_dir / "models" and checkpoint.name.startswith("warmup-")
    assert json.loads((checkpoint / MARKER).read_text())["conversations"] == 6


def test_warm_up_refuses_an_empty_demonstration_set(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one demonstration"):
        warm_up(str(tiny_dir), tmp_path, [], warmup_settings(), seed=0)
