"""The fenced ``bash`` blocks of README.md, the docs/ pages and the READMEs beside the code: the commands a user
copies, which tests run or check.

A block moves between pages as the documentation is reorganised; tests find it by a line it holds, on whichever
page it now lives.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def doc_pages() -> list[Path]:
    """README.md and every page under docs/ (not docs/history/, which keeps earlier setups' reports as they were)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def command_pages() -> list[Path]:
    """Every page whose commands a user copies: `doc_pages` and the READMEs beside the code (storage/, deployments/,
    benchmarks/ and the lab notes), whose blocks are checked the same way."""
    beside = [REPO / "storage" / "README.md", REPO / "storage" / "VIEWS.md", REPO / "deployments" / "README.md",
              REPO / "benchmarks" / "README.md"]  # fmt: skip
    return [*doc_pages(), *beside]


@dataclass(frozen=True)
class CommandBlock:
    page: Path
    text: str

    def lines(self) -> list[str]:
        """The block's command lines, with backslash continuations joined and empty lines dropped."""
        return [line for line in self.text.replace("\\\n", " ").splitlines() if line.strip()]

    def commands(self) -> list[list[str]]:
        """Each command's words as bash splits them (comments dropped); a quote left open continues on the next line."""
        words: list[list[str]] = []
        pending = ""
        for line in self.lines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                split = shlex.split(pending, comments=True)
            except ValueError:  # an open quote: the command goes on
                continue
            pending = ""
            if split:
                words.append(split)
        if pending:
            raise ValueError(f"{self.page.name}: a quote is never closed in {pending!r}")
        return words


def command_blocks() -> list[CommandBlock]:
    return [CommandBlock(page, text) for page in command_pages() for text in BASH_BLOCK.findall(page.read_text())]


def command_block(holding: str) -> CommandBlock:
    """The one block that holds ``holding``; fails naming the pages searched when none or several do."""
    found = [block for block in command_blocks() if holding in block.text]
    if len(found) != 1:
        pages = ", ".join(str(p.relative_to(REPO)) for p in command_pages())
        raise LookupError(f"{len(found)} bash blocks hold {holding!r} in {pages}; expected exactly one")
    return found[0]


FENCED_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
TABLE_RULE = re.compile(r"^\|[-:| ]+\|$")


def sample_outputs(page: Path) -> list[str]:
    """The fenced blocks of ``page`` that show what a command printed: those without a language tag."""
    return [text for language, text in FENCED_BLOCK.findall(page.read_text()) if not language]


def prose(page: Path) -> str:
    """``page`` without its fenced blocks."""
    return FENCED_BLOCK.sub("", page.read_text())


def split_sentences(text: str) -> list[str]:
    """The sentences of markdown ``text`` outside its fenced blocks, each on one line: paragraphs, list items and
    table rows apart, a sentence ending at a full stop before a capital, a backtick, ``*`` or ``(``."""
    found: list[str] = []
    for paragraph in re.split(r"\n\s*\n", FENCED_BLOCK.sub("", text)):
        for item in re.split(r"\n(?=\s*(?:[-*] |\d+\. |\|))", paragraph):
            found += re.split(r"(?<=\.)\s+(?=[A-Z*`(])", " ".join(item.split()))
    return found


def sentences(page: Path) -> list[str]:
    return split_sentences(page.read_text())


@dataclass(frozen=True)
class Table:
    page: Path
    header: list[str]
    rows: list[list[str]]

    def column(self, index: int) -> dict[str, str]:
        """First cell -> the cell at ``index``, for every row."""
        return {row[0]: row[index] for row in self.rows if len(row) > index}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(page: Path) -> list[Table]:
    """The markdown tables of ``page``'s prose (a header line, its rule, then rows)."""
    lines = prose(page).splitlines()
    found = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and TABLE_RULE.match(lines[i + 1].strip()):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            found.append(Table(page, _cells(line), rows))
    return found
