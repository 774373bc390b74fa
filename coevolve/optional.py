"""Heavy optional dependencies, imported on first use, each named once at the top of the module that needs it.

torch, transformers, trl, peft and vllm take seconds to import, and a light worker (one that only mines
or validates) has no use for them. A module that needs one writes, at its top::

    torch = optional_module("torch")

and the package is imported the first time an attribute is read (``torch.no_grad``), so importing the
flows stays cheap. A package that is not installed raises `MissingDependencyError` at that point,
naming the command that installs it. Modules of this project that import such a package at their own
top (a subclass of a trl trainer must) are named the same way by the modules above them.

Such an import runs with Python's cycle collector paused (`collector_paused`): the libraries create about a
million objects that live as long as the process, which the collector would otherwise walk again and again while
they are made. A process then freezes them out of every later collection's walk (`preload`, `freeze_long_lived`).
What both cost and saved: benchmarks/HISTORY.md.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import sys
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from coevolve.errors import ConfigError

# Package -> how to get it, for the error a missing one raises.
INSTALL_HINTS: dict[str, str] = {
    "vllm": (
        "vLLM cannot be installed beside prefect, so it lives in its own environment (`make setup-vllm` on CPU, "
        "`make setup-gpu` on a GPU machine); a pipeline run reaches it with rollout.engine=openai and "
        "rollout.managed_servers (`make gpu-run`)"
    ),
    "torch": "run `make setup` (it installs torch before the project)",
}


class MissingDependencyError(ConfigError):
    """An optional package a setting needs is not installed in this environment."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector inside the block, and leave it as it was found: for work that makes many objects and
    no garbage cycles (an import's long-lived objects, tasks/mine.py's signal records). What the block leaves
    unreachable is collected by the next collection after it."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


# Whether gc.unfreeze is registered to run at exit yet (`freeze_long_lived`).
_UNFREEZE_AT_EXIT: list[bool] = []


def freeze_long_lived() -> None:
    """Move every object alive now out of the cycle collector's walks (`gc.freeze`, its permanent generation), and
    hand them back at exit (`gc.unfreeze`), where the interpreter's last collection frees them.

    For a process's start, once its libraries are imported: what is alive then is their module state, which lives
    as long as the process, and every later collection, full ones included, walks only what was made since. A
    garbage cycle not yet collected when frozen stays until exit, so a process calls this at its start, not between
    a run's stages (`agent.transformers_engine.free_device_memory` collects first).
    """
    gc.freeze()
    if not _UNFREEZE_AT_EXIT:
        atexit.register(gc.unfreeze)
        _UNFREEZE_AT_EXIT.append(True)


# The optional modules whose import imports transformers' generation code.
_IMPORT_TRANSFORMERS = ("transformers", "trl", "peft", "vllm", "tasks.training.")

# Whether transformers has been told that scikit-learn is absent yet (`hide_scikit_learn_from_transformers`).
_SCIKIT_LEARN_HIDDEN: list[bool] = []


def hide_scikit_learn_from_transformers() -> None:
    """Have transformers treat scikit-learn as not installed, before its generation code is first imported.

    That code imports scikit-learn's metrics, and SciPy with them, whenever scikit-learn is installed (MLflow installs
    it), for a confidence threshold of assisted decoding that nothing here uses: about a CPU-second at the start of
    every process that generates or trains (benchmarks/HISTORY.md). transformers caches the answer of its check
    (`transformers.utils.is_sklearn_available`), so it is asked once while scikit-learn is hidden, and scikit-learn
    stays importable for everything else in the process. Too late, and a no-op, once the generation code is loaded.
    """
    if _SCIKIT_LEARN_HIDDEN or "transformers.generation.candidate_generator" in sys.modules:
        return
    _SCIKIT_LEARN_HIDDEN.append(True)
    try:
        import_utils = importlib.import_module("transformers.utils.import_utils")
    except ImportError:
        return  # not installed: its users raise MissingDependencyError themselves
    if "sklearn" in sys.modules:
        return  # imported already: transformers may use it at no further cost
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # an import of it now fails, so a spec search finds none
    try:
        import_utils.is_sklearn_available.cache_clear()
        import_utils.is_sklearn_available()
    finally:
        del sys.modules["sklearn"]


class OptionalModule:
    """A stand-in for a module that imports it when one of its attributes is first read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def _load(self) -> ModuleType:
        if self._module is None:
            try:
                with collector_paused():
                    if self._name.startswith(_IMPORT_TRANSFORMERS):
                        hide_scikit_learn_from_transformers()
                    self._module = importlib.import_module(self._name)
            except ImportError as exc:
                top = self._name.split(".")[0]
                hint = INSTALL_HINTS.get(top, "run `make setup`")
                raise MissingDependencyError(
                    f"{self._name} is needed here but cannot be imported ({exc}); {hint}."
                ) from exc
        return self._module

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)  # copy, pickle and introspection never trigger the import
        module = self._load()
        try:
            return module.__dict__[attribute]
        except KeyError:
            # Not set yet: a lazy package (transformers) imports the submodule that defines it now.
            with collector_paused():
                return getattr(module, attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<optional module {self._name!r}, {state}>"


def optional_module(name: str) -> Any:
    """``name`` (a module path), imported when first used; see the module docstring."""
    return OptionalModule(name)


def preload(names: Iterable[str]) -> None:
    """Import the modules ``names`` now rather than on first use, with first use's error for one not installed, then
    freeze what is alive (`freeze_long_lived`): for a process's start.

    A command imports its flow's libraries while its temporary Prefect API starts in another process
    (flows/local_api.py), instead of after the API answers.
    """
    for name in names:
        OptionalModule(name)._load()
    freeze_long_lived()
