"""The per-round table the command line and the evolution flow print: one row per round."""

from __future__ import annotations

from typing import Any

COLUMNS = ("round", "pool", "rollouts", "success", "signals f/b/r", "accepted", "rejected", "held-out", "time")
WIDTHS = (5, 6, 8, 7, 13, 8, 8, 8, 7)


def format_row(values: tuple[Any, ...]) -> str:
    return "  ".join(str(v).rjust(w) for v, w in zip(values, WIDTHS, strict=True))


def summary_row(summary: dict[str, Any], seconds: float) -> str:
    s = summary["signals"]
    return format_row(
        (
            summary["round"],
            summary["pool_size"],
            summary["rollouts"],
            f"{summary['success_rate']:.3f}",
            f"{s.get('forgetting', 0)}/{s.get('boundary', 0)}/{s.get('rare', 0)}",
            summary["accepted"],
            summary["rejected"],
            f"{summary['heldout_success']:.3f}",
            f"{seconds:.0f}s",
        )
    )
