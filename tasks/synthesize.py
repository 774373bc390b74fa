"""Synthesis stage: explore the environment where signals point and abstract what was found into tasks.

For each selected signal the programmatic synthesizer (the offline default, no LLM):
1. writes a signal-conditioned context: summary, failure cause, instability pattern, focus
   patterns, exploration objectives and what not to repeat, from the signal's evidence;
2. runs several independent explorations (multi-round), each several environment steps long
   (multi-step), from the signal's task's initial state, focused on the context's tools;
3. abstracts each exploration's (action, observation, run) triplets into a task with a
   minimal reference sequence and a templated query.

The random control (``synthesis.mode = "random"``) draws the same number of exploration
targets uniformly from the pool and the tools, with everything else unchanged.

Both synthesizers implement the ``Synthesizer`` protocol; ``synthesis.synthesizer`` picks one:
"programmatic" (this file) or "llm" (tasks/synthesis/llm_synthesis.py, any OpenAI-compatible endpoint).
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from coevolve.config import PipelineConfig, SynthesisConfig
from coevolve.errors import DataError
from coevolve.records import Candidate, Provenance, Signal, Task
from coevolve.signals import signal_kind
from coevolve.stages import SynthesizeInput, SynthesizeOutput
from envs.registry import environment_for, make_environment
from tasks.registry import stage
from tasks.synthesis.llm_client import ChatClient
from tasks.synthesis.llm_synthesis import LLMSynthesizer
from tasks.synthesis.synthesis_base import Synthesizer, guidance, provenance_of, synthesize_each, tools_of

if TYPE_CHECKING:
    from storage.warehouse import Warehouse


def build_context(signal: Signal, task: Task, tool_sequence: list[str], known_tools: list[str]) -> dict[str, Any]:
    """The signal-conditioned context that steers exploration, built from the signal's evidence."""
    reference_tools = task.tools
    used = [t for t in tool_sequence if t in known_tools]
    if signal.kind == "random":
        cause = "none: the target was drawn uniformly (control arm)"
        focus = [t for t in signal.evidence.get("focus_tools", []) if t in known_tools] or reference_tools
    else:
        cause, focus = signal_kind(signal.kind).context(signal, task, used, known_tools)
    missing = [t for t in reference_tools if t not in used]
    return {
        "summary": f"{signal.kind} signal on task {task.task_id}: {task.description or task.turns[0][:120]}",
        "failure_cause": cause,
        "instability_pattern": {"called": used, "reference": reference_tools, "missed": missing},
        "focus_patterns": focus,
        "exploration_objectives": guidance(signal.kind),
        "do_not_repeat": [[c.render() for c in turn] for turn in task.reference],
    }


def _explore_and_abstract(
    task: Task, focus: list[str], provenance: Provenance, config: SynthesisConfig, rng: random.Random, run_prefix: str
) -> list[Task]:
    made: list[Task] = []
    env = environment_for(task)
    for run in range(config.explorations_per_signal):
        try:
            triplets = env.explore(
                task, rng, config.steps_per_exploration, focus_tools=focus, run_id=f"{run_prefix}#{run}"
            )
            new = env.abstract(
                triplets,
                task,
                provenance,
                min_steps=config.min_task_steps,
                max_steps=config.max_task_steps,
            )
        except Exception as exc:  # noqa: BLE001 - one broken exploration must not end the round
            logging.getLogger(__name__).warning(
                "exploration %s#%d failed: %s: %s", run_prefix, run, type(exc).__name__, exc
            )
            continue
        if new is not None:
            made.append(new)
    return made


def synthesize_from_signals(
    signals: list[Signal],
    tasks_by_id: dict[str, Task],
    tool_sequences: dict[str, list[str]],
    config: SynthesisConfig,
    round_: int,
    seed: int,
    progress: bool = True,
) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
    """Candidates for every signal, and the context each signal's exploration followed."""

    def for_signal(signal: Signal, task: Task, tool_sequence: list[str]) -> tuple[list[Task], dict[str, Any]]:
        context = build_context(signal, task, tool_sequence, tools_of(task))
        rng = random.Random(f"{seed}:{round_}:{signal.signal_id}")
        made = _explore_and_abstract(
            task, context["focus_patterns"], provenance_of(signal, round_), config, rng, signal.signal_id
        )
        return made, context

    return synthesize_each(signals, tasks_by_id, tool_sequences, for_signal, progress)


