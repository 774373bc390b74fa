"""LLM synthesis against a real OpenAI-compatible server (vLLM CPU, tiny model from tests/conftest.py).

A tiny model writes mostly garbage: these tests show that every garbage reply is rejected with a
reason, that whatever the model proposes is parsed and executed safely, and that synthesis goes on.
"""

import random
from dataclasses import dataclass, field

import pytest

from coevolve.config import SynthesisConfig
from coevolve.records import Signal
from envs.bfcl.explorer import build_tasks
from tasks.synthesis.llm_client import ChatClient, LLMRequestError
from tasks.synthesis.llm_replies import parse_next_call
from tasks.synthesis.llm_synthesis import LLMSynthesizer
from tasks.synthesize import tools_of
from tasks.validate import validate_candidates
from tests.conftest import SERVED_EXCHANGES, SERVED_SYSTEM

pytestmark = pytest.mark.slow


@dataclass
class RecordingClient(ChatClient):
    """The real client, keeping every reply it got (None for a request the server refused)."""

    replies: list[str | None] = field(default_factory=list)

    def complete(self, messages, temperature=None, seed=None) -> str:
        self.replies.append(None)
        self.replies[-1] = reply = super().complete(messages, temperature=temperature, seed=seed)
        return reply


@pytest.fixture(scope="module")
def chat(openai_server):
    return ChatClient(openai_server.base_url, openai_server.model, temperature=0.9, max_tokens=48, timeout_s=120)


@pytest.fixture(scope="module")
def task():
    return build_tasks(1, seed=3, classes=["GorillaFileSystem"])[0]


def test_the_client_returns_the_models_reply_text(chat):
    """The served policy learned this exchange (tests/conftest.py): greedy, it answers with the learned calls."""
    messages = [{"role": "system", "content": SERVED_SYSTEM}, {"role": "user", "content": "make a folder logs"}]
    reply = chat.complete(messages, temperature=0.0, seed=0)
    assert reply == dict(SERVED_EXCHANGES)["make a folder logs"]


def test_a_request_the_server_refuses_is_a_request_error_not_a_crash(chat):
    too_long = [{"role": "user", "content": "mkdir " * 5000}]
    with pytest.raises(LLMRequestError):
        chat.complete(too_long)


def test_garbage_from_a_tiny_model_is_rejected_with_reasons_and_synthesis_goes_on(chat, task):
    signals = [
        Signal("run", 1, "boundary", f"run/r1/{task.task_id}/s0", task.task_id, {"group_rewards": [1.0, 0.0]}),
        Signal(
            "run", 1, "rare", f"run/r1/{task.task_id}/s1", task.task_id, {"pattern": "ls>cd", "count": 1, "total": 40}
        ),
    ]
    config = SynthesisConfig(synthesizer="llm", llm_model="m", explorations_per_signal=1, steps_per_exploration=3)
    candidates, records = LLMSynthesizer(chat).synthesize(
        signals, {task.task_id: task}, {}, config, 1, 0, progress=False
    )
    assert set(records) == {s.signal_id for s in signals}
    for signal in signals:
        record = records[signal.signal_id]
        made = [c for c in candidates if c.signal_id == signal.signal_id]
        assert made or record["rejections"], "a signal without candidates must say why"
        assert all(isinstance(r, str) and r for r in record["rejections"])
    judged = validate_candidates(candidates, [], set(), config)
    assert all(c.verdict is not None for c in judged)


def test_every_step_the_model_proposes_is_executed_or_rejected(chat, task):
    tools = tools_of(task)
    context = {
        "summary": "probe",
        "failure_cause": "none",
        "instability_pattern": "none",
        "focus_patterns": ["mkdir", "cd", "touch"],
        "exploration_objectives": ["make a folder and enter it"],
        "do_not_repeat": [],
    }

    recording = RecordingClient(chat.base_url, chat.model, temperature=0.9, max_tokens=48, timeout_s=120)
    triplets, rejections = LLMSynthesizer(recording).explore(
        "boundary", task, context, tools, 4, random.Random(0), "probe#0"
    )
    # Each step asks the model once; its reply ends the run (DONE), is executed (a triplet, and a rejection too
    # when the call fails) or is rejected with its step's reason.
    replies = recording.replies
    ended = next((i for i, r in enumerate(replies) if r is not None and parse_next_call(r, tools)[1]), None)
    steps = 4 if ended is None else ended
    assert len(replies) == (4 if ended is None else ended + 1)
    executed_or_rejected = len(triplets) + sum(1 for r in rejections if "failed:" not in r)
    assert executed_or_rejected == steps
    parsed = [r is not None and parse_next_call(r, tools)[0] is not None for r in replies[:steps]]
    assert len(triplets) == sum(parsed)
    assert all(t.action.name in tools for t in triplets)
