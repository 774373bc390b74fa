"""The README's Layout is a tree of every package and subpackage, one line each: a package added, moved or removed
without its line fails here, naming it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.doc_blocks import REPO, sample_outputs
from tests.test_import_graph import LAYERS

README = REPO / "README.md"
# A tree line: box-drawing guides, then a folder's name ending in "/", then its one-line description.
ENTRY = re.compile(r"^(?P<guides>[│├└─ ]*)(?P<name>[\w.-]+)/\s+\S")
INDENT = 4  # characters per level of the tree ("├── ", "│   ")


def layout_tree() -> list[str]:
    """The folders the README's Layout names, as paths from the repository root."""
    text = README.read_text()
    section = text[text.index("\n## Layout\n") :]
    (block,) = [b for b in sample_outputs(README) if b in section]
    named: list[str] = []
    parents: list[str] = []
    for line in block.splitlines():
        entry = ENTRY.match(line)
        if entry is None:
            continue  # a description's continuation line
        depth = len(entry["guides"]) // INDENT
        parents = parents[:depth]
        named.append("/".join([*parents, entry["name"]]))
        parents.append(entry["name"])
    return named


def packages() -> list[str]:
    """Every package of the project's layers (a folder with an __init__.py), as a path from the repository root."""
    found = []
    for layer in LAYERS:
        for init in sorted((REPO / layer).rglob("__init__.py")):
            folder = init.parent.relative_to(REPO)
            if "__pycache__" not in folder.parts:
                found.append(folder.as_posix())
    return found


def test_the_layout_names_every_package():
    named = set(layout_tree())
    missing = [package for package in packages() if package not in named]
    assert missing == [], f"README.md's Layout lacks a line for {', '.join(missing)}"


def test_every_folder_the_layout_names_exists():
    stale = [folder for folder in layout_tree() if not (REPO / folder).is_dir()]
    assert stale == [], f"README.md's Layout names folders that do not exist: {', '.join(stale)}"


def test_the_layout_names_the_seams_a_newcomer_looks_for():
    """The packages and modules where a plug-in or a new environment goes are in the tree, by name."""
    text = README.read_text()
    tree = "\n".join(layout_tree())
    for package in ("coevolve/signals", "envs/bfcl", "envs/workplace", "tasks/training", "tasks/synthesis",
                    "tasks/ablation"):  # fmt: skip
        assert package in tree.splitlines(), package
    layout = text[text.index("\n## Layout\n") :]
    for module in ("plugins.py", "engine.py"):
        assert module in layout, module
    assert Path(REPO / "coevolve" / "plugins.py").is_file() and Path(REPO / "agent" / "engine.py").is_file()