class ProgrammaticSynthesizer:
    """The offline synthesizer: evidence-built contexts, focused random walks, templated queries."""

    name = "programmatic"

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
        return synthesize_from_signals(signals, tasks_by_id, tool_sequences, config, round_, seed, progress)


def make_synthesizer(config: SynthesisConfig) -> Synthesizer:
    """The synthesizer ``config.synthesizer`` names."""
    if config.synthesizer == "llm":
        return LLMSynthesizer(ChatClient.from_config(config))
    return ProgrammaticSynthesizer()


def random_targets(pool: list[Task], count: int, round_: int, seed: int) -> list[Signal]:
    """The control arm's ``count`` exploration targets: a uniformly drawn pool task and 2-3 of its tools each.

    They are Signals of kind "random" (signal id ``random:<round>:<i>``), so every synthesizer
    spends exactly the same volume on them as on ``count`` mined signals.
    """
    rng = random.Random(f"{seed}:{round_}:random")
    targets: list[Signal] = []
    for i in range(count if pool else 0):
        task = rng.choice(pool)
        tools = tools_of(task)
        focus = rng.sample(tools, k=min(len(tools), rng.randint(2, 3)))
        targets.append(Signal("", round_, "random", f"{round_}:{i}", task.task_id, {"focus_tools": focus}))
    return targets


def synthesize_targets(
    targets: list[Signal],
    pool: list[Task],
    config: SynthesisConfig,
    round_: int,
    seed: int,
    progress: bool = True,
    synthesizer: Synthesizer | None = None,
    tool_sequences: dict[str, list[str]] | None = None,
) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
    """Candidates and records for mined signals or random targets, with the configured synthesizer."""
    chosen = synthesizer or make_synthesizer(config)
    return chosen.synthesize(
        targets, {t.task_id: t for t in pool}, tool_sequences or {}, config, round_, seed, progress
    )


# --- Prefect task -------------------------------------------------------------------------------


@stage("synthesize", retries=2, retry_delay_seconds=2)
def synthesize_stage(config: PipelineConfig, wh: Warehouse, inputs: SynthesizeInput) -> SynthesizeOutput:
    """Candidates for the round (``candidates``: dicts of task and signal_id) and how each was made (``contexts``).

    They come from the selected signals, as the mine stage stored them, or from the random control.
    """
    round_, selected = inputs.round_, inputs.selected
    pool = wh.pool(config.run_id, round_)
    sequences: dict[str, list[str]] = {}
    if config.synthesis.mode == "off":
        get_run_logger().info("round %d: synthesis is off; the pool stays static", round_)
        return SynthesizeOutput(candidates=[], contexts={})
    if config.synthesis.mode == "random":
        targets = random_targets(pool, len(selected), round_, config.seed)
    else:
        stored = {s.signal_id: s for s in wh.signals(config.run_id, round_)}
        missing = [sid for sid in selected if sid not in stored]
        if missing:
            raise DataError(
                f"Round {round_} selected {len(missing)} signal(s) the warehouse does not hold (e.g. {missing[0]}); "
                f"run the round again from its mine stage (`coevolve round --round {round_}` after clearing it)."
            )
        targets = [stored[sid] for sid in selected]
        sequences = wh.tool_sequences(config.run_id, round_)
    candidates, contexts = synthesize_targets(
        targets, pool, config.synthesis, round_, config.seed, tool_sequences=sequences
    )
    if config.synthesis.synthesizer == "programmatic":
        # New tasks join the target distribution: the same job spread over user turns as D_0's tasks.
        env = make_environment(config.environment)
        candidates = [replace(c, task=env.in_turns(c.task, config.pool.calls_per_turn)) for c in candidates]
    rejections = sum(len(c.get("rejections", [])) for c in contexts.values())
    get_run_logger().info(
        "round %d: %s synthesizer, %d candidates from %d targets (%d rejected model replies)",
        round_,
        config.synthesis.synthesizer,
        len(candidates),
        len(targets),
        rejections,
    )
    return SynthesizeOutput(
        candidates=[{"task": c.task.to_dict(), "signal_id": c.signal_id} for c in candidates], contexts=contexts
    )
