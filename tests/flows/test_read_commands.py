"""`coevolve sql` and `coevolve status` only read: on a folder without state they say so in one line, exit non-zero
and leave the folder as they found it (no empty state folder, no Prefect home)."""

from __future__ import annotations

from pathlib import Path

from flows.cli import main


def test_status_without_state_says_so_in_one_line_and_creates_nothing(tmp_path: Path, capsys) -> None:
    state = tmp_path / ".coevolve"
    assert main(["status", "--set", f"state_dir={state}"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"no round of run 'default' in state folder {state}: start one with `coevolve evolve`")
    assert list(tmp_path.iterdir()) == []


def test_sql_without_state_names_the_missing_warehouse_and_creates_nothing(tmp_path: Path, capsys) -> None:
    state = tmp_path / ".coevolve"
    assert main(["sql", "SELECT 1", "--set", f"state_dir={state}"]) == 2
    _, err = capsys.readouterr()
    assert err.splitlines() == [
        f"error: No warehouse at {state / 'warehouse'}; run `coevolve evolve` first or pass --database."
    ]
    assert list(tmp_path.iterdir()) == []
