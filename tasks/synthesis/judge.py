"""The optional LLM judge of validation: a chat model checks a replayed candidate on five criteria.

The criteria are the paper's: API matching (the calls fit the query), parameter usage (the
arguments are the ones the query names), logical flow (the order makes sense), final result (the
last state or answer is what the query asks for), and failed or skipped steps (none). The judge sees
the query, each reference call with the observation it produced in a fresh environment, and
replies with a JSON verdict and reason. An unreadable reply or a refused request rejects the
candidate with that reason, so only tasks the judge explicitly accepts pass. Off by default
(``validation.llm_judge``); it uses the synthesis.llm_* endpoint.
"""

from __future__ import annotations

from collections.abc import Callable

from coevolve.config import SynthesisConfig
from coevolve.records import Task, Verdict
from envs.registry import environment_for
from tasks.synthesis.llm_client import ChatClient, LLMRequestError
from tasks.synthesis.llm_replies import extract_json_object
from tasks.synthesis.llm_synthesis import Chat

CRITERIA = ("api_matching", "parameter_usage", "logical_flow", "final_result", "failed_or_skipped_steps")
_ACCEPT = {"accept", "accepted", "pass", "passed", "valid", "yes", "true"}
_REJECT = {"reject", "rejected", "fail", "failed", "invalid", "no", "false"}


def judge_messages(task: Task, observations: list[str]) -> list[dict[str, str]]:
    calls = [c for turn in task.reference for c in turn]
    steps = "\n".join(
        f"{i + 1}. {c.render()} -> {o[:200]}" for i, (c, o) in enumerate(zip(calls, observations, strict=True))
    )
    user = "\n".join(
        [
            f"User request: {' / '.join(task.turns)[:800]}",
            "Reference solution, executed from the initial state:",
            steps,
            "",
            "Judge whether the reference solution correctly and completely solves the request. Check:",
            "api_matching: the called tools are the ones the request needs;",
            "parameter_usage: every argument is the value the request names or the environment returned;",
            "logical_flow: the calls come in an order that makes sense;",
            "final_result: the final state or answer is what the request asks for;",
            "failed_or_skipped_steps: no call failed and no needed step is missing.",
            'Reply with one JSON object: {"verdict": "accept" or "reject", "reason": "<one sentence>", '
            '"api_matching": true/false, "parameter_usage": true/false, "logical_flow": true/false, '
            '"final_result": true/false, "failed_or_skipped_steps": true/false}',
        ]
    )
    system = "You are a strict reviewer of training tasks for tool-using agents. Answer with JSON only."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_judgement(text: str) -> Verdict:
    """The judge's verdict; an unreadable reply is a rejection that says why."""
    obj, error = extract_json_object(text)
    if obj is None:
        return Verdict(False, f"llm judge: unreadable reply ({error})")
    raw = obj.get("verdict")
    word = str(raw).strip().lower() if isinstance(raw, (str, bool)) else ""
    if word not in _ACCEPT | _REJECT:
        return Verdict(False, f"llm judge: no accept/reject verdict (got {raw!r})")
    reason = obj.get("reason")
    reason = reason.strip() if isinstance(reason, str) and reason.strip() else "no reason given"
    failed = [c for c in CRITERIA if obj.get(c) is False]
    detail = f"{reason[:300]}" + (f" (criteria not met: {', '.join(failed)})" if failed else "")
    return Verdict(word in _ACCEPT, f"llm judge: {detail}")


def make_llm_judge(chat: Chat) -> Callable[[Task], Verdict]:
    """A judge function for tasks.validate.validate_candidates."""

    def judge(task: Task) -> Verdict:
        env = environment_for(task)
        env.reset(task)
        observations = [o for turn in task.reference for o in env.execute(turn)]
        try:
            reply = chat.complete(judge_messages(task, observations), temperature=0.0, seed=0)
        except LLMRequestError as exc:
            return Verdict(False, f"llm judge: {exc}")
        return parse_judgement(reply)

    return judge


def judge_from_config(config: SynthesisConfig) -> Callable[[Task], Verdict]:
    return make_llm_judge(ChatClient.from_config(config))


__all__ = ["CRITERIA", "judge_from_config", "judge_messages", "make_llm_judge", "parse_judgement"]
