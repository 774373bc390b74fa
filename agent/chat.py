"""The chat format: how a conversation becomes token ids, turn by turn.

Multi-turn rollouts append tokens as the episode goes: the prompt, the sampled assistant message,
then the tool results and the next generation prompt. Training later needs exactly those ids, so
the format must compose by concatenation:

    prompt_ids(msgs + [assistant] + new) == prompt_ids(msgs) + generated + continuation_ids(new)

where ``generated`` is the assistant message's tokens ending with the EOS token.

The builtin tiny model uses ``<|{role}|>\\n{content}<|end|>\\n`` with the generation prompt
``<|assistant|>\\n``. Its tokenizer isolates every newline before byte-level BPE, and special tokens
are always split out first, so every message boundary is also a token boundary and the law above
holds exactly. Any other Hugging Face tokenizer goes through its own ``apply_chat_template``; its
``continuation_ids`` is a best effort (see `ChatFormat.continuation_ids`).

With a pretrained model's template (SmolLM2's ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``,
end of message ``<|im_end|>``, tests/agent/test_pretrained.py) the law holds whenever the assistant
message does not open with a line break. Byte-level BPE merges the generation prompt's newline with
newlines that open the reply when a whole conversation is tokenized at once, so there (and only there)
a re-rendered conversation differs from the tokens the model produced. Rollouts never re-render: they
store the prompt, the tokens the model produced and the continuations as they were, and what follows
an end-of-message token is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coevolve.records import Message

END_TOKEN = "<|end|>"
PAD_TOKEN = "<|pad|>"
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
ROLE_TOKENS: tuple[str, ...] = tuple(f"<|{role}|>" for role in ROLES)
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, END_TOKEN, *ROLE_TOKENS)
GENERATION_PROMPT = "<|assistant|>\n"

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def render_tiny(messages: Sequence[Message], add_generation_prompt: bool) -> str:
    """The tiny template in plain Python (identical to TINY_CHAT_TEMPLATE)."""
    text = "".join(f"<|{m.role}|>\n{m.content}{END_TOKEN}\n" for m in messages)
    return text + GENERATION_PROMPT if add_generation_prompt else text


def _as_dicts(messages: Sequence[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


class ChatFormat:
    """Renders conversations to token ids in a way that composes across turns."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.is_tiny = getattr(tokenizer, "chat_template", None) == TINY_CHAT_TEMPLATE
        if self.is_tiny:
            self.eos_token_id: int = int(tokenizer.convert_tokens_to_ids(END_TOKEN))
        else:
            if tokenizer.eos_token_id is None:
                raise ValueError("The tokenizer has no EOS token; a chat policy needs one to end its messages.")
            self.eos_token_id = int(tokenizer.eos_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The whole conversation plus the assistant generation prompt."""
        if self.is_tiny:
            return self.encode(render_tiny(messages, add_generation_prompt=True))
        text = self.tokenizer.apply_chat_template(_as_dicts(messages), tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """A message list as prompt text in the tokenizer's own chat template, generation prompt included
        (the 'chat' family of prompt_style 'bfcl', whose history a template may rewrite)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def continuation_ids(self, new_messages: Sequence[Message]) -> list[int]:
        """Tokens that follow a generated assistant message (which ends with EOS).

        For templates other than the tiny one this renders a placeholder exchange with and without
        the new messages and keeps the text after the placeholder's end-of-message token. That is
        right for templates that close every message the same way (ChatML and most others), but
        templates that rewrite earlier turns (e.g. strip reasoning) can differ from a fresh render.
        """
        if self.is_tiny:
            return self.encode("\n" + render_tiny(new_messages, add_generation_prompt=True))
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        head = self.tokenizer.apply_chat_template(base, tokenize=False, add_generation_prompt=False)
        full = self.tokenizer.apply_chat_template(
            base + _as_dicts(new_messages), tokenize=False, add_generation_prompt=True
        )
        eos_text = self.tokenizer.convert_ids_to_tokens(self.eos_token_id)
        cut = head.rfind(eos_text)
        if cut < 0 or not full.startswith(head[: cut + len(eos_text)]):
            raise ValueError("This chat template does not compose by concatenation; use a template that does.")
        return self.encode(full[cut + len(eos_text) :])

    def generated_ids(self, content: str) -> list[int]:
        """The tokens of an assistant message as the policy would emit it: content then EOS."""
        return self.encode(content) + [self.eos_token_id]

    def training_example(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """Token ids of a conversation and a mask that is 1 on assistant tokens (EOS included).

        Built with the same composition law the rollouts use, so SFT sees exactly the token
        sequences the policy later produces. Messages after the last assistant message are dropped.
        """
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        if last < 0:
            raise ValueError("A training conversation needs at least one assistant message.")
        ids: list[int] = []
        mask: list[int] = []
        pending: list[Message] = []
        for message in messages[: last + 1]:
            if message.role != "assistant":
                pending.append(message)
                continue
            context = self.prompt_ids(pending) if not ids else self.continuation_ids(pending)
            ids += context
            mask += [0] * len(context)
            reply = self.generated_ids(message.content)
            ids += reply
            mask += [1] * len(reply)
            pending = []
        return ids, mask
