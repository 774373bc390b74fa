"""What every synthesizer shares: the guidance per target kind, the Synthesizer protocol, the outer loop over signals.

The programmatic synthesizer (tasks/synthesize.py) and the LLM synthesizer (tasks/synthesis/llm_synthesis.py)
both build on this module; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tqdm.auto import tqdm

from coevolve.config import SynthesisConfig
from coevolve.records import Candidate, Provenance, Signal, Task
from coevolve.signals import signal_kind
from envs.registry import environment_for

# The random control's target is no signal: what its context says in place of a kind's guidance and meaning.
RANDOM_GUIDANCE = "Explore uniformly drawn tools from a uniformly drawn state (control arm)."
RANDOM_MEANING = "no signal: this target was drawn uniformly at random (control arm)"


def guidance(kind: str) -> str:
    """The exploration objective for a target of ``kind`` (a signal kind's, or the random control's)."""
    return RANDOM_GUIDANCE if kind == "random" else signal_kind(kind).guidance


def meaning(kind: str) -> str:
    """What a target of ``kind`` says about its task, for the LLM synthesizer."""
    return RANDOM_MEANING if kind == "random" else signal_kind(kind).meaning


class Synthesizer(Protocol):
    """Turns signals into candidate tasks: context, re-exploration, abstraction.

    Returns the candidates and, per signal id, the record of how they were made (at least the
    signal-conditioned context). Never raises on bad data: a broken exploration or malformed model
    output is skipped with a reason; only InfrastructureError escapes, for Prefect to retry.
    """

    name: str

    def synthesize(
        self,
        signals: list[Signal],
        tasks_by_id: dict[str, Task],
        tool_sequences: dict[str, list[str]],
        config: SynthesisConfig,
        round_: int,
        seed: int,
        progress: bool = True,
    ) -> tuple[list[Candidate], dict[str, dict[str, Any]]]: ...


def tools_of(task: Task) -> list[str]:
    """The names of the tools ``task`` can call, as its environment lists them."""
    env = environment_for(task)
    env.reset(task)
    return env.tool_names()


def provenance_of(signal: Signal, round_: int) -> Provenance:
    """Where a task made from ``signal`` comes from; a random target has no parent trajectory."""
    return Provenance(
        origin=signal.kind,
        round=round_,
        parent_trajectory_id=None if signal.kind == "random" else signal.trajectory_id,
        signal_id=signal.signal_id,
    )


def synthesize_each(
    signals: list[Signal],
    tasks_by_id: dict[str, Task],
    tool_sequences: dict[str, list[str]],
    for_signal: Callable[[Signal, Task, list[str]], tuple[list[Task], dict[str, Any]]],
    progress: bool = True,
    desc: str = "synthesize",
) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
    """Every synthesizer's outer loop: ``for_signal(signal, task, tool_sequence)`` on each signal whose task is in
    the pool.

    Returns the candidates and, per signal id, the record ``for_signal`` returned.
    """
    candidates: list[Candidate] = []
    records: dict[str, dict[str, Any]] = {}
    # disable=None: drawn only when stderr is a terminal, so a log file or a pipe gets no bar.
    for signal in tqdm(signals, desc=desc, unit="signal", disable=None if progress else True, leave=False):
        task = tasks_by_id.get(signal.task_id)
        if task is None:
            continue
        made, record = for_signal(signal, task, tool_sequences.get(signal.trajectory_id, []))
        records[signal.signal_id] = record
        candidates += [Candidate(task=new, signal_id=signal.signal_id) for new in made]
    return candidates, records
