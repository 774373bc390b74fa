"""The one list of signal kinds: the built-in three of the method, then those other packages declare.

A package adds a kind by declaring its `SignalKind` subclass under the entry-point group ``coevolve.signals``
(``[project.entry-points."coevolve.signals"] mykind = "mypackage.mykind:MyKind"``); installing the package
registers it, and it is on (``signals.enabled``) unless the configuration leaves it out. The order is the
order synthesis takes the kinds in (tasks/mine.py, select_for_synthesis interleaves them), so the built-in
kinds come first and keep today's selection.
"""

from __future__ import annotations

from typing import Any

from coevolve.errors import ConfigError
from coevolve.plugins import declared_points, load_declared
from coevolve.signals.base import NAME, RESERVED, SignalKind
from coevolve.signals.boundary import Boundary
from coevolve.signals.forgetting import Forgetting
from coevolve.signals.rare import Rare

ENTRY_POINT_GROUP = "coevolve.signals"
BUILT_IN: tuple[type[SignalKind[Any]], ...] = (Forgetting, Boundary, Rare)
# Fields of the `signals` block that belong to no kind (coevolve/config/synthesis.py).
SHARED_FIELDS = frozenset({"enabled", "max_signals_per_round"})


def _declared() -> list[tuple[str, type[SignalKind[Any]]]]:
    """The kinds other installed packages declare, each with where it was declared."""
    return [
        (f"entry point {point.name} = {point.value} (group {ENTRY_POINT_GROUP})",
         load_declared(point, SignalKind, "coevolve/signals/base.py"))
        for point in declared_points(ENTRY_POINT_GROUP)
    ]  # fmt: skip


def _checked(kinds: list[tuple[str, type[SignalKind[Any]]]]) -> dict[str, SignalKind[Any]]:
    """The kinds by name, refusing names, letters or settings another kind already has."""
    registry: dict[str, SignalKind[Any]] = {}
    fields: dict[str, str] = dict.fromkeys(SHARED_FIELDS, "the signals block")
    letters: dict[str, str] = {}
    for where, kind in kinds:
        name = getattr(kind, "name", "")
        if not NAME.fullmatch(name) or name in RESERVED:
            raise ConfigError(
                f"signal kind {name!r} ({where}): a kind's name is a lowercase word (letters, digits, _) and none of "
                f"{sorted(RESERVED)}; rename it"
            )
        if name in registry:
            raise ConfigError(f"signal kind {name!r} ({where}) is registered twice; rename one of them")
        letter = getattr(kind, "letter", "")
        if len(letter) != 1 or letter in letters:
            raise ConfigError(
                f"signal kind {name!r} ({where}): its letter {letter!r} must be one character no other kind uses "
                f"(taken: {letters or 'none'}); choose another"
            )
        for field in kind.settings_type.model_fields:
            if field in fields:
                raise ConfigError(
                    f"signal kind {name!r} ({where}): setting {field!r} is already {fields[field]}'s; prefix it "
                    f"with the kind's name ({name}_...)"
                )
            fields[field] = f"kind {name!r}"
        letters[letter] = name
        registry[name] = kind()
    return registry


KINDS: dict[str, SignalKind[Any]] = _checked([(f"{k.__module__}", k) for k in BUILT_IN] + _declared())
# The kinds' names, in the registry's order.
SIGNAL_KINDS: tuple[str, ...] = tuple(KINDS)


def signal_kind(name: str) -> SignalKind[Any]:
    """The registered kind called ``name``."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown signal kind {name!r}; the registered kinds are {list(KINDS)}") from None


def letters() -> str:
    """The round table's and the report's label of the kinds' counts, e.g. ``f/b/r``."""
    return "/".join(kind.letter for kind in KINDS.values())
