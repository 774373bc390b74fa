"""How `coevolve sql` prints a result: an aligned table for people, CSV or JSON for scripts.

Every cell is printed whole, and the rows are the query's first ones in its own order (a ``--limit`` cut
keeps the head, never a head and a tail), so an ``ORDER BY ... DESC`` shows the top of the list.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line imports this module; polars loads only when a query runs
    import polars as pl

FORMATS = ("table", "csv", "json")
# Rows a table shows when no --limit is given: a screenful or two. CSV and JSON are for scripts, which
# get every row unless they ask for fewer.
TABLE_ROWS = 50
# A table shows these characters escaped, so one row stays one line (CSV and JSON keep them as they are).
_TABLE_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def rows_to_show(limit: int | None, output_format: str) -> int | None:
    """How many rows to print; None for all (``--limit 0``, or CSV and JSON without --limit)."""
    if limit is None:
        return TABLE_ROWS if output_format == "table" else None
    return limit or None


def render(
    frame: pl.DataFrame, output_format: str, limit: int | None, total: int | None = None
) -> tuple[str, str | None]:
    """The text to print for ``frame``'s first ``limit`` rows (all for None), and a note on the rows left out
    (None when none were): the table carries it as its last line, CSV and JSON leave it to stderr.

    ``total``: the rows the query returned, when ``frame`` holds only the first of them (the query door fetches
    only the rows it shows); None: ``frame``'s own height."""
    shown = frame if limit is None else frame.head(limit)
    total = frame.height if total is None else total
    left_out = total - shown.height
    note = None
    if left_out:
        note = f"the first {shown.height} of {total} rows; {left_out} more not shown (--limit N shows N, --limit 0 all)"
    if output_format == "csv":
        return _csv(shown), note
    if output_format == "json":
        return _json(shown), note
    counted = f"({total} row{'s' if total != 1 else ''})" if note is None else f"({note})"
    return f"{_table(shown)}\n{counted}", None


def _table(frame: pl.DataFrame) -> str:
    header = list(frame.columns)
    body = [[_text(value).translate(_TABLE_ESCAPES) for value in row] for row in frame.iter_rows()]
    widths = [max([len(name), *(len(row[i]) for row in body)]) for i, name in enumerate(header)]
    numeric = [dtype.is_numeric() for dtype in frame.dtypes]

    def line(cells: Sequence[str], align: bool = True) -> str:
        parts = [
            cell.rjust(width) if align and right else cell.ljust(width)
            for cell, width, right in zip(cells, widths, numeric, strict=True)
        ]
        return " | ".join(parts).rstrip()

    rule = "-+-".join("-" * width for width in widths)
    return "\n".join([line(header, align=False), rule, *(line(row) for row in body)])


def _csv(frame: pl.DataFrame) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(frame.columns)
    for row in frame.iter_rows():
        writer.writerow(["" if value is None else _text(value) for value in row])
    return out.getvalue().rstrip("\n")


def _json(frame: pl.DataFrame) -> str:
    """A JSON array of one object per row, one row a line."""
    rows = [json.dumps(_jsonable(row), ensure_ascii=False) for row in frame.iter_rows(named=True)]
    return "[\n" + ",\n".join(rows) + "\n]" if rows else "[]"


def _text(value: Any) -> str:
    """A cell as text: strings as they are, nested values as JSON, null as null."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(_jsonable(value), ensure_ascii=False)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _jsonable(value: Any) -> Any:
    """``value`` as JSON holds it: dates, times, decimals and bytes as text; NaN and infinities as text too."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity
    if isinstance(value, (datetime, date, time, timedelta, Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value
