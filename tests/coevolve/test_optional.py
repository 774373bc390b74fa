"""coevolve/optional.py: a heavy package named at a module's top is imported only when first used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coevolve.optional import MissingDependencyError, optional_module


def test_naming_a_package_does_not_import_it():
    code = (
        "import sys; from coevolve.optional import optional_module; "
        "t = optional_module('torch'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_reading_an_attribute_imports_the_package():
    json_module = optional_module("json")
    assert json_module.dumps({"a": 1}) == '{"a": 1}'


def test_a_missing_package_names_the_install_command():
    vllm_like = optional_module("vllm_is_not_installed_here")
    with pytest.raises(MissingDependencyError, match="make setup"):
        _ = vllm_like.LLM
