"""The LLM synthesizer: a chat model on an OpenAI-compatible endpoint reflects, explores and writes tasks.

For each signal (``synthesis.synthesizer = "llm"``):

1. **Context.** The model reads the signal's evidence and writes a JSON context: summary, failure
   cause, instability pattern, focus patterns (tool names), exploration objectives, do-not-repeat.
2. **Re-exploration.** ``explorations_per_signal`` independent runs, each up to
   ``steps_per_exploration`` steps, from the task's initial state. At every step the model sees the
   context, the kind's guidance, the tools and the run's observations so far, and proposes the next
   call. The call is parsed with envs.calls.parse_tool_calls (AST/JSON literals only, whitelisted
   names) and executed in the task's environment (`Environment.explore_call`); (action, observation,
   run) triplets are recorded. Model output never reaches eval or exec.
3. **Abstraction.** The environment's ``abstract`` cuts each run to a minimal action sequence that replays
   from the initial state (at least ``min_task_steps`` calls); the model then writes the task's
   description and query from that sequence.

Every malformed reply (no JSON, missing keys, invented tools, unparseable or failing calls, empty
queries) is rejected with a reason in the signal's context record and the synthesis goes on; a
refused request (HTTP 4xx) is a rejection too. Only a lost endpoint (InfrastructureError) stops the
stage, so Prefect retries it. The prompts are written for any instruction-tuned chat model.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any, Protocol

from coevolve.config import SynthesisConfig
from coevolve.records import Candidate, Provenance, Signal, Task, ToolCall
from envs.base import Environment, Triplet
from envs.registry import environment_for
from tasks.synthesis.llm_client import LLMRequestError
from tasks.synthesis.llm_replies import parse_abstraction, parse_context, parse_next_call
from tasks.synthesis.synthesis_base import guidance, meaning, provenance_of, synthesize_each, tools_of


class Chat(Protocol):
    """What the synthesizer needs from a chat endpoint (tasks.synthesis.llm_client.ChatClient)."""

    def complete(
        self, messages: list[dict[str, str]], temperature: float | None = None, seed: int | None = None
    ) -> str: ...


# -- prompts -----------------------------------------------------------------------------------------
def context_messages(signal: Signal, task: Task, tool_sequence: list[str], tools: list[str]) -> list[dict[str, str]]:
    reference = "; ".join(c.render() for turn in task.reference for c in turn)
    user = "\n".join(
        [
            f"Signal: {signal.kind} ({meaning(signal.kind)}).",
            f"Evidence: {json.dumps(signal.evidence, ensure_ascii=False)[:600]}",
            f"Task the agent played: {(task.description or task.turns[0])[:400]}",
            f"Reference calls of that task: {reference[:600]}",
            f"Tools the agent called in the marked trajectory: {' > '.join(tool_sequence) or '(none)'}",
            f"Available tools: {', '.join(tools)}",
            f"Exploration guidance for this signal: {guidance(signal.kind)}",
            "",
            "Reply with one JSON object with exactly these keys:",
            '"summary": one sentence on what the evidence shows;',
            '"failure_cause": the most likely reason for the failure or instability;',
            '"instability_pattern": which tools or steps make the outcome unstable;',
            '"focus_patterns": a list of tool names from the available tools to explore next;',
            '"exploration_objectives": a list of concrete things to try in the environment;',
            '"do_not_repeat": a list of calls or tasks that are already covered.',
        ]
    )
    system = (
        "You study an agent's rollouts in a tool environment and plan where to explore next. Answer with JSON only."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def step_messages(
    kind: str, context: dict[str, Any], tool_lines: list[str], history: list[tuple[str, str]], step: int, steps: int
) -> list[dict[str, str]]:
    done = "\n".join(f"{i + 1}. {call} -> {obs[:160]}" for i, (call, obs) in enumerate(history)) or "(none yet)"
    user = "\n".join(
        [
            f"Objectives: {' '.join(context['exploration_objectives'])[:600]}",
            f"Focus tools: {', '.join(context['focus_patterns'])}",
            f"Guidance: {guidance(kind)}",
            f"Do not repeat: {'; '.join(context['do_not_repeat'])[:400] or '(nothing)'}",
            "Tools:",
            *tool_lines,
            f"Calls so far in this run and their results:\n{done}",
            f"Propose call {step + 1} of at most {steps}: one call such as [tool_name(arg='value')], or DONE.",
        ]
    )
    system = (
        "You explore a tool environment to find new, realistic tasks for training an agent. "
        "Reply with exactly one python-style tool call in a list, using literal arguments, or with DONE."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def abstraction_messages(
    kind: str, context: dict[str, Any], calls: list[ToolCall], observations: list[str]
) -> list[dict[str, str]]:
    steps = "\n".join(
        f"{i + 1}. {c.render()} -> {o[:160]}" for i, (c, o) in enumerate(zip(calls, observations, strict=True))
    )
    user = "\n".join(
        [
            f"An exploration guided by a {kind} signal ({context['summary'][:300]}) executed these calls from the "
            "initial state:",
            steps,
            "",
            "Write the task a user would give so that exactly these calls, in this order, complete it.",
            "Name every value the calls need; say what the finished state or answer is (the completion criterion).",
            'Reply with one JSON object: {"description": "<one sentence for the task catalogue>", '
            '"query": "<the user\'s request>"}',
        ]
    )
    system = "You turn tool-call sequences into natural user requests. Answer with JSON only."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# -- the synthesizer ---------------------------------------------------------------------------------
class LLMSynthesizer:
    """Implements tasks.synthesis.synthesis_base.Synthesizer with a chat model; see the module docstring."""

    name = "llm"

    def __init__(self, chat: Chat):
        self.chat = chat

    def _ask(self, messages: list[dict[str, str]], seed: int) -> tuple[str | None, str | None]:
        try:
            return self.chat.complete(messages, seed=seed), None
        except LLMRequestError as exc:
            return None, str(exc)

    def synthesize(
        self,
        signals: list[Signal],
        tasks_by_id: dict[str, Task],
        tool_sequences: dict[str, list[str]],
        config: SynthesisConfig,
        round_: int,
        seed: int,
        progress: bool = True,
    ) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
        """Candidates for every signal, and per signal its context, explorations and rejections."""

        def for_signal(signal: Signal, task: Task, tool_sequence: list[str]) -> tuple[list[Task], dict[str, Any]]:
            return self.for_signal(signal, task, tool_sequence, config, round_, seed)

        return synthesize_each(signals, tasks_by_id, tool_sequences, for_signal, progress, desc="synthesize (llm)")

    def for_signal(
        self, signal: Signal, task: Task, tool_sequence: list[str], config: SynthesisConfig, round_: int, seed: int
    ) -> tuple[list[Task], dict[str, Any]]:
        """Tasks from one signal and the record of how they were made (context, runs, rejections)."""
        rng = random.Random(f"{seed}:{round_}:{signal.signal_id}")
        tools = tools_of(task)
        record: dict[str, Any] = {"synthesizer": self.name, "context": None, "explorations": [], "rejections": []}
        reply, refused = self._ask(context_messages(signal, task, tool_sequence, tools), rng.randrange(2**31))
        context, reason = (None, f"context: {refused}") if reply is None else parse_context(reply, tools)
        if context is None:
            record["rejections"].append(reason)
            return [], record
        record["context"] = context
        provenance = provenance_of(signal, round_)
        made: list[Task] = []
        for run in range(config.explorations_per_signal):
            run_id = f"{signal.signal_id}#{run}"
            triplets, rejections = self.explore(
                signal.kind, task, context, tools, config.steps_per_exploration, rng, run_id
            )
            record["explorations"].append(
                {
                    "run": run_id,
                    "actions": [[t.action.render(), t.ok] for t in triplets],
                    "rejected_steps": len(rejections),
                }
            )
            record["rejections"] += [f"run {run}: {r}" for r in rejections]
            new, reason = self.abstract(signal.kind, task, context, triplets, provenance, config, rng)
            if new is None:
                record["rejections"].append(f"run {run}: {reason}")
            else:
                made.append(new)
        return made, record

    def explore(
        self,
        kind: str,
        task: Task,
        context: dict[str, Any],
        tools: list[str],
        steps: int,
        rng: random.Random,
        run_id: str,
    ) -> tuple[list[Triplet], list[str]]:
        """One multi-step run: the model proposes each call after seeing the previous observations."""
        env = environment_for(task)
        env.reset(task)
        lines = env.tool_signatures(task)
        triplets: list[Triplet] = []
        rejections: list[str] = []
        history: list[tuple[str, str]] = []
        for step in range(steps):
            reply, refused = self._ask(step_messages(kind, context, lines, history, step, steps), rng.randrange(2**31))
            if reply is None:
                rejections.append(f"step {step}: {refused}")
                continue
            triplet, done, reason = run_step(env, reply, tools, run_id)
            if done:
                break
            if triplet is None:
                rejections.append(f"step {step}: {reason}")
                history.append((reply.strip()[:80], f"rejected: {reason}"))
                continue
            triplets.append(triplet)
            history.append((triplet.action.render(), triplet.observation))
            if reason is not None:
                rejections.append(f"step {step}: {reason}")
        return triplets, rejections

    def abstract(
        self,
        kind: str,
        task: Task,
        context: dict[str, Any],
        triplets: list[Triplet],
        provenance: Provenance,
        config: SynthesisConfig,
        rng: random.Random,
    ) -> tuple[Task | None, str | None]:
        """The run's minimal replayable sequence, with a description and query the model writes."""
        env = environment_for(task)
        minimal = env.abstract(
            triplets,
            task,
            provenance,
            min_steps=config.min_task_steps,
            max_steps=config.max_task_steps,
        )
        if minimal is None:
            usable = sum(1 for t in triplets if t.ok)
            return None, f"fewer than {config.min_task_steps} usable calls ({usable} succeeded of {len(triplets)})"
        calls = minimal.reference[0]
        env.reset(minimal)
        observations = env.execute(calls)
        reply, refused = self._ask(abstraction_messages(kind, context, calls, observations), rng.randrange(2**31))
        if reply is None:
            return None, f"query: {refused}"
        return write_query(minimal, reply)


def run_step(env: Environment, reply: str, tools: list[str], run_id: str) -> tuple[Triplet | None, bool, str | None]:
    """Parse one exploration reply and execute its call in ``env`` (an environment after reset).

    Returns (triplet, the run is done, reason). A reply that does not parse or names an unknown
    tool executes nothing (triplet None, with the reason); a call that runs but fails is kept as a
    triplet (the model sees the error next step) and the reason says so.
    """
    call, done, reason = parse_next_call(reply, tools)
    if call is None:
        return None, done, reason
    triplet = env.explore_call(call, run_id)
    failed = None if triplet.ok else f"{call.render()[:120]} failed: {triplet.observation[:160]}"
    return triplet, False, failed


def write_query(minimal: Task, reply: str) -> tuple[Task | None, str | None]:
    """The abstracted task with the model's description and query, or the reason the reply is rejected."""
    written, reason = parse_abstraction(reply)
    if written is None:
        return None, reason
    return replace(minimal, turns=[written["query"]], description=written["description"]), None
