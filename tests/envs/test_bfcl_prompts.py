"""The 'bfcl' prompt style builds, at every step, exactly the prompt bfcl-eval's own handler builds.

Each test drives bfcl-eval's real multi-turn loop (``inference_multi_turn_prompting``) and the
project's environment + conversation with the same replies - every entry's reference answer written
in the handler's output syntax - and compares the prompt text (the message list for the chat family)
after every step: tool results, the miss_func reveal turn and the turn step limit included.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from types import SimpleNamespace

import pytest

# envs first: it points BFCL_PROJECT_ROOT at a scratch folder before bfcl-eval creates folders there.
import envs.bfcl.api as bfcl_api  # isort: skip
from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler
from bfcl_eval.model_handler.local_inference.llama_3_1 import LlamaHandler_3_1
from bfcl_eval.model_handler.local_inference.qwen import QwenHandler
from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
from bfcl_eval.utils import load_dataset_entry

from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.official import CATEGORIES, official_tasks
from envs.bfcl.prompts import BfclConversation, call_text
from envs.calls import parse_tool_calls

THINK = "<think>\nThe user wants this done; I call the tools.\n</think>\n\n"


class _Message(dict):
    """A chat reply as the OpenAI client returns it: read by attribute, stored in the history as a dict."""

    @property
    def content(self):
        return self["content"]


def _bfcl_handler(family: str, monkeypatch, run: str):
    """A handler of ``family`` under a model name of its own: bfcl keeps each entry's API instances in
    module globals keyed by model name and entry id, so every replay needs a fresh name."""
    cls = {
        "qwen_fc": QwenFCHandler,
        "qwen": QwenHandler,
        "llama_3_1": LlamaHandler_3_1,
        "chat": OpenAICompletionsHandler,
    }[family]
    if family == "chat":
        monkeypatch.setenv("OPENAI_API_KEY", "unused-no-request-is-sent")
    return cls(f"parity-{run}-{family}", 0.0, f"parity-{run}-{family}", family != "qwen" and family != "chat")


def _reply(family: str, calls, texts: list[str]) -> str:
    """A reply making ``calls`` in the family's output syntax ('' or prose when there are none)."""
    if not calls:
        return THINK + "All done." if family.startswith("qwen") else ""
    if family == "qwen_fc":
        return THINK + "\n".join(
            f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>" for c in calls
        )
    if family == "llama_3_1":
        objects = [{"name": c.name, "parameters": c.arguments} for c in calls]
        joined = "; ".join(json.dumps(o) for o in objects)
        # bfcl splits on ';' when it sees one and evaluates the text otherwise: both forms it reads.
        return joined if len(calls) > 1 and joined.count(";") == len(calls) - 1 else repr(objects)
    body = "[" + ", ".join(texts) + "]"
    return THINK + body if family == "qwen" else body


def _script(family: str, task, answers, step_limit_turn: int | None = None) -> list[str]:
    replies = []
    for turn, texts in enumerate(answers):
        calls = task.reference[turn]
        if turn == step_limit_turn and calls:
            # One call per step until the turn's step limit forces the entry to quit.
            return replies + [_reply(family, calls[:1], texts[:1])] * 25
        if calls:
            replies.append(_reply(family, calls, texts))
        replies.append(_reply(family, [], []))
    return replies


def _bfcl_prompts(handler, family: str, entry: dict, replies: list[str]) -> list:
    prompts, pending = [], iter(replies)

    def query(inference_data):
        if family == "chat":
            prompts.append(copy.deepcopy(inference_data["message"]))
        else:
            prompts.append(handler._format_prompt(inference_data["message"], inference_data["function"]))
        text = next(pending)
        usage = SimpleNamespace(prompt_tokens=0, completion_tokens=0)
        choice = SimpleNamespace(text=text, message=_Message(role="assistant", content=text))
        return SimpleNamespace(choices=[choice], usage=usage), 0.0

    handler._query_prompting = query
    with contextlib.redirect_stdout(io.StringIO()):
        handler.inference_multi_turn_prompting(copy.deepcopy(entry), include_input_log=False, exclude_state_log=True)
    return prompts


def _our_prompts(family: str, task, replies: list[str]) -> list:
    env = BfclEnvironment(stop_on_failure=False, bfcl_loop=True)
    env.reset(task)
    conversation = BfclConversation(family, task, render_chat=lambda messages: messages)
    prompts = [conversation.text()]
    for reply in replies:
        if conversation.advance(reply, env).done:
            break
        prompts.append(conversation.text())
    return prompts


@pytest.fixture(scope="module")
def entries():
    """Every multi-turn entry as bfcl-eval's generation loads it, with its task and reference strings."""
    out = []
    for category in CATEGORIES:
        answers = {
            a["id"]: a["ground_truth"]
            for a in bfcl_api.load_jsonl(bfcl_api.DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json")
        }
        tasks = {t.description: t for t in official_tasks(category)}
        for entry in load_dataset_entry(category):
            out.append((entry, tasks[entry["id"]], answers[entry["id"]]))
    assert len(out) == 800
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen_fc", "qwen", "llama_3_1", "chat"])
def test_every_prompt_of_every_entry_matches_the_handler(family, entries, monkeypatch):
    handler = _bfcl_handler(family, monkeypatch, "all")
    mismatched = []
    for entry, task, answers in entries:
        replies = _script(family, task, answers)
        theirs = _bfcl_prompts(handler, family, entry, replies)
        ours = _our_prompts(family, task, replies)
        if ours != theirs:
            mismatched.append(entry["id"])
    assert not mismatched, f"{len(mismatched)} entries differ, first {mismatched[:5]}"


@pytest.mark.parametrize("family", ["qwen_fc", "llama_3_1"])
def test_a_turn_past_the_step_limit_quits_the_entry_as_the_handler_does(family, entries, monkeypatch):
    handler = _bfcl_handler(family, monkeypatch, "limit")
    for entry, task, answers in entries[:3] + entries[200:203]:
        replies = _script(family, task, answers, step_limit_turn=0)
        ours = _our_prompts(family, task, replies)
        assert ours == _bfcl_prompts(handler, family, entry, replies)
        assert len(ours) == 21  # 20 steps run, the 21st is executed and quits the entry


def test_call_text_names_a_call_as_bfcl_decodes_it():
    calls, _ = parse_tool_calls("[mv(source='a.txt', destination='b'), ls(a=True), f(d={'k': [1, 2]})]")
    assert [call_text(c) for c in calls] == ["mv(source='a.txt', destination='b')", "ls(a=True)", "f(d={'k': [1, 2]})"]
