r"""The embedded default's training schedule, chosen on the dev split: F, batch size and updates per batch.

Every candidate spends the same episodes per round (``--episodes``, the default's 24 tasks x 6
samples) and runs ``--rounds`` rounds of the embedded default with ``coevolve evolve`` for each loop
seed, in one state folder: checkpoint 0, the seed pool and the splits are built once (``pool.seed``
is fixed) and shared, so candidates differ only in the schedule and seeds only in the loop. Every
round's checkpoint is scored greedily on the first ``--dev-tasks`` dev tasks; the held-out split is
scored by the rounds as always but not read here.

    .venv/bin/python benchmarks/schedule_choice.py --out /tmp/schedule-choice
    .venv/bin/python benchmarks/schedule_choice.py --candidates 1x24x4,3x8x1 --seeds 1 --rounds 2 --out /tmp/sc

A candidate is ``FxBxU``: F training steps a round, B tasks a batch, U optimizer steps a batch; ``FxBxU@LR``
also sets the learning rate (``10x16x1@1e-3``) and ``FxBxU+S`` the signals a round passes to synthesis
(``signals.max_signals_per_round``, so how many tasks a round adds: ``10x8x1+48``). ``--episodes 0`` compares
candidates of different budgets (the run length's choice, docs/experiments.md "The run's length"):

    .venv/bin/python benchmarks/schedule_choice.py --candidates 10x16x1,10x8x1,10x16x1@1e-3 --episodes 0 \
        --rounds 12 --seeds 1 --out /tmp/length-choice-s1

and the synthesis volume's choice (docs/experiments.md "How much a round synthesizes"):

    .venv/bin/python benchmarks/schedule_choice.py --candidates 10x8x1+48,10x8x1+96 --episodes 480 \
        --rounds 12 --seeds 1 --out /tmp/volume-choice-s1

``--config`` starts the candidates from a configuration file and ``--set`` adds a setting they all share, e.g. the
workplace environment's learning rate at the ablation's length (docs/experiments.md "The workplace's learning
rate"):

    .venv/bin/python benchmarks/schedule_choice.py --config configs/ablation.yaml --set environment.name=workplace \
        --candidates 10x8x1,10x8x1@1.5e-4,10x8x1@5e-5 --episodes 0 --rounds 14 --seeds 1 --out /tmp/workplace-lr-s1

Writes ``choice.json``, ``choice.md`` (one row per candidate: mean final dev success over seeds,
its gain over checkpoint 0, mean wall time of a run) and ``choice.png`` (each candidate's dev success by
optimizer step, mean +- sd over seeds) under ``--out``; a row also gives the tasks each round added to the
pool; the figures are recorded in docs/experiments.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

from coevolve.config import PipelineConfig, load_config
from coevolve.settings import OFFLINE_ENV
from storage.warehouse import Warehouse
from tasks.ablation.curves import Band, success_band
from tasks.ablation.plots import band_panel

REPO = Path(__file__).resolve().parents[1]


def parse_candidate(text: str) -> tuple[int, int, int]:
    steps, batch, updates = (int(part) for part in text.lower().split("+")[0].split("@")[0].split("x"))
    return steps, batch, updates


def candidate_rate(text: str) -> float | None:
    """The learning rate of an ``FxBxU@LR`` candidate; None (the configured rate) without ``@``."""
    _, _, rate = text.split("+")[0].partition("@")
    return float(rate) if rate else None


def candidate_signals(text: str) -> int | None:
    """The signals a round synthesizes for in an ``FxBxU+S`` candidate; None (the configured number) without ``+``."""
    _, _, signals = text.partition("+")
    return int(signals) if signals else None


def candidate_settings(candidate: tuple[int, int, int], seed: int, pool_seed: int, dev_tasks: int) -> list[str]:
    steps, batch, updates = candidate
    return [
        f"run_id=schedule-{steps}x{batch}x{updates}-s{seed}",
        f"seed={seed}",
        f"pool.seed={pool_seed}",
        f"training.batches_per_round={steps}",
        f"rollout.tasks_per_batch={batch}",
        f"training.updates_per_batch={updates}",
        f"rollout.dev_eval_tasks={dev_tasks}",
    ]


def with_options(settings: list[str], name: str) -> list[str]:
    """``settings`` with the candidate's learning rate and signals a round, its run id naming each one set
    (``...-lr0.001-s1``, ``...-sig48-s1``)."""
    rate, signals = candidate_rate(name), candidate_signals(name)
    run_id, rest = settings[0], settings[1:]
    stem, _, seed = run_id.rpartition("-")
    if rate is not None:
        stem, rest = f"{stem}-lr{rate}", [*rest, f"training.learning_rate={rate}"]
    if signals is not None:
        stem, rest = f"{stem}-sig{signals}", [*rest, f"signals.max_signals_per_round={signals}"]
    return [f"{stem}-{seed}", *rest]


def run_candidate(
    settings: list[str], state_dir: Path, rounds: int, log: Path, config_file: Path | None = None
) -> float:
    """``coevolve evolve --rounds`` (on ``config_file`` when given) with ``settings`` until rounds 0..``rounds``-1 are
    finished (an interrupted choice resumes its runs), in a process of its own; returns its wall time."""
    command = [sys.executable, "-m", "flows.cli", "evolve", "--rounds", str(rounds)]
    if config_file is not None:
        command += ["--config", str(config_file)]
    for setting in [f"state_dir={state_dir}", *settings]:
        command += ["--set", setting]
    started = time.perf_counter()
    with log.open("a") as out:
        subprocess.run(
            command,
            cwd=REPO,
            env={**os.environ, **OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=out,
            check=True,
        )
    return time.perf_counter() - started


def dev_curve(config: PipelineConfig) -> tuple[float | None, list[float | None]]:
    """Checkpoint 0's dev success and every round's, read from the warehouse."""
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        prepared = wh.stage_output(config.run_id, 0, "prepare") or {}
        return prepared.get("baseline_dev_success"), [s.dev_success for s in wh.rounds(config.run_id)]


def pool_supply(config: PipelineConfig) -> dict[str, Any]:
    """The tasks every round of the finished run added to the pool (its validated candidates)."""
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        return {"added_by_round": [s.accepted for s in wh.rounds(config.run_id)]}


def run_choice(
    runs: list[tuple[str, int, list[str]]],
    out: Path,
    rounds: int,
    measure: Callable[[PipelineConfig], dict[str, Any]] | None = None,
    config_file: Path | None = None,
) -> list[dict[str, Any]]:
    """Runs every (candidate, seed, settings) for ``rounds`` rounds, one after another, in ``out``/state.

    A row: candidate, seed, wall_s, dev_checkpoint0, dev_by_round, and what ``measure`` reads from the finished
    run. Rows are saved to ``out``/choice.json as they come; rows of an earlier, interrupted invocation are kept,
    and its unfinished runs continue where they stopped.
    """
    state_dir = out / "state"
    out.mkdir(parents=True, exist_ok=True)
    done_file = out / "choice.json"
    earlier = {(r["candidate"], r["seed"]): r for r in json.loads(done_file.read_text())} if done_file.exists() else {}
    rows = []
    for name, seed, settings in runs:
        if (name, seed) in earlier:
            rows.append(earlier[(name, seed)])
            continue
        config = load_config(config_file, [f"state_dir={state_dir}", *settings], environ={})
        wall_s = run_candidate(settings, state_dir, rounds, out / "runs.log", config_file)
        baseline, curve = dev_curve(config)
        rows.append({"candidate": name, "seed": seed, "wall_s": round(wall_s, 1), "dev_checkpoint0": baseline,
                     "dev_by_round": curve, **(measure(config) if measure else {})})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        done_file.write_text(json.dumps(rows, indent=1))
    return rows


def dev_band(rows: list[dict[str, Any]], steps_per_round: int) -> Band:
    """One candidate's dev success by optimizer step over its seeds' rows (checkpoint 0 at step 0), computed as the
    ablation report computes an arm's (`tasks.ablation.curves.success_band`)."""
    runs = [
        {
            "baseline_dev_success": r["dev_checkpoint0"],
            "rounds": [{"dev_success": d, "optimizer_steps": steps_per_round} for d in r["dev_by_round"]],
        }
        for r in rows
    ]
    return success_band(runs, "dev")


