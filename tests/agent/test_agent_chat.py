"""The chat format composes by concatenation, so multi-turn token bookkeeping is exact."""

from __future__ import annotations

import copy

import pytest

from agent.chat import TINY_CHAT_TEMPLATE, ChatFormat, render_tiny
from coevolve.records import Message

OPENING = [Message("system", "Tools: mkdir(dir_name)."), Message("user", "make a folder temp")]
REPLY = Message("assistant", "[mkdir(dir_name='temp')]")
RESULTS = [Message("tool", "mkdir: ok\n  (created)"), Message("user", "now go in")]


def test_prompt_then_generation_then_continuation_equals_the_whole_conversation(tokenizer):
    chat = ChatFormat(tokenizer)
    stepwise = chat.prompt_ids(OPENING) + chat.generated_ids(REPLY.content) + chat.continuation_ids(RESULTS)
    assert chat.prompt_ids(OPENING + [REPLY] + RESULTS) == stepwise


@pytest.mark.parametrize(
    "content", [" leading space", "\n\nleading newlines", "trailing  \n", "tabs\there", "ünïcode ✓", ""]
)
def test_composition_holds_for_awkward_message_boundaries(tokenizer, content):
    chat = ChatFormat(tokenizer)
    reply = Message("assistant", content)
    new = [Message("tool", content)]
    stepwise = chat.prompt_ids(OPENING) + chat.generated_ids(content) + chat.continuation_ids(new)
    assert chat.prompt_ids(OPENING + [reply] + new) == stepwise


def test_tokenizer_chat_template_agrees_with_the_format(tokenizer):
    chat = ChatFormat(tokenizer)
    dicts = [{"role": m.role, "content": m.content} for m in OPENING]
    text = tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True)
    assert text == render_tiny(OPENING, add_generation_prompt=True)
    assert chat.encode(text) == chat.prompt_ids(OPENING)


def test_generated_message_ends_with_the_end_token(tokenizer):
    chat = ChatFormat(tokenizer)
    assert chat.is_tiny
    assert chat.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    assert chat.generated_ids("done")[-1] == chat.eos_token_id


def test_training_example_marks_exactly_the_assistant_tokens(tokenizer):
    chat = ChatFormat(tokenizer)
    conversation = OPENING + [REPLY] + RESULTS + [Message("assistant", "done")]
    ids, mask = chat.training_example(conversation)
    assert ids == chat.prompt_ids(OPENING + [REPLY] + RESULTS) + chat.generated_ids("done")
    supervised = [t for t, m in zip(ids, mask, strict=True) if m]
    assert supervised == chat.generated_ids(REPLY.content) + chat.generated_ids("done")


def test_other_templates_fall_back_to_apply_chat_template_and_still_compose(tokenizer):
    chatml = copy.deepcopy(tokenizer)
    chatml.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert chatml.chat_template != TINY_CHAT_TEMPLATE
    chat = ChatFormat(chatml)
    assert not chat.is_tiny
    stepwise = chat.prompt_ids(OPENING) + chat.generated_ids(REPLY.content) + chat.continuation_ids(RESULTS)
    assert chat.prompt_ids(OPENING + [REPLY] + RESULTS) == stepwise
