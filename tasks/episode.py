"""One rollout episode: its token segments, and how one model message and the environment's reply advance it.

tasks/rollout.py plays many at once; its docstring says which segment holds which tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent.engine import Engine
from coevolve.config import EnvironmentConfig
from coevolve.records import Segment, Step, Task, Trajectory
from envs.base import Conversation, Environment


@dataclass
class Episode:
    task: Task
    sample: int
    env: Environment
    prompt_ids: list[int]
    seed: int | None = None
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    turn: int = 0
    finish_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)
    duration_s: float = 0.0
    # Prompts the environment writes itself (prompt_style 'bfcl': bfcl-eval's conversation), and the episode's
    # segments before the one being built (prompt_ids .. logprobs above hold that one; tasks/rollout.py's docstring).
    conversation: Conversation | None = None
    closed_segments: list[Segment] = field(default_factory=list)

    @property
    def context_ids(self) -> list[int]:
        """What the model is given for its next message: the current segment's prompt and completion."""
        return self.prompt_ids + self.completion_ids

    def start_segment(self, prompt_ids: list[int]) -> None:
        """Close the current segment and start one whose prompt is ``prompt_ids``."""
        self.closed_segments.append(Segment(self.prompt_ids, self.completion_ids, self.completion_mask, self.logprobs))
        self.prompt_ids, self.completion_ids, self.completion_mask, self.logprobs = list(prompt_ids), [], [], []

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.duration_s = time.perf_counter() - self.started


def _append_generation(episode: Episode, generation) -> None:
    """The model's tokens of this step join the episode's current segment, trained (mask 1)."""
    episode.completion_ids.extend(generation.token_ids)
    episode.completion_mask.extend([1] * len(generation.token_ids))
    episode.logprobs.extend(float(x) for x in generation.logprobs)


def _append_environment(episode: Episode, ids: list[int]) -> None:
    """Tokens the environment adds to the context (results, the next user turn): in the segment, never trained."""
    episode.completion_ids.extend(ids)
    episode.completion_mask.extend([0] * len(ids))
    episode.logprobs.extend([0.0] * len(ids))


def _goes_on(episode: Episode, outcome, env_config: EnvironmentConfig) -> bool:
    """Ends the episode when the environment says done or it ran out of steps; moves to the next turn when one ended."""
    if outcome.done:
        episode.finish("done")
        return False
    if outcome.turn_ended:
        episode.turn += 1
    if len(episode.steps) >= env_config.max_steps:
        episode.finish("max_steps")
        return False
    return True


def _advance_conversation(
    engine: Engine,
    episode: Episode,
    conversation: Conversation,
    generation,
    env_config: EnvironmentConfig,
    max_context_tokens,
    max_new_tokens,
) -> None:
    """One step of an episode in the environment's own conversation, bfcl-eval's for prompt_style 'bfcl' (which
    segment holds which tokens: tasks/rollout.py)."""
    _append_generation(episode, generation)
    # Kept as the model wrote it (not stripped): bfcl-eval keeps the server's text in its history.
    text = engine.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    step = Step(
        turn=episode.turn, index=len(episode.steps), model_text=text, completion_tokens=len(generation.token_ids)
    )
    episode.steps.append(step)
    if generation.finish_reason == "length":
        step.error = "message hit the token limit"
        episode.finish("length")
        return
    outcome = conversation.advance(text, episode.env)
    step.calls, step.observations, step.error = list(outcome.calls), list(outcome.observations), outcome.error
    if not _goes_on(episode, outcome, env_config):
        return
    prompt = engine.chat.encode(conversation.text())
    context = episode.context_ids
    if prompt[: len(context)] == context:
        _append_environment(episode, prompt[len(context) :])
    else:
        episode.start_segment(prompt)
    if max_context_tokens is not None and len(prompt) + max_new_tokens > max_context_tokens:
        episode.finish("length")


def advance_episode(
    engine: Engine, episode: Episode, generation, env_config: EnvironmentConfig, max_context_tokens, max_new_tokens
) -> None:
    if episode.conversation is not None:
        _advance_conversation(
            engine, episode, episode.conversation, generation, env_config, max_context_tokens, max_new_tokens
        )
        return
    _append_generation(episode, generation)
    text = engine.tokenizer.decode(generation.token_ids, skip_special_tokens=True).strip()

    if generation.finish_reason == "length":
        episode.steps.append(
            Step(
                turn=episode.turn,
                index=len(episode.steps),
                model_text=text,
                error="message hit the token limit",
                completion_tokens=len(generation.token_ids),
            )
        )
        episode.finish("length")
        return

    outcome = episode.env.step(text)
    episode.steps.append(
        Step(
            turn=episode.turn,
            index=len(episode.steps),
            model_text=text,
            calls=list(outcome.calls),
            observations=list(outcome.observations),
            error=outcome.error,
            completion_tokens=len(generation.token_ids),
        )
    )
    if outcome.error and not outcome.calls and outcome.error.startswith("unparseable"):
        episode.finish("error")
        return
    if not _goes_on(episode, outcome, env_config):
        return
    _append_environment(episode, engine.chat.continuation_ids(list(outcome.messages)))
    if max_context_tokens is not None and len(episode.context_ids) + max_new_tokens > max_context_tokens:
        episode.finish("length")


def to_trajectory(episode: Episode, run_id: str, round_: int) -> Trajectory:
    if episode.finish_reason == "done":
        reward, success, _ = episode.env.score()
    else:
        reward, success = 0.0, False
    current = Segment(episode.prompt_ids, episode.completion_ids, episode.completion_mask, episode.logprobs)
    segments = [*episode.closed_segments, current]
    if not current.completion_ids and episode.closed_segments:
        segments.pop()  # started by the last step's prompt, and the episode ended before a reply to it
    first, *later = segments
    return Trajectory(
        run_id=run_id,
        round=round_,
        task_id=episode.task.task_id,
        sample=episode.sample,
        steps=episode.steps,
        prompt_ids=first.prompt_ids,
        completion_ids=first.completion_ids,
        completion_mask=first.completion_mask,
        logprobs=first.logprobs,
        reward=float(reward),
        success=bool(success),
        finish_reason=episode.finish_reason or "error",
        duration_s=round(episode.duration_s, 4),
        later_segments=later,
    )
