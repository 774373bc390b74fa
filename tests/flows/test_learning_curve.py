"""The learning-curve figure the version stage logs to every round's MLflow run."""

from __future__ import annotations

from pathlib import Path

from coevolve.records import RoundSummary
from tasks.ablation.plots import learning_curve


def _summary(r: int) -> RoundSummary:
    return RoundSummary(
        run_id="r",
        round=r,
        pool_size=100 + 5 * r,
        rollouts=72,
        success_rate=0.1 * r,
        signals={"boundary": r, "rare": 1},
        accepted=5,
        rejected=1,
        heldout_success=0.05 * r,
    )


def test_the_curve_is_a_png_file(tmp_path: Path) -> None:
    path = learning_curve([_summary(r) for r in (2, 0, 1)], tmp_path / "figures" / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_single_round_still_draws(tmp_path: Path) -> None:
    assert learning_curve([_summary(0)], tmp_path / "one.png").stat().st_size > 1000
