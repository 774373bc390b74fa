"""The attention a policy runs with on a CPU: PyTorch's SDPA handed a grouped-query model's keys and values as they are.

transformers' own "sdpa" attention copies the keys and values of a model with fewer key-value heads than query heads
out to one head per query head (``repeat_kv``) whenever a mask is passed on a CPU or CUDA: CUDA's fused kernels take
grouped heads only without a mask. On a CPU every read the engine makes after a cached prefix, every decoding step of
a padded batch and every training pass carries a mask, so each layer copied its whole cache on every forward pass.
PyTorch's CPU kernel takes a mask and grouped heads together (``enable_gqa``) and gives the same bits
(tests/agent/test_attention.py); what it saves is in benchmarks/STEP.md. On CUDA the policy keeps transformers' choice.
"""

from __future__ import annotations

from typing import Any

from coevolve.optional import optional_module

torch = optional_module("torch")
transformers = optional_module("transformers")

# The name the attention is registered under; it contains "sdpa", so transformers checks that a model can run SDPA.
GROUPED_SDPA = "sdpa_grouped_kv"


def grouped_sdpa_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function contract (``AttentionInterface``): SDPA over the grouped heads, no copy.

    Queries are (batch, heads, q_len, head_dim); keys and values (batch, key-value heads, kv_len, head_dim); the mask,
    when there is one, is the boolean mask transformers builds for SDPA (``sdpa_mask``).
    """
    if kwargs.get("position_bias") is not None:
        raise ValueError(f"{GROUPED_SDPA!r} attention takes no position bias; load this model with 'sdpa'")
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # As transformers' SDPA attention: without a mask a prompt's own pass is causal, a single query sees every key.
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    if causal and key.shape[2] > query.shape[2]:
        # SDPA aligns its causal mask top-left; keys past the queries (an empty static cache's tail) are cut off.
        key, value = key[:, :, : query.shape[2]], value[:, :, : query.shape[2]]
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None


def use_grouped_attention(model: Any) -> None:
    """Run ``model`` with `grouped_sdpa_attention` where it helps: a CPU machine, and a model on transformers' SDPA
    attention (a model that chose or needs another attention keeps it)."""
    if torch.cuda.is_available() or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    transformers.AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    # The same mask as transformers' SDPA attention: boolean, or None where causality alone describes it.
    transformers.AttentionMaskInterface.register(GROUPED_SDPA, transformers.masking_utils.sdpa_mask)
    model.set_attn_implementation(GROUPED_SDPA)
