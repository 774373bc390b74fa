"""What vLLM's workers gain from `coevolve serve` (``--worker-extension-cls``), called through ``POST /collective_rpc``.

vLLM imports this module inside its worker processes (the repository is on their ``PYTHONPATH``), so it
imports nothing of its own: the worker already holds torch and the model.
"""

from __future__ import annotations

from typing import Any


class CoevolveWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    # The worker's own attribute: its model runner, which holds the loaded model.
    model_runner: Any

    def refresh_tied_output(self) -> bool:
        """Rebuild the output layer of a model that ties it to its input embeddings from the current weights.

        vLLM 0.32's ``reload_weights`` loads a tied model's embeddings but no output layer (the checkpoint
        has none), and never reprocesses that layer: on the CPU build it keeps computing with the packed
        copy of the old embeddings made when the server started. This ties the layer to the embeddings
        again and reprocesses it (the packing redone from the new values). Returns whether the model ties
        them; False leaves it unchanged.
        """
        model = self.model_runner.get_model()
        config = getattr(model, "config", None)
        lm_head = getattr(model, "lm_head", None)
        embed_tokens = getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(config, "tie_word_embeddings", False) or lm_head is None or embed_tokens is None:
            return False
        if lm_head.weight is not embed_tokens.weight:
            lm_head.weight = embed_tokens.weight
        quant_method = getattr(lm_head, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(lm_head)
        return True
