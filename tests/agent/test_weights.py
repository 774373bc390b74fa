"""LoRA weight sync: a chain of round adapters is served as one stacked adapter, published whole."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agent.weights import stack_adapters

MODULE = "base_model.model.model.layers.0.self_attn.q_proj"


def _adapter(folder: Path, rank: int, alpha: int, seed: int) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rank, 8, generator=generator), torch.randn(6, rank, generator=generator)
    folder.mkdir(parents=True)
    save_file({f"{MODULE}.lora_A.weight": a, f"{MODULE}.lora_B.weight": b}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps({"r": rank, "lora_alpha": alpha, "target_modules": ["q_proj"]})
    )
    return a, b


def test_the_stacked_adapter_applies_every_round_adapter_in_turn_and_is_written_whole(tmp_path):
    a1, b1 = _adapter(tmp_path / "round-001" / "adapter", rank=2, alpha=4, seed=1)
    a2, b2 = _adapter(tmp_path / "round-002" / "adapter", rank=2, alpha=8, seed=2)
    out = stack_adapters(
        [tmp_path / "round-001" / "adapter", tmp_path / "round-002" / "adapter"], tmp_path / "stacks" / "s"
    )
    stacked = load_file(str(out / "adapter_model.safetensors"))
    delta = stacked[f"{MODULE}.lora_B.weight"] @ stacked[f"{MODULE}.lora_A.weight"]  # alpha = rank: scaling 1
    expected = (4 / 2) * b1 @ a1 + (8 / 2) * b2 @ a2
    assert (delta - expected).abs().max().item() < 1e-5
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    assert sorted(p.name for p in out.parent.iterdir()) == ["s"]  # no staging folder left
