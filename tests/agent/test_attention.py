"""The CPU policy's attention: SDPA over grouped keys and values gives what transformers' SDPA attention gives.

The shipped BFCL checkpoint 0 has 4 query heads and 2 key-value heads, so transformers' "sdpa" attention copies its
keys and values out to 4 heads before every masked pass; the grouped attention must not change a bit of what the
engine samples and scores, and must train the same weights up to float rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from agent.attention import GROUPED_SDPA, use_grouped_attention
from agent.transformers_engine import load_policy

SHIPPED = Path(__file__).resolve().parents[2] / "envs" / "bfcl" / "checkpoint0"


def both_attentions(path: Path = SHIPPED) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same weights under transformers' SDPA attention and under the grouped one."""
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    grouped = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    use_grouped_attention(grouped)
    assert plain.config._attn_implementation == "sdpa" and grouped.config._attn_implementation == GROUPED_SDPA
    return plain, grouped


def the_engines_passes(model: torch.nn.Module) -> list[torch.Tensor]:
    """The kinds of pass the engine makes: a left-padded batch, a decoding step on its cache, a sequence read alone
    and a read after a cached prefix."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 2000, (6, 40), generator=generator)
    mask = torch.ones_like(ids)
    mask[:3, :11] = 0  # left padding
    with torch.inference_mode():
        batch = model(input_ids=ids, attention_mask=mask, use_cache=True)
        step = model(
            input_ids=ids[:, :1],
            attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1),
            past_key_values=batch.past_key_values,
            use_cache=True,
        )
        alone = model(input_ids=ids[:1, :25], use_cache=True)
        after_prefix = model(input_ids=ids[:1, 25:], past_key_values=alone.past_key_values, use_cache=True)
    return [batch.logits, step.logits, alone.logits, after_prefix.logits]


def test_the_engines_passes_give_the_same_bits_under_grouped_attention():
    plain, grouped = both_attentions()
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads  # grouped heads, or nothing is tested
    for expected, got in zip(the_engines_passes(plain), the_engines_passes(grouped), strict=True):
        assert torch.equal(expected, got)


def test_a_training_pass_gives_the_same_loss_and_gradients_up_to_float_rounding():
    plain, grouped = both_attentions()
    ids = torch.randint(3, 2000, (4, 30), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[:2, :7] = 0
    losses, gradients = [], []
    for model in (plain, grouped):
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        losses.append(loss.detach())
        gradients.append([p.grad.clone() for p in model.parameters()])
    assert torch.equal(losses[0], losses[1])
    for expected, got in zip(*gradients, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_a_policy_loaded_on_a_cpu_runs_grouped_attention_and_saves_a_plain_checkpoint(tmp_path):
    policy, _ = load_policy(SHIPPED)
    assert policy.config._attn_implementation == GROUPED_SDPA
    policy.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    shipped = json.loads((SHIPPED / "config.json").read_text())
    assert saved.keys() == shipped.keys()  # nothing of the attention choice is written for other loaders to read


def test_a_model_that_chose_another_attention_keeps_it():
    eager = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32, attn_implementation="eager")
    use_grouped_attention(eager)
    assert eager.config._attn_implementation == "eager"


def test_without_grouped_heads_the_attention_is_plain_sdpa(tmp_path):
    config = AutoConfig.from_pretrained(SHIPPED)
    config.num_key_value_heads = config.num_attention_heads
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    plain, grouped = both_attentions(tmp_path)
    for expected, got in zip(the_engines_passes(plain), the_engines_passes(grouped), strict=True):
        assert torch.equal(expected, got)


def test_a_cache_built_from_stored_pieces_reads_the_same_under_grouped_attention():
    """The engine rebuilds a prefix's cache from stored keys and values (agent/prefix_cache.py) before reading on."""
    plain, grouped = both_attentions()
    ids = torch.randint(3, 2000, (1, 30), generator=torch.Generator().manual_seed(2))
    outputs = []
    for model in (plain, grouped):
        with torch.inference_mode():
            prefix = model(input_ids=ids[:, :20], use_cache=True).past_key_values
            cache = DynamicCache(config=model.config)
            for index, layer in enumerate(prefix.layers):
                cache.update(layer.keys, layer.values, index)
            outputs.append(model(input_ids=ids[:, 20:], past_key_values=cache, use_cache=True).logits)
    assert torch.equal(outputs[0], outputs[1])
