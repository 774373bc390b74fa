"""The builtin tiny policy: built offline, learns its demonstrations, and is built only once."""

from __future__ import annotations

import json
import time

from agent.chat import ChatFormat
from agent.tiny import MARKER, build_tiny_policy, is_built
from agent.transformers_engine import TransformersEngine


def test_build_saves_safetensors_weights_tokenizer_and_marker(tiny_dir):
    assert (tiny_dir / "model.safetensors").is_file()
    assert (tiny_dir / "tokenizer.json").is_file()
    summary = json.loads((tiny_dir / MARKER).read_text())
    assert summary["sft_steps"] == 150 and summary["parameters"] > 0
    assert 0 < summary["final_loss"] < 0.1  # TRL's last logged loss: four demonstrations learned by step 150


def test_saved_tokenizer_reloads_with_the_tiny_chat_format(tokenizer):
    assert ChatFormat(tokenizer).is_tiny


def test_second_build_with_the_same_inputs_returns_without_training(tiny_dir, demos, tiny_config):
    weights = tiny_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    started = time.perf_counter()
    assert build_tiny_policy(tiny_dir, demos, tiny_config, seed=0) == tiny_dir
    assert time.perf_counter() - started < 1.0
    assert weights.stat().st_mtime_ns == before


def test_changed_inputs_do_not_count_as_built(tiny_dir, demos, tiny_config):
    assert is_built(tiny_dir, demos, tiny_config, seed=0)
    assert not is_built(tiny_dir, demos, tiny_config, seed=1)
    assert not is_built(tiny_dir, demos[:-1], tiny_config, seed=0)
    assert not is_built(tiny_dir, demos, tiny_config.model_copy(update={"sft_steps": 151}), seed=0)


def test_sft_teaches_the_demonstrated_tool_calls(tiny_dir, demos):
    engine = TransformersEngine(tiny_dir)
    prompts = [engine.chat.prompt_ids(conv[:2]) for conv in demos]
    generations = engine.generate(prompts, temperature=0.0, max_new_tokens=40)
    texts = [engine.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]
    assert texts == [conv[2].content for conv in demos]
