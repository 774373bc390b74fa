"""The curriculum's settings for the ablation, chosen on the dev split: sampler rule and dynamic sampling.

Every candidate runs the ablation's schedule (configs/ablation_20steps.yaml: one batch a round, 4 optimizer
steps, at most 144 episodes a round) for ``--rounds`` rounds with ``coevolve evolve``, for each loop
seed, in one state folder (checkpoint 0, the seed pool and the splits built once and shared). The
curriculum candidates draw 12 tasks a batch and may play up to twice that (``max_rollout_factor`` 2),
so every candidate has the same episode budget as the uniform reference's 24 tasks. Every round's
checkpoint is scored greedily on the first ``--dev-tasks`` dev tasks; the held-out split is scored by
the rounds as always but not read here.

    .venv/bin/python benchmarks/curriculum_choice.py --out /tmp/curriculum-choice
    .venv/bin/python benchmarks/curriculum_choice.py --candidates uniform,learnability --seeds 1 --out /tmp/cc

Writes ``choice.json`` and ``choice.md`` under ``--out``: per candidate, final dev success (mean over
seeds and per seed), the informative share of played groups in rounds 1 onward (round 0 has no
history to draw on), episodes a round and wall time. The figures are recorded in docs/experiments.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.schedule_choice import run_choice  # noqa: E402
from coevolve.config import load_config  # noqa: E402
from storage.warehouse import Warehouse  # noqa: E402

# The ablation's schedule and dev scoring, for every candidate.
SCHEDULE = ["training.batches_per_round=1", "training.updates_per_batch=4"]
CURRICULUM = ["rollout.tasks_per_batch=12", "rollout.dynamic_sampling=true", "rollout.max_rollout_factor=2"]
CANDIDATES: dict[str, list[str]] = {
    "uniform": ["pool.sampler=uniform", "rollout.tasks_per_batch=24"],
    "uniform-dynamic": ["pool.sampler=uniform", *CURRICULUM],
    "learnability": ["pool.sampler=learnability", "pool.explore_unplayed=true", *CURRICULUM],
    "learnability-prior": ["pool.sampler=learnability", "pool.explore_unplayed=false", *CURRICULUM],
    "band": ["pool.sampler=band", "pool.explore_unplayed=false", *CURRICULUM],
    "learnability-sharp4": [
        "pool.sampler=learnability",
        "pool.explore_unplayed=false",
        "pool.sharpness=4",
        *CURRICULUM,
    ],
    "learnability-sharp8": [
        "pool.sampler=learnability",
        "pool.explore_unplayed=false",
        "pool.sharpness=8",
        *CURRICULUM,
    ],
}


def played_groups(config) -> list[dict[str, float]]:
    """Per finished round: episodes played, and the informative share of its played groups."""
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return [{"episodes": s.rollouts, "informative": s.informative_groups} for s in wh.rounds(config.run_id)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated names of CANDIDATES")
    parser.add_argument("--seeds", default="1,2", help="loop seeds, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run")
    parser.add_argument("--dev-tasks", type=int, default=100, help="dev tasks scored after every round")
    parser.add_argument("--out", type=Path, required=True, help="state folder and report folder")
    args = parser.parse_args()
    pool_seed = load_config(environ={}).start_seed
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [
        (name, seed, [f"run_id=curriculum-{name}-s{seed}", f"seed={seed}", f"pool.seed={pool_seed}",
                      f"rollout.dev_eval_tasks={args.dev_tasks}", *SCHEDULE, *CANDIDATES[name]])
        for name in args.candidates.split(",")
        for seed in seeds
    ]  # fmt: skip
    rows = run_choice(runs, args.out, args.rounds, lambda config: {"rounds": played_groups(config)})
    lines = [
        "| candidate | final dev success (mean) | per seed | informative share of played groups, rounds 1+ | "
        "episodes a round | run time |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["candidate"] for r in rows):
        mine = [r for r in rows if r["candidate"] == name]
        finals = [r["dev_by_round"][-1] for r in mine]
        later = [x for r in mine for x in r["rounds"][1:]]
        lines.append(
            f"| {name} | {mean(finals):.3f} | {', '.join(f'{f:.2f}' for f in finals)} | "
            f"{mean(x['informative'] for x in later):.2f} | {mean(x['episodes'] for x in later):.0f} | "
            f"{mean(r['wall_s'] for r in mine):.0f} s |"
        )
    (args.out / "choice.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
