"""The contract of a failure signal kind: what the mine stage computes, and what synthesis and the reports need.

A kind is one module under coevolve/signals/ (or in a package of its own, declared under the entry-point group
``coevolve.signals``) holding one `SignalKind` subclass; coevolve/signals/registry.py lists them. Everything else
follows from the registry: the ``signals`` configuration block (``enabled`` and each kind's thresholds), the
round table's and the report's ``signals f/b/r`` columns, the leave-one-out ablation arms (``no-<name>``), the
``new_<name>`` columns of ``v_pool_growth``, the synthesis context's failure cause and exploration objective,
and the LLM synthesizer's wording. docs/extending.md shows a kind written from scratch.

Mining works on Polars frames of the run's trajectories (columns trajectory_id, task_id, sample, reward,
tool_sequence; tasks/mine.py). A kind may ask for aggregations over the earlier rounds (``history_plans``):
every kind's plans are collected together in one pass over the warehouse's files, and each kind then marks
this round's trajectories (``fire``) from this round's rows and its collected history.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from coevolve.records import Signal, Task

if TYPE_CHECKING:
    import polars as pl

# A kind's name is stored in signals.kind and tasks' provenance.origin, spelled in run ids (no-<name>) and in
# the SQL column new_<name>: a lowercase word.
NAME = re.compile(r"[a-z][a-z0-9_]*")
# Origins that are not signal kinds: the seed explorer, the random control and the held-out splits.
RESERVED = frozenset({"seed", "random", "heldout", "official"})


class KindSettings(BaseModel):
    """A kind's settings: its fields become fields of the ``signals`` configuration block (coevolve/config/), so
    each needs a default and a description, and a name no other kind uses."""

    model_config = ConfigDict(extra="forbid")


class NoSettings(KindSettings):
    """The settings of a kind without thresholds."""


SettingsT = TypeVar("SettingsT", bound=KindSettings)


class SignalKind(ABC, Generic[SettingsT]):
    """One failure signal: how it is mined, what it says, and how synthesis follows it."""

    # Stored in signals.kind and tasks' provenance.origin; see NAME.
    name: ClassVar[str]
    # Its column in the round table's and the report's "signals f/b/r" (one character).
    letter: ClassVar[str]
    # The exploration objective the synthesis context gives for it (the method's guidance per kind).
    guidance: ClassVar[str]
    # What the signal says about its task, in the LLM synthesizer's prompt.
    meaning: ClassVar[str]
    # Its thresholds: fields of the `signals` configuration block, each name used by one kind only.
    settings_type: type[SettingsT]

    def settings(self, block: BaseModel) -> SettingsT:
        """This kind's settings, read from the ``signals`` configuration block."""
        return self.settings_type.model_validate({f: getattr(block, f) for f in self.settings_type.model_fields})

    def history_plans(
        self, history: pl.LazyFrame, current: pl.DataFrame, settings: SettingsT
    ) -> dict[str, pl.LazyFrame]:
        """Aggregations over the earlier rounds' trajectories that ``fire`` needs, by name; none by default."""
        return {}

    @abstractmethod
    def fire(self, current: pl.DataFrame, history: dict[str, pl.DataFrame], settings: SettingsT) -> pl.DataFrame | None:
        """This round's marked trajectories: columns trajectory_id, task_id and the kind's evidence, in
        ``current``'s order (sorted by trajectory_id); None when the kind cannot judge this round yet."""

    @abstractmethod
    def evidence(self, fired: pl.DataFrame) -> list[dict[str, Any]]:
        """One evidence record per row of ``fire``'s frame, stored with the signal."""

    @abstractmethod
    def context(self, signal: Signal, task: Task, used: list[str], known_tools: list[str]) -> tuple[str, list[str]]:
        """The failure cause written into the synthesis context, and the tools exploration focuses on.

        ``used`` are the known tools the marked trajectory called, in order; ``known_tools`` those of the task's
        environment.
        """
