"""coevolve/optional.py: a heavy package named at a module's top is imported only when first used, with the cycle
collector paused while it is imported; a process's start imports its libraries and freezes them out of the collector's
later walks."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from coevolve.optional import MissingDependencyError, optional_module, preload


def _stdout_of(code: str) -> str:
    """What ``code`` prints, run in a new Python process (this one has imported its libraries already)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_naming_a_package_does_not_import_it():
    code = (
        "import sys; from coevolve.optional import optional_module; "
        "t = optional_module('torch'); print('torch' in sys.modules)"
    )
    assert _stdout_of(code).strip() == "False"


def test_reading_an_attribute_imports_the_package():
    json_module = optional_module("json")
    assert json_module.dumps({"a": 1}) == '{"a": 1}'


def test_a_missing_package_names_the_install_command():
    vllm_like = optional_module("vllm_is_not_installed_here")
    with pytest.raises(MissingDependencyError, match="make setup"):
        _ = vllm_like.LLM


def _package_that_records_the_collector(folder, name: str) -> None:
    """A package whose module body, and the submodule its ``__getattr__`` imports lazily (as transformers does), each
    record whether the cycle collector was running while they were imported."""
    package = folder / name
    package.mkdir()
    (package / "__init__.py").write_text(
        "import gc, importlib\n"
        "collecting_at_import = gc.isenabled()\n"
        "def __getattr__(attribute):\n"
        "    return getattr(importlib.import_module(f'{__name__}.lazy'), attribute)\n"
    )
    (package / "lazy.py").write_text("import gc\nLazyClass = type('LazyClass', (), {'collecting': gc.isenabled()})\n")


def test_a_package_and_its_lazy_parts_are_imported_with_the_cycle_collector_paused_and_it_runs_again_after(
    tmp_path, monkeypatch
):
    _package_that_records_the_collector(tmp_path, "records_the_collector")
    monkeypatch.syspath_prepend(str(tmp_path))
    package = optional_module("records_the_collector")
    assert gc.isenabled()
    assert package.collecting_at_import is False
    assert package.LazyClass.collecting is False
    assert gc.isenabled()


def test_an_import_leaves_a_paused_collector_paused(tmp_path, monkeypatch):
    _package_that_records_the_collector(tmp_path, "records_the_collector_again")
    monkeypatch.syspath_prepend(str(tmp_path))
    gc.disable()
    try:
        assert optional_module("records_the_collector_again").LazyClass.collecting is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failed_import_leaves_the_collector_running():
    with pytest.raises(MissingDependencyError):
        _ = optional_module("not_installed_either").anything
    assert gc.isenabled()


def _tracked(thing: object) -> bool:
    """Whether the cycle collector's collections still walk ``thing`` (a frozen object is in none of them)."""
    return any(candidate is thing for candidate in gc.get_objects())


def test_preloading_freezes_what_is_alive_and_later_objects_are_collected_as_before():
    alive_before = [object()]
    preload(["json"])
    made_after = [object()]
    assert not _tracked(alive_before)
    assert _tracked(made_after)


def test_a_garbage_cycle_frozen_at_the_start_is_freed_at_exit():
    code = (
        "import gc\n"
        "from coevolve.optional import preload\n"
        "gc.disable()\n"
        "class Cycle:\n"
        "    def __del__(self): print('freed', flush=True)\n"
        "cycle = Cycle(); cycle.me = cycle; del cycle\n"
        "preload([])\n"
        "gc.enable(); gc.collect(); print('running', flush=True)\n"
    )
    assert _stdout_of(code).split() == ["running", "freed"]


def test_transformers_generation_loads_without_scikit_learn_which_stays_importable():
    code = (
        "import sys\n"
        "from coevolve.optional import optional_module\n"
        "transformers = optional_module('transformers')\n"
        "transformers.GenerationMixin\n"
        "import transformers.generation.candidate_generator\n"
        "print('sklearn' in sys.modules, 'scipy.stats' in sys.modules)\n"
        "import sklearn.metrics\n"
        "print(sklearn.metrics.roc_curve([0, 1], [0.2, 0.8])[0].tolist())\n"
    )
    assert _stdout_of(code).splitlines() == ["False False", "[0.0, 0.0, 1.0]"]
