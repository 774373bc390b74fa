"""The contract of a generation engine: what rollout, evaluation and the update's behaviour logprobs need.

An engine turns token-id prompts into one `Generation` per prompt: the sampled token ids (the EOS included
when it stopped), the log-probability of each under the sampling distribution (softmax(logits / temperature);
at temperature 0 the untempered one), and why it stopped. The rollout stage trains on exactly those ids and
logprobs, so an engine never re-tokenizes.

Every engine is an `Engine` subclass with a ``name`` (the value of ``rollout.engine``) and a ``from_config``
constructor; agent/engines.py lists them (transformers, vLLM in-process, OpenAI-compatible servers) and adds
those installed packages declare under the entry-point group ``coevolve.engines``. `Engine.generate` is final:
it checks the request once for every engine (non-empty prompts, one seed per prompt) and hands it to the
engine's ``_generate``. docs/extending.md shows an engine written from scratch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self, final

from agent.chat import ChatFormat

if TYPE_CHECKING:
    from coevolve.config import PipelineConfig


@dataclass
class Generation:
    """One sampled continuation: its tokens (EOS included when it stopped) and their logprobs."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS generated) or "length"


class Engine(ABC):
    """Generates continuations of token-id prompts with behaviour logprobs; a context manager that closes it."""

    # The value of rollout.engine that picks this engine.
    name: ClassVar[str]
    # A Hugging Face tokenizer (ChatFormat wraps it) and the chat format prompts are rendered with.
    tokenizer: Any
    chat: ChatFormat

    @classmethod
    @abstractmethod
    def from_config(cls, checkpoint: str | Path, config: PipelineConfig) -> Engine:
        """The engine generating with ``checkpoint``'s weights, set up as ``config`` says."""

    @final
    def generate(
        self, prompts: list[list[int]], temperature: float, max_new_tokens: int, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Continue every prompt until EOS or max_new_tokens; one Generation per prompt, in order.

        ``seeds`` (one per prompt) fixes each prompt's sample, whatever else is generated beside it; greedy
        decoding (temperature 0) ignores them, and without them the engine's own randomness decides.
        """
        if not prompts:
            return []
        if any(not p for p in prompts):
            raise ValueError("Every prompt needs at least one token.")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"Got {len(seeds)} seeds for {len(prompts)} prompts; pass one seed per prompt.")
        return self._generate(prompts, temperature, max_new_tokens, seeds)

    @abstractmethod
    def _generate(
        self, prompts: list[list[int]], temperature: float, max_new_tokens: int, seeds: list[int] | None
    ) -> list[Generation]:
        """`generate` for checked requests: at least one prompt, none empty, seeds None or one per prompt."""

    def prepare(self, checkpoint: str | Path, config: PipelineConfig) -> None:
        """Make the engine generate with ``checkpoint`` before a stage starts (servers get the weights pushed);
        nothing to do for an engine that loaded them itself."""
        return None

    @property
    def max_context_tokens(self) -> int | None:
        """Tokens the engine's model can attend to; None when unknown."""
        return None

    def close(self) -> None:
        """Release what the engine holds (models, workers, servers, connections) before the update trains."""
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
