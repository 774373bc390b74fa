"""BFCL's own settings: how the policy's prompts are written (the project's compact prompt, or bfcl-eval's own for a
handler family). Fields of the ``environment`` configuration section where environment.name is 'bfcl', validated
when the configuration loads (coevolve/config/environment.py finds this model without importing the environment).
"""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import Field

from coevolve.config.environment import EnvironmentSettings


class BfclSettings(EnvironmentSettings):
    prompt_style: Literal["compact", "bfcl"] = Field(
        "compact",
        description=(
            "How tools, calls and results are written in the policy's prompts. 'compact': the project's short prompt "
            "(tool_list, one python call list per message, cut results), which the builtin tiny model is trained on. "
            "'bfcl': exactly what bfcl-eval sends the model family bfcl_handler names (its system prompt or chat "
            "template, tool-call syntax, full results, the miss_func reveal turn and its 20-step turn limit), so a "
            "policy trains in the format its BFCL score is measured in and scores compare with published ones."
        ),
    )
    bfcl_handler: Literal["qwen_fc", "qwen", "llama_3_1", "chat"] | None = Field(
        None,
        description=(
            "bfcl-eval handler family for prompt_style 'bfcl': 'qwen_fc' (Qwen's template, tools in <tools>, calls in "
            "<tool_call> blocks), 'qwen' (Qwen prompting: bfcl's system prompt, python call lists), 'llama_3_1' "
            "(Llama 3.1 JSON calls, tools in the first user message), 'chat' (bfcl's prompting message list rendered "
            "with the model's own chat template). Unset: derived from policy.model where the name leaves one choice "
            "(envs.bfcl.settings.derive_bfcl_handler)."
        ),
    )

    def for_policy(self, model: str) -> Self:
        """BFCL's prompts need a pretrained model, and a handler family: the one ``model``'s name says, if unset."""
        if self.prompt_style != "bfcl":
            return self
        if model == "builtin:tiny":
            raise ValueError(
                "environment.prompt_style 'bfcl' needs a pretrained model: builtin:tiny is fine-tuned on "
                "demonstrations in the compact prompt and only knows that one. Keep prompt_style compact, or set "
                "policy.model to a Hugging Face id or local path (and environment.bfcl_handler)."
            )
        if self.bfcl_handler is not None:
            return self
        derived = derive_bfcl_handler(model)
        if derived is None:
            raise ValueError(
                f"environment.prompt_style is 'bfcl' but the bfcl-eval handler of {model!r} cannot be told from its "
                "name; set environment.bfcl_handler to qwen_fc (Qwen function calling), qwen (Qwen prompting), "
                "llama_3_1 (Llama 3.1-3.3) or chat (bfcl's prompting messages in the model's own chat template)."
            )
        return self.model_copy(update={"bfcl_handler": derived})


def derive_bfcl_handler(model: str) -> str | None:
    """The bfcl-eval handler family a model name leaves no choice about, or None.

    bfcl-eval scores Qwen models both ways (function calling and prompting) and most families in
    several handlers, so only names that say which one are derived: a Qwen name ending in ``-FC``
    and Llama 3.1 to 3.3 (whose bfcl handler is LlamaHandler_3_1).
    """
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if "qwen" in name and name.endswith("-fc"):
        return "qwen_fc"
    if re.search(r"llama-?3\.[123]", name):
        return "llama_3_1"
    return None