def draw_choice(rows: list[dict[str, Any]], path: Path) -> Path:
    """choice.png: every candidate's dev success by optimizer step, as the ablation report draws its arms."""
    matplotlib.use("Agg")
    bands = {}
    for name in dict.fromkeys(r["candidate"] for r in rows):
        steps, _, updates = parse_candidate(name)
        bands[name] = dev_band([r for r in rows if r["candidate"] == name], steps * updates)
    fig, axis = plt.subplots(figsize=(7, 4))
    try:
        band_panel(axis, bands, "dev")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def added_a_round(rows: list[dict[str, Any]]) -> str:
    """Mean tasks a round added over the candidate's runs; "-" for rows recorded before they were measured."""
    added = [n for r in rows for n in r.get("added_by_round", [])]
    return f"{mean(added):.1f}" if added else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", default="1x24x4,2x12x2,3x8x1,3x8x2", help="FxBxU, comma-separated")
    parser.add_argument("--seeds", default="1,2", help="loop seeds, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (make run's 3)")
    parser.add_argument("--dev-tasks", type=int, default=100, help="dev tasks scored after every round")
    parser.add_argument(
        "--episodes", type=int, default=144, help="episodes a round (F x B x group size) to check; 0 checks nothing"
    )
    parser.add_argument("--out", type=Path, required=True, help="state folder and report folder")
    parser.add_argument("--config", type=Path, help="the configuration the candidates start from (default: built in)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a setting every candidate shares (repeatable)"
    )
    args = parser.parse_args()
    defaults = load_config(args.config, args.set, environ={})
    pool_seed = defaults.start_seed
    names = args.candidates.split(",")
    candidates = [parse_candidate(c) for c in names]
    for steps, batch, _ in candidates:
        if args.episodes and steps * batch * defaults.rollout.group_size != args.episodes:
            parser.error(f"{steps}x{batch} plays {steps * batch * defaults.rollout.group_size} episodes a round, "
                         f"not {args.episodes}: compare candidates at the same budget")  # fmt: skip
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [
        (name, seed, [*args.set, *with_options(candidate_settings(candidate, seed, pool_seed, args.dev_tasks), name)])
        for name, candidate in zip(names, candidates, strict=True)
        for seed in seeds
    ]
    rows = run_choice(runs, args.out, args.rounds, pool_supply, args.config)
    lines = [
        "| candidate | final dev success (mean over seeds) | gain over checkpoint 0 | per seed | tasks added a round "
        "| run time |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["candidate"] for r in rows):
        mine = [r for r in rows if r["candidate"] == name]
        finals = [r["dev_by_round"][-1] for r in mine]
        gains = [f - r["dev_checkpoint0"] for f, r in zip(finals, mine, strict=True)]
        lines.append(
            f"| {name} | {mean(finals):.3f} | {mean(gains):+.3f} | {', '.join(f'{f:.2f}' for f in finals)} | "
            f"{added_a_round(mine)} | {mean(r['wall_s'] for r in mine):.0f} s |"
        )
    (args.out / "choice.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"figure: {draw_choice(rows, args.out / 'choice.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
