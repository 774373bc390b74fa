"""The README and the docs/ pages: every page is reachable from the README, and every documented command is one
the CLI accepts with a configuration that loads.

The commands are read from the fenced ``bash`` blocks wherever they live (tests/doc_blocks.py); nothing is run
but the CLI's argument parser and the configuration loader, so a renamed flag, subcommand or setting fails here.
"""

from __future__ import annotations

import pytest

from coevolve.config import load_config
from flows.cli import build_parser
from tests.doc_blocks import REPO, command_blocks, doc_pages


def _coevolve_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, the arguments after `coevolve`, the variables the block exported before it) for each documented call."""
    found = []
    for block in command_blocks():
        exported: dict[str, str] = {}
        for number, words in enumerate(block.commands(), start=1):
            if words[0] == "export":
                exported.update(word.split("=", 1) for word in words[1:] if "=" in word)
                continue
            if words[0].endswith("bin/coevolve"):
                args = [w for w in words[1:] if w != "&"]
                where = f"{block.page.relative_to(REPO)}: {args[0]}, command {number} of its block"
                found.append((where, args, dict(exported)))
    return found


COMMANDS = _coevolve_commands()


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    unlinked = [page.name for page in doc_pages()[1:] if f"](docs/{page.name})" not in readme]
    assert unlinked == []


def test_the_documentation_shows_the_commands_a_newcomer_starts_with():
    assert len(COMMANDS) >= 20  # every page's examples are found, not just the README's
    assert any(
        "make run" in block.text and "make test" in block.text
        for block in command_blocks()
        if block.page.name == "README.md"
    )


@pytest.mark.parametrize(("where", "args", "exported"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_parses_and_its_configuration_loads(where, args, exported, monkeypatch):
    monkeypatch.chdir(REPO)  # the docs run commands from the repository root (configs/..., deployments/...)
    args = ["/tmp/checkpoint" if a == "$CKPT" else a for a in args]
    parsed = build_parser().parse_args(args)  # an unknown subcommand or flag exits with argparse's usage error
    if hasattr(parsed, "set"):
        environ = {k: v for k, v in exported.items() if k.startswith("COEVOLVE_")}
        load_config(parsed.config, parsed.set, environ=environ)
