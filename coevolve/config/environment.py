"""What the agent plays: the environment, its episode limits and how its prompts are written."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from coevolve.config.base import Section
from coevolve.plugins import declared_names

# The environments envs/registry.py builds in (tests/envs/test_environment_registry.py checks the two lists agree),
# and the entry-point group under which an installed package declares another; its names are read here without
# importing the package, so the configuration stays light.
BUILT_IN_ENVIRONMENTS: tuple[str, ...] = ("bfcl", "workplace")
ENVIRONMENT_ENTRY_POINTS = "coevolve.environments"


def environment_names() -> list[str]:
    """Every value environment.name may take here: the built-in environments, then those installed packages declare."""
    return [*BUILT_IN_ENVIRONMENTS, *declared_names(ENVIRONMENT_ENTRY_POINTS)]


class EnvironmentConfig(Section):
    name: str = Field(
        "bfcl",
        description=(
            "Environment the agent plays. 'bfcl': BFCL v3 multi-turn, offline; 'workplace': a person's mail, calendar, "
            "contacts and project tasks, generated from a seed; an installed package may add others "
            "(entry-point group coevolve.environments, docs/extending.md)."
        ),
    )

    @field_validator("name")
    @classmethod
    def _known_environment(cls, value: str) -> str:
        if value in BUILT_IN_ENVIRONMENTS:
            return value
        known = environment_names()
        if value not in known:
            raise ValueError(
                f"unknown environment {value!r}; use one of {known}, or install the package that declares it"
            )
        return value

    max_steps: int = Field(
        30, ge=1, description="Model messages per episode before it counts as a failure (paper: 30)."
    )
    max_steps_per_turn: int = Field(
        4, ge=1, description="Model messages per user turn; a turn ends when the model calls no tool."
    )
    max_observation_chars: int = Field(
        80,
        ge=16,
        description=(
            "Tool results longer than this are cut in the prompt. Short for the builtin tiny model: results are most "
            "of its tokens and it only needs to see that the calls ran (paper-scale configs raise it)."
        ),
    )
    tool_list: Literal["described", "signatures", "names"] = Field(
        "names",
        description=(
            "How the system prompt lists tools: with signatures and descriptions, signatures only, or bare names. "
            "Bare names for the builtin tiny model: its prompts get about 5x shorter, so SFT and rollouts run several "
            "times faster and it learns arguments from demonstrations; 'described' for real LLMs (configs/paper.yaml)."
        ),
    )
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
            "(coevolve.config.derive_bfcl_handler)."
        ),
    )

    @model_validator(mode="after")
    def _bfcl_prompts_only_on_bfcl(self) -> EnvironmentConfig:
        # BFCL's prompts are bfcl-eval's, written by envs/bfcl only; every other environment writes the compact ones.
        if self.prompt_style == "bfcl" and self.name != "bfcl":
            raise ValueError(
                f"environment.prompt_style 'bfcl' writes BFCL's own prompts and applies to environment.name 'bfcl' "
                f"only; set environment.prompt_style to compact for {self.name!r}."
            )
        return self


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
