"""The per-round table the command line and the evolution flow print: one row per round."""

from __future__ import annotations

from typing import Any

from coevolve.signals import SIGNAL_KINDS, letters

# The signals column counts every registered kind (coevolve/signals/), "f/b/r" for the built-in three.
SIGNALS_COLUMN = f"signals {letters()}"
# "opt-steps": the optimizer steps the round's update took; 0 says no group had reward variance, so nothing trained.
COLUMNS = (
    "round", "pool", "rollouts", "success", "opt-steps", SIGNALS_COLUMN, "accepted", "rejected", "held-out", "time",
)  # fmt: skip
WIDTHS = (5, 6, 8, 7, 9, max(13, len(SIGNALS_COLUMN)), 8, 8, 8, 7)


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
            "-" if summary.get("optimizer_steps") is None else summary["optimizer_steps"],  # not in older records
            "/".join(str(s.get(kind, 0)) for kind in SIGNAL_KINDS),
            summary["accepted"],
            summary["rejected"],
            f"{summary['heldout_success']:.3f}",
            f"{seconds:.0f}s",
        )
    )
