"""The Makefile's contract with CI and fresh clones, read from `make -n` (commands printed, none run):
`make test` lints before it tests, every resolving install goes through the lock, each environment the tests use is
byte-compiled on every core after its installs, and `make run` compiles on import only what it imports."""

import ast
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import setuptools

from tests.conftest import LONGEST_FIRST, SESSION_SERVER_MODULES, work_unit

REPO = Path(__file__).resolve().parents[2]


def _planned(tmp_path: Path, *targets: str) -> list[str]:
    # A venv path that does not exist yet, so make plans the whole install as on a fresh clone.
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-n", f"VENV={venv}", f"VLLM_VENV={tmp_path / 'vllm'}", *targets],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.splitlines()


def test_make_test_runs_ruff_format_and_mypy_before_the_tests(tmp_path):
    lines = _planned(tmp_path, "test")
    position = {
        tool: next(i for i, line in enumerate(lines) if tool in line)
        for tool in ("ruff check", "ruff format --check", "bin/mypy", "-m pytest")
    }
    assert position["ruff check"] < position["-m pytest"]
    assert position["ruff format --check"] < position["-m pytest"]
    assert position["bin/mypy"] < position["-m pytest"]


def test_make_test_allows_no_skip_and_leaves_the_exhaustive_crash_and_mutation_runs_to_their_targets(tmp_path):
    (pytest_line,) = [line for line in _planned(tmp_path, "test-only") if "-m pytest" in line]
    assert pytest_line.startswith("REQUIRE_ALL_TESTS=1 ")  # tests/no_skips.py
    assert not [line for line in _planned(tmp_path, "test") if "COEVOLVE_CRASH_EXHAUSTIVE" in line or "mutmut" in line]
    (exhaustive,) = [line for line in _planned(tmp_path, "test-crash-exhaustive") if "-m pytest" in line]
    assert "COEVOLVE_CRASH_EXHAUSTIVE=1 REQUIRE_ALL_TESTS=1" in exhaustive and "-m exhaustive" in exhaustive
    assert any(line.endswith("/bin/mutmut run ") for line in _planned(tmp_path, "mutate"))


def test_every_resolving_install_is_constrained_and_torch_stays_free_on_gpu_machines(tmp_path):
    lines = _planned(tmp_path, "setup", "setup-vllm", "TORCH_SPEC=torch")
    installs = [line for line in lines if "pip install" in line and "--no-deps" not in line]
    assert installs
    for line in installs:
        assert "-c constraints" in line, line
    torch_line = next(line for line in installs if '"torch"' in line)
    assert "+cpu" not in torch_line
    assert "torch" not in (REPO / "constraints.txt").read_text().split()


def _modules_using(fixture: str) -> set[str]:
    """Test modules with a function (a test or a fixture) that takes ``fixture`` as a parameter."""
    found = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        functions = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)]
        if any(arg.arg == fixture for f in functions for arg in f.args.args):
            found.add(str(path.relative_to(REPO)))
    return found


def test_the_modules_of_the_session_vllm_server_are_one_unit_of_work_for_the_workers():
    assert SESSION_SERVER_MODULES == _modules_using("openai_server")
    assert len({work_unit(f"{module}::test_x") for module in SESSION_SERVER_MODULES}) == 1
    assert work_unit("tests/flows/test_round.py::test_x[a]") == "tests/flows/test_round.py"


def test_the_longest_modules_handed_out_first_are_test_modules():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [m for m in LONGEST_FIRST if not (REPO / m).is_file() or not Path(m).name.startswith("test_")] == []


def test_every_install_leaves_byte_compiling_to_one_pass_over_all_cores_afterwards(tmp_path):
    """pip's own compiling runs in one process; each environment the tests use is compiled once after its last
    install, the project's packages with .venv (they are imported from the checkout, which the editable install
    leaves uncompiled), and before the first test."""
    lines = _planned(tmp_path, "test-only")
    installs = [i for i, line in enumerate(lines) if "-m pip install" in line]
    compiles = [i for i, line in enumerate(lines) if ".ci/byte_compile.py" in line]
    assert installs and all("--no-compile" in lines[i] for i in installs)
    vllm_compile, venv_compile = (lines[i] for i in compiles)
    assert venv_compile.startswith(f"{tmp_path / 'venv'}/bin/python .ci/byte_compile.py --project pyproject.toml ")
    assert vllm_compile.startswith(f"{tmp_path / 'vllm'}/bin/python .ci/byte_compile.py")
    for environment, compile_at in (("vllm", compiles[0]), ("venv", compiles[1])):
        own = [i for i in installs if lines[i].startswith(str(tmp_path / environment) + "/")]
        assert own and max(own) < compile_at
    assert max(compiles) < next(i for i, line in enumerate(lines) if "-m pytest" in line)


def test_make_run_compiles_on_import_what_it_imports(tmp_path):
    """`make run` does not compile .venv's 28,000 modules ahead: its commands write the .pyc files of the modules
    they import, even under a shell's PYTHONDONTWRITEBYTECODE, so later commands load them compiled."""
    lines = _planned(tmp_path, "run")
    assert any("coevolve evolve" in line for line in lines)
    assert not any(".ci/byte_compile.py" in line for line in lines)
    probe = 'probe:\n\t@echo "[$$PYTHONDONTWRITEBYTECODE]"\n'
    done = subprocess.run(
        ["make", "--no-print-directory", "-f", "Makefile", "-f", "-", "probe"],
        cwd=REPO, input=probe, capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


def test_byte_compile_writes_what_imports_read_and_names_what_does_not_compile(tmp_path):
    """The project's packages are the ones pyproject.toml's include patterns name, read from it, not listed again."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["pkg*"]\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "pkg" / "good.py").write_text("VALUE = 1\n")
    (tmp_path / "pkg" / "newer_syntax.py").write_text("def f(:\n")
    (tmp_path / "other" / "left_out.py").write_text("VALUE = 2\n")
    done = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "byte_compile.py"), "--project", str(tmp_path / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    uncached = [line.rpartition(": ")[2] for line in done.stdout.splitlines() if line.startswith("did not compile")]
    assert str(tmp_path / "pkg" / "newer_syntax.py") in uncached and str(tmp_path / "pkg" / "good.py") not in uncached
    assert Path(importlib.util.cache_from_source(str(tmp_path / "pkg" / "good.py"))).is_file()
    assert not Path(importlib.util.cache_from_source(str(tmp_path / "pkg" / "newer_syntax.py"))).exists()
    assert not Path(importlib.util.cache_from_source(str(tmp_path / "other" / "left_out.py"))).exists()


def test_byte_compile_finds_every_package_setuptools_installs_from_this_project():
    """Every package of the install is compiled (a matching folder without modules, deployments/, costs nothing)."""
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    installed = {name.split(".")[0] for name in setuptools.find_packages(str(REPO), include=include)}
    spec = importlib.util.spec_from_file_location("byte_compile", REPO / ".ci" / "byte_compile.py")
    assert spec and spec.loader
    byte_compile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(byte_compile)
    found = {Path(folder).name for folder in byte_compile.project_packages(REPO / "pyproject.toml")}
    assert installed and installed <= found
