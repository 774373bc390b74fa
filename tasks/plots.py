"""Learning-curve figure of a run: success rate, held-out success, pool size and signals by round.

The version stage draws it after every round and logs it to that round's MLflow run, so the
newest run always shows the whole curve so far. Uses matplotlib's Agg backend (no display).
"""

from __future__ import annotations

from pathlib import Path

from coevolve.records import RoundSummary

SIGNAL_KINDS = ("forgetting", "boundary", "rare")


def learning_curve(summaries: list[RoundSummary], path: Path) -> Path:
    """Writes a PNG with three panels (success rates, pool size, signals per kind) by round; returns path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(summaries, key=lambda s: s.round)
    rounds = [s.round for s in ordered]
    fig, (rates, pool, signals) = plt.subplots(1, 3, figsize=(12, 3.5))
    try:
        rates.plot(rounds, [s.success_rate for s in ordered], marker="o", label="rollout success")
        rates.plot(rounds, [s.heldout_success for s in ordered], marker="s", label="held-out success")
        rates.set_ylim(-0.02, 1.02)
        rates.set_title("success rate")
        rates.legend(loc="best", fontsize=8)
        pool.plot(rounds, [s.pool_size for s in ordered], marker="o", color="tab:green")
        pool.set_title("pool size (after the round)")
        for kind in SIGNAL_KINDS:
            signals.plot(rounds, [s.signals.get(kind, 0) for s in ordered], marker="o", label=kind)
        signals.set_title("signals")
        signals.legend(loc="best", fontsize=8)
        for axis in (rates, pool, signals):
            axis.set_xlabel("round")
            axis.set_xticks(rounds)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=80)
    finally:
        plt.close(fig)
    return path
