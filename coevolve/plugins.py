"""Classes installed packages declare under an entry-point group: their names, read without importing the packages,
and each class loaded and checked against the contract it must implement.

Signal kinds (``coevolve.signals``), engines (``coevolve.engines``) and curriculum gates (``coevolve.gates``) are
found this way (docs/extending.md); a declaration that does not load, or names something other than the contract's
subclass, is refused with what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from coevolve.errors import ConfigError

T = TypeVar("T")


def declared_points(group: str) -> list[EntryPoint]:
    """The declarations of ``group`` in the installed packages, by name."""
    return sorted(entry_points(group=group), key=lambda point: point.name)


def declared_names(group: str) -> list[str]:
    """The names declared under ``group``, without importing what they point at."""
    return [point.name for point in declared_points(group)]


def load_declared(point: EntryPoint, base: type[Any], contract: str) -> type[Any]:
    """The class ``point`` names: a subclass of ``base`` (abstract, so typed loosely), the contract written in the
    module ``contract``."""
    where = f"entry point {point.name} = {point.value} (group {point.group})"
    try:
        loaded = point.load()
    except Exception as exc:
        raise ConfigError(
            f"{where} does not load: {type(exc).__name__}: {exc}; fix that module, or uninstall the package that "
            "declares it"
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, base)):
        raise ConfigError(f"{where} is not a {base.__name__} subclass ({contract}); point it at one")
    return loaded


def declared_class(
    group: str, name: str, built_in: Mapping[str, type[T]], base: type[Any], contract: str, setting: str
) -> type[T]:
    """The class called ``name``: a built-in one, or the one an installed package declares under ``group``.

    ``setting`` names the configuration value that asked for it, for the error when nothing has that name.
    """
    if name in built_in:
        return built_in[name]
    points = {point.name: point for point in declared_points(group)}
    if name not in points:
        raise ConfigError(
            f"Unknown {setting} {name!r}; use one of {sorted({*built_in, *points})}, or install the package that "
            f"declares it (entry-point group {group})."
        )
    loaded: type[T] = load_declared(points[name], base, contract)
    return loaded
