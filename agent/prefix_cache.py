"""Exact KV caches of prompt prefixes, so that a turn's prompt reads only what was added since the last message.

A sequence is always read in the same pieces: it is cut after every generation prompt (the tokens that open an
assistant message) and after the end-of-message token that closes that message, and each piece is one forward
pass on the cache of the pieces before it. Whether a prefix's cache comes from the store or is computed again, it
is the same bits (the same passes over the same inputs), so the store's contents, its budget and the order prompts
arrive in change only the time, never a token or a logprob: the behaviour logprobs stay a function of the
checkpoint, the prompt and the tokens. On a multi-turn episode the next prompt starts with the last prompt and the
message scored on it, both cut where a piece ends, so its read starts from their cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.chat import GENERATION_PROMPT, ChatFormat
from coevolve.records import Message


@dataclass
class PrefixPass:
    """A prefix's KV cache (each layer's keys and values, batch of one) and the logits of the positions asked for."""

    keys: list[Any]
    values: list[Any]
    logits: Any  # (positions asked for, vocabulary), float32


def generation_opener(chat: ChatFormat) -> list[int]:
    """The tokens that open an assistant message (the generation prompt) as they appear inside a prompt; empty
    where the template's renderings with and without it do not differ by a suffix."""
    if chat.is_tiny:
        return chat.encode(GENERATION_PROMPT)
    user = [{"role": "user", "content": "x"}]
    bare = chat.encode(chat.tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False))
    opened = chat.prompt_ids([Message(role="user", content="x")])
    return opened[len(bare) :] if opened[: len(bare)] == bare else []


def cut_points(tokens: Sequence[int], end_id: int, opener: Sequence[int]) -> list[int]:
    """Where a sequence is cut into pieces: after every ``opener`` (the start of an assistant message) and after the
    ``end_id`` that closes that message (positions strictly inside the sequence, increasing). A prompt ends with
    an opener and a sampled message with its end token, so both end where a piece does; the system, user and tool
    messages between them stay in one piece each turn, read in one pass."""
    width, opener = len(opener), list(opener)
    cuts, in_message = [], False
    for position in range(1, len(tokens)):
        if width and list(tokens[max(0, position - width) : position]) == opener:
            cuts.append(position)
            in_message = True
        elif in_message and tokens[position - 1] == end_id:
            cuts.append(position)
            in_message = False
    return cuts


class PrefixStore:
    """Prefix caches by their tokens, the least recently used dropped beyond ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        # prefix -> (keys, values, their bytes)
        self._entries: OrderedDict[tuple[int, ...], tuple[list[Any], list[Any], int]] = OrderedDict()
        self._bytes = 0

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def get(self, prefix: tuple[int, ...]) -> tuple[list[Any], list[Any]] | None:
        found = self._entries.get(prefix)
        if found is None:
            return None
        self._entries.move_to_end(prefix)
        return found[0], found[1]

    def put(self, prefix: tuple[int, ...], keys: list[Any], values: list[Any]) -> None:
        size = sum(t.numel() * t.element_size() for t in (*keys, *values))
        if size > self.budget_bytes or prefix in self._entries:
            return
        self._entries[prefix] = (keys, values, size)
        self._bytes += size
        while self._bytes > self.budget_bytes:
            self._bytes -= self._entries.popitem(last=False)[1][2]
