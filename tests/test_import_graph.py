"""The import graph of the project's own modules: no cycle, and every arrow points down the layers.

Layers, lowest first; a module imports only from its own layer or a lower one::

    coevolve                 plain types, configuration, errors, process settings (the ground floor)
    storage, envs            the warehouse and tracking; the agent environments
    agent                    the policy, its engines and rollout servers
    tasks                    the stages of a round and the reports
    flows                    the Prefect flows and the command line that starts them
    benchmarks               measurement scripts

Every import counts, at any depth (one inside a function hides a cycle as well as it hides the
cost), and so does a module named with ``optional_module("package.module")``, which is imported on
first use instead of at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS: dict[str, int] = {"coevolve": 0, "storage": 1, "envs": 1, "agent": 2, "tasks": 3, "flows": 4, "benchmarks": 5}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in LAYERS for p in sorted((REPO / package).rglob("*.py"))}


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name the module imports, wherever the statement stands, plus optional_module("...") names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package upwards
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "optional_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (a name resolves to the longest module it starts with)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py"):
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != module:
                targets.add(".".join(parts))
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


GRAPH = import_graph()


def test_imports_inside_functions_and_optional_module_names_are_edges():
    source = (
        "import json\ndef draw():\n    from tasks.ablation.plots import learning_curve\n"
        "round_flow = optional_module('flows.round')\n"
    )
    assert {"tasks.ablation.plots", "tasks.ablation.plots.learning_curve", "flows.round"} <= imported_names(
        ast.parse(source), "tasks.ablation.report", False
    )


def test_a_cycle_is_found_through_any_number_of_modules():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_covers_every_package():
    assert {module.split(".")[0] for module in GRAPH} == set(LAYERS)
    assert "flows.round" in GRAPH["flows.evolve"]  # a sanity check of the parsing itself


def test_no_import_cycle_among_the_projects_modules():
    found = cycles(GRAPH)
    described = [
        " <-> ".join(component)
        + ": "
        + "; ".join(f"{a} -> {b}" for a in component for b in sorted(GRAPH[a]) if b in component)
        for component in found
    ]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_the_ground_floor_imports_nothing_above_it():
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a.startswith("coevolve")
        for b in targets
        if not b.startswith("coevolve")
    )
    assert not upward, "coevolve/ imports from above it:\n" + "\n".join(upward)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_arrow_points_down_the_layers(package):
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a.split(".")[0] == package
        for b in targets
        if LAYERS[b.split(".")[0]] > LAYERS[package]
        or (LAYERS[b.split(".")[0]] == LAYERS[package] and b.split(".")[0] != package)
    )
    assert not upward, f"{package} imports from its own layer's neighbour or above:\n" + "\n".join(upward)
