"""The views outside a `Warehouse` session: storage/VIEWS.md's `views.sql` recipe for the DuckDB CLI defines every
view a session has, and docs/warehouse.md names every analysis view."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb

from storage.layouts import VIEWS
from storage.warehouse import Warehouse
from tests.doc_blocks import REPO

ANALYSIS_VIEWS = re.findall(r"CREATE VIEW (v_\w+) AS", VIEWS)


def _recipe_script(warehouse_root: Path, cwd: Path) -> str:
    """The `.venv/bin/python -c ...` part of storage/VIEWS.md's recipe, run as written on ``warehouse_root``."""
    recipe = next(
        block
        for block in re.findall(r"^```bash\n(.*?)^```", (REPO / "storage" / "VIEWS.md").read_text(), re.S | re.M)
        if "views.sql" in block
    )
    program = re.search(r"-c '\n(.*?)\n' > views\.sql", recipe, re.S)
    assert program, recipe
    code = program[1].replace('".coevolve/warehouse"', repr(str(warehouse_root)))
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_views_script_defines_every_view_in_a_fresh_session(warehouse: Warehouse, tmp_path: Path) -> None:
    """Read into a session of its own from another folder, the script answers every view and record kind a
    `Warehouse` session answers, with the same columns."""
    script = _recipe_script(Path(warehouse.root), tmp_path)
    own = duckdb.connect()
    own.execute(script)
    session = warehouse.connect()
    try:
        names = [
            row[0] for row in session.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
        ]
        assert {"runs", "rounds", "stage_runs", *ANALYSIS_VIEWS} <= set(names)
        for name in names:
            assert own.sql(f"SELECT * FROM {name}").columns == session.sql(f"SELECT * FROM {name}").columns, name
    finally:
        session.close()
        own.close()


def test_the_warehouse_page_names_every_analysis_view() -> None:
    page = (REPO / "docs" / "warehouse.md").read_text()
    listing = next(p for p in re.split(r"\n\s*\n", page) if p.startswith("The views, each documented"))
    assert re.findall(r"`(v_\w+)`", listing) == ANALYSIS_VIEWS


def test_every_analysis_view_has_its_section_in_views_md() -> None:
    sections = re.findall(r"^## (v_\w+)$", (REPO / "storage" / "VIEWS.md").read_text(), re.M)
    assert sections == ANALYSIS_VIEWS
