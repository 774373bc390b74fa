"""Line charts as data for an inline SVG (templates/_chart.html draws them): curves per run, seed bands per arm.

A chart is computed here in plot coordinates (numbers only); the template writes the SVG, so every label
passes Jinja's escaping. Runs of an ablation arm (``<name>-<arm>-s<seed>``, flows/ablation.py) are drawn as
one line, their mean, within a band from their lowest to their highest value at each round.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Plot area in SVG units, inside margins for the axes' labels.
WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 150, 12, 28
# Colors of successive lines (a colour-blind-safe palette, Okabe and Ito).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
# An ablation run's id: the arm's name, then the seed.
_SEEDED = re.compile(r"^(?P<arm>.+)-s(?P<seed>\d+)$")


@dataclass
class Line:
    label: str
    color: str
    points: str  # "x,y x,y ..." in SVG units
    band: str | None = None  # the polygon of the seed band, when the line is a mean over seeds
    dots: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Chart:
    title: str
    lines: list[Line]
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    plot_width: int = WIDTH - LEFT - RIGHT
    plot_height: int = HEIGHT - TOP - BOTTOM


def arm_of(run_id: str) -> tuple[str, bool]:
    """The line a run belongs to: its ablation arm (without the seed) and True, or the run itself and False."""
    match = _SEEDED.match(run_id)
    return (match["arm"], True) if match else (run_id, False)


def line_chart(title: str, series: dict[str, dict[int, float]], y_max: float | None = None) -> Chart | None:
    """A chart of ``series`` (run id -> round -> value); runs of one arm become its mean and min-max band.

    None when no series has a value.
    """
    grouped: dict[str, list[dict[int, float]]] = {}
    for run_id, values in series.items():
        if values:
            grouped.setdefault(arm_of(run_id)[0], []).append(values)
    if not grouped:
        return None
    xs = sorted({x for runs in grouped.values() for values in runs for x in values})
    ys = [y for runs in grouped.values() for values in runs for y in values.values()]
    x_lo, x_hi = xs[0], max(xs[-1], xs[0] + 1)
    y_lo = min(0.0, min(ys))
    y_hi = y_max if y_max is not None else max(ys) * 1.05 if max(ys) > 0 else 1.0
    y_hi = max(y_hi, y_lo + 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return round(LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w, 1)

    def sy(y: float) -> float:
        return round(TOP + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h, 1)

    lines = []
    for index, (label, runs) in enumerate(sorted(grouped.items())):
        rounds = sorted({x for values in runs for x in values})
        at = {x: [values[x] for values in runs if x in values] for x in rounds}
        mean = [(x, sum(at[x]) / len(at[x])) for x in rounds]
        band = None
        if len(runs) > 1:
            upper = [f"{sx(x)},{sy(max(at[x]))}" for x in rounds]
            lower = [f"{sx(x)},{sy(min(at[x]))}" for x in reversed(rounds)]
            band = " ".join(upper + lower)
            label = f"{label} ({len(runs)} seeds)"
        lines.append(
            Line(
                label=label,
                color=PALETTE[index % len(PALETTE)],
                points=" ".join(f"{sx(x)},{sy(y)}" for x, y in mean),
                band=band,
                dots=[(sx(x), sy(y)) for x, y in mean],
            )
        )
    step = max(1, len(xs) // 10)
    x_ticks = [(sx(x), str(x)) for x in xs[::step]]
    y_ticks = [(sy(y_lo + (y_hi - y_lo) * i / 4), f"{y_lo + (y_hi - y_lo) * i / 4:.3g}") for i in range(5)]
    return Chart(title=title, lines=lines, x_ticks=x_ticks, y_ticks=y_ticks)
