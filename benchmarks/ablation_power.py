"""Which ablation design detects a difference of 0.03: the report's own power simulation over seeds x final tasks.

Runs `tasks.ablation.inference.detectable_effect` (the simulation the report quotes its power from: the report's
two-way test, the calibrated `Structure`, 80% power at alpha 0.05 before correction) for every pair of
``--seeds`` and ``--tasks`` (the final held-out split's size), and prints one JSON line per design: the
smallest difference in final held-out success detected between two arms and between an arm and checkpoint 0 (null
when not even 0.1 is), and the number of runs the design costs for ``--arms`` arms. Nothing is trained; numpy only.

Run (from the repository root):

    .venv/bin/python benchmarks/ablation_power.py --seeds 10,15,20 --tasks 500,1000,2000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tasks.ablation.inference import detectable_effect  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _or_none(effect: float) -> float | None:
    return None if math.isnan(effect) else effect


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=_ints, default=[10, 15, 20], help="seeds per arm to try (comma-separated)")
    parser.add_argument("--tasks", type=_ints, default=[500, 1000, 2000], help="final held-out sizes to try")
    parser.add_argument("--arms", type=int, default=6, help="arms of the planned ablation (for the runs column)")
    parser.add_argument("--draws", type=int, default=400, help="simulated experiments per effect size")
    parser.add_argument("--step", type=float, default=0.005, help="resolution of the effect search")
    args = parser.parse_args(argv)
    for seeds in args.seeds:
        for tasks in args.tasks:
            started = time.monotonic()
            found = detectable_effect(seeds, tasks, draws=args.draws, step=args.step, largest=0.1)
            print(
                json.dumps(
                    {
                        "seeds": seeds,
                        "final_tasks": tasks,
                        "runs": seeds * args.arms,
                        "detectable_arm_vs_arm": _or_none(found["arm"]),
                        "detectable_arm_vs_checkpoint0": _or_none(found["ckpt0"]),
                        "seconds": round(time.monotonic() - started, 1),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
