"""The 'bfcl' prompt style: the conversation bfcl-eval itself holds with a model of one handler family.

bfcl-eval scores a local model by keeping a message list, turning it into one prompt text per step
with the handler's ``_format_prompt`` (or sending the list to a chat API), and extending the list
after every reply with the handler's own history message, one message per tool result, and the next
user turn. A `BfclConversation` keeps the same list for one episode, so the policy is trained on the
prompts its BFCL score is measured with. Families (``environment.bfcl_handler``):

* ``qwen_fc``   - ``QwenFCHandler``: Qwen's template, tools as JSON in ``<tools>``, calls in
  ``<tool_call>`` blocks; a reply with calls is kept as ``tool_calls`` (re-serialised) and the
  reasoning of turns before the last user query is dropped.
* ``qwen``      - ``QwenHandler``: Qwen's template in prompting mode: bfcl's system prompt with the
  tools, python call lists, reasoning of earlier turns dropped.
* ``llama_3_1`` - ``LlamaHandler_3_1``: tools and instructions in the first user message, JSON
  calls ``{"name": ..., "parameters": ...}``, results under the ``ipython`` header.
* ``chat``      - bfcl's prompting message list as chat-API handlers send it (bfcl's system prompt,
  python call lists, all results of a step in one user message), rendered with the model's own
  chat template: the generic format for a model bfcl-eval has no local handler for.

What is ours and what is bfcl-eval's: the message list (which messages, in which order, with which
text) is built here, in this module's words. Turning the list into text calls the handler's
``_format_prompt`` - a pure string function of the pinned benchmark package, offline and with no
tokenizer - because that text *is* the benchmark's definition and a second copy could only drift
from it; bfcl's system prompt text comes from its ``system_prompt_pre_processing_chat_model`` for
the same reason. tests/envs/test_bfcl_prompts.py drives bfcl-eval's own multi-turn loop over all
800 multi-turn entries and checks every prompt of every step against this module. Parsing a reply
stays ours (envs/calls.py): literals only, nothing is ever evaluated.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from bfcl_eval.model_handler.local_inference.llama_3_1 import LlamaHandler_3_1
from bfcl_eval.model_handler.local_inference.qwen import QwenHandler
from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
from bfcl_eval.model_handler.utils import system_prompt_pre_processing_chat_model

import envs.bfcl.api as bfcl_api
from coevolve.records import Task, ToolCall
from envs.base import Environment, StepOutcome
from envs.bfcl.official import REVEAL_PROMPT, official_meta
from envs.calls import POSITIONAL_PREFIX

HANDLERS: tuple[str, ...] = ("qwen_fc", "qwen", "llama_3_1", "chat")
# bfcl-eval appends this to every multi-turn function description (its python-language hint).
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
# Handler instances only format text: the names below never reach a server (bfcl builds an OpenAI
# client object in the constructor, which opens no connection).
_FORMATTERS: dict[str, Any] = {}
_FORMATTER_CLASSES = {
    "qwen_fc": (QwenFCHandler, "Qwen/Qwen3-4B", "qwen3-4b-fc"),
    "qwen": (QwenHandler, "Qwen/Qwen3-4B", "qwen3-4b"),
    "llama_3_1": (LlamaHandler_3_1, "meta-llama/Llama-3.1-8B-Instruct-FC", "llama-3.1-8b-instruct-fc"),
}
# bfcl's system prompt format for entries without a format-sensitivity id (its default).
_DEFAULT_ENTRY_ID = "multi_turn_base_0"
_QWEN_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def _formatter(handler: str) -> Any:
    if handler not in _FORMATTERS:
        cls, model, registry = _FORMATTER_CLASSES[handler]
        _FORMATTERS[handler] = cls(model, 0.0, registry, handler.endswith("fc") or handler == "llama_3_1")
    return _FORMATTERS[handler]


def functions_for(task: Task) -> list[dict[str, Any]]:
    """The function docs bfcl-eval gives the model for ``task``: every doc of its classes, in class
    order, less the functions a miss_func entry reveals later, each description with the python hint."""
    meta = official_meta(task)
    held_out = {name for names in (meta.missed.values() if meta else ()) for name in names}
    docs = []
    for cls in task.involved_classes:
        for doc in bfcl_api.func_docs(cls):
            if doc["name"] in held_out:
                continue
            doc = copy.deepcopy(doc)
            doc["description"] = doc["description"] + PYTHON_HINT
            docs.append(doc)
    return docs


def reveal_text(task: Task, turn: int) -> str | None:
    """The user message of a miss_func turn that reveals held-out functions (their raw docs as a python
    list, then bfcl's sentence), or None when ``turn`` reveals nothing."""
    meta = official_meta(task)
    if meta is None or turn not in meta.missed:
        return None
    docs = {d["name"]: d for cls in task.involved_classes for d in bfcl_api.func_docs(cls)}
    revealed = [dict(docs[name]) for name in meta.missed[turn] if name in docs]
    return f"{revealed}\n{REVEAL_PROMPT}"


def _value_text(value: Any) -> str:
    """A decoded argument as bfcl writes it back into a call string (dicts of dicts read as nested calls)."""
    if isinstance(value, dict):
        if value and all(isinstance(v, dict) for v in value.values()):
            name = next(iter(value))
            inner = ", ".join(f"{k}={_value_text(v)}" for k, v in value[name].items())
            return f"{name}({inner})"
        return "{" + ", ".join(f"'{k}': {_value_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


def call_text(call: ToolCall) -> str:
    """A parsed call as bfcl's prompting handlers name it in a tool result: ``cd(folder='x')``."""
    parts = []
    for key, value in call.arguments.items():
        parts.append(_value_text(value) if key.startswith(POSITIONAL_PREFIX) else f"{key}={_value_text(value)}")
    return f"{call.name}({', '.join(parts)})"


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a reply, split at its last ``</think>`` as bfcl's Qwen handlers do."""
    if "</think>" not in text:
        return "", text
    parts = text.split("</think>")
    return parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n"), parts[-1].lstrip("\n")


def qwen_tool_calls(text: str) -> list[Any]:
    """The JSON values of a reply's ``<tool_call>`` blocks, as Qwen FC keeps them in its history
    (blocks that are not JSON are left out)."""
    found = []
    for body in _QWEN_TOOL_CALL.findall(text):
        try:
            found.append(json.loads(body))
        except ValueError:
            continue
    return found


class BfclConversation:
    """One episode's message list in a bfcl-eval handler's shape, and its prompt text.

    ``render_chat`` turns a message list into prompt text for the ``chat`` family (the model's chat
    template, generation prompt included); the other families use the handler's own formatter.
    """

    def __init__(self, handler: str, task: Task, render_chat: Callable[[list[dict[str, Any]]], str] | None = None):
        if handler not in HANDLERS:
            raise ValueError(f"unknown bfcl handler {handler!r}; choose one of {', '.join(HANDLERS)}")
        if handler == "chat" and render_chat is None:
            raise ValueError("the 'chat' bfcl handler needs the model's chat template to render its messages")
        self.handler = handler
        self.task = task
        self.functions = functions_for(task)
        self.render_chat = render_chat
        self.messages: list[dict[str, Any]] = []
        # The user turn the episode is in: the environment moves to the next one whenever a turn ends.
        self.turn = 0
        first = [{"role": "user", "content": task.turns[0]}]
        if handler in ("qwen", "chat"):
            # bfcl's system prompt (its instructions and the tools as JSON) goes first.
            first = system_prompt_pre_processing_chat_model(first, self.functions, _DEFAULT_ENTRY_ID)
        self.messages.extend(first)

    def text(self) -> str:
        """The prompt of the next step, ending where the model's reply begins."""
        if self.render_chat is not None and self.handler == "chat":  # the constructor requires it for 'chat'
            return self.render_chat(copy.deepcopy(self.messages))
        return _formatter(self.handler)._format_prompt(self.messages, self.functions)

    def add_reply(self, text: str) -> str:
        """Append the model's reply as the handler keeps it; returns the part that holds its calls."""
        if self.handler in ("qwen_fc", "qwen"):
            reasoning, answer = split_reasoning(text)
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            if self.handler == "qwen_fc":
                calls = qwen_tool_calls(text)
                if calls:
                    message = {"role": "assistant", "content": "", "tool_calls": calls}
            message["reasoning_content"] = reasoning
            self.messages.append(message)
            return answer
        self.messages.append({"role": "assistant", "content": text})
        return text

    def add_results(self, calls: Sequence[ToolCall], results: Sequence[str]) -> None:
        """Append the results of a step's calls: one tool message each, or for ``chat`` one user message
        listing them all (bfcl's prompting handlers for chat APIs)."""
        entries = [{"role": "tool", "name": call_text(c), "content": r} for c, r in zip(calls, results, strict=True)]
        if self.handler == "chat":
            self.messages.append({"role": "user", "content": repr(entries)})
        else:
            self.messages.extend(entries)

    def add_turn(self, turn: int) -> None:
        """Append the user message that opens ``turn`` (the reveal message on a miss_func turn)."""
        revealed = reveal_text(self.task, turn)
        self.messages.append({"role": "user", "content": revealed if revealed is not None else self.task.turns[turn]})

    def advance(self, reply: str, env: Environment) -> StepOutcome:
        """One step of bfcl-eval's loop: keep the reply, run its calls in ``env`` (an environment in bfcl
        loop mode), keep their results, and open the next turn when this one ended."""
        outcome = env.step(self.add_reply(reply))
        if outcome.calls:
            self.add_results(outcome.calls, outcome.observations)
        if outcome.turn_ended and not outcome.done:
            self.turn += 1
            self.add_turn(self.turn)
        return outcome
