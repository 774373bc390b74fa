"""A training step's rollout and update, and a round's evaluation, before and after the step's levers, in one process.

Each part is timed with the code of ``--before`` (a git revision: its agent/transformers_engine.py is loaded as a
module of its own, its evaluation replayed as it ran) and with this tree's, alternating ``--repeat`` times, so a
machine shared with other jobs slows both alike; the medians and their ratio are printed. The parts:

- ``rollout``: one training step's rollout, `tasks.rollout.play_episodes` of ``--tasks`` tasks of D_0 x
  ``rollout.group_size`` samples at ``rollout.temperature`` with the run seed, on an engine already open;
- ``update``: the GRPO update of those episodes, `tasks.update.grpo_update` (TRL's trainer built, one optimizer
  step, checkpoint written); before, ReplayGRPOTrainer scores with TRL's own `_get_per_token_logps_and_entropies`
  (every position projected onto the vocabulary), after, with its own (the trained tokens' positions only);
- ``evaluate``: greedy scoring of ``--eval-tasks`` held-out tasks and as many dev-like ones, configs/ablation.yaml's
  100 + 100: before, each split played on its own in calls of ``rollout.generate_batch`` by the old engine (as
  ``--before``'s `evaluate_splits` did); after, `tasks.evaluate.evaluate_splits` (rows written to a scratch
  warehouse), and again with ``rollout.prefill_batch`` 64 (a whole batch's prompts at once) and with
  ``rollout.eval_generate_batch`` 64 (calls of 64, the splits still together), to show those two levers alone.

The step's tasks are D_0's: ``--groups`` whose samples disagreed in a first play (round 0's steps trained 1-5 such
groups, 3 on average) and flat ones for the rest; the held-out tasks are the run's, the dev-like ones the
explorer's with another seed. The policy is the checkpoint the environment ships (envs/bfcl/checkpoint0, the
default's checkpoint 0). Every part runs once untimed first.

    .venv/bin/python benchmarks/step_levers.py --before 9049bb0^ --repeat 3
    .venv/bin/python benchmarks/step_levers.py --before 08cc210 --repeat 8 --parts rollout   # one part only

Prints one JSON line; benchmarks/STEP.md records the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from trl import GRPOTrainer

from agent.engines import make_engine
from agent.transformers_engine import free_device_memory
from coevolve.config import PipelineConfig
from envs.registry import make_environment
from tasks.common import open_warehouse
from tasks.evaluate import evaluate_splits
from tasks.rollout import play_episodes
from tasks.splits import build_initial_pools
from tasks.training.grpo_trainer import ReplayGRPOTrainer
from tasks.update import grpo_update

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "envs" / "bfcl" / "checkpoint0"


def module_at(revision: str, path: str, name: str, folder: Path) -> ModuleType:
    """The file ``path`` as it was at git ``revision``, written into ``folder`` and imported as module ``name``."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    copy = folder / f"{name}.py"
    copy.write_text(source)
    spec = importlib.util.spec_from_file_location(name, copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision whose engine and scoring are 'before'")
    parser.add_argument("--tasks", type=int, default=8, help="tasks of the step's batch (rollout.tasks_per_batch)")
    parser.add_argument("--groups", type=int, default=3, help="tasks of the batch whose samples disagreed")
    parser.add_argument("--eval-tasks", type=int, default=100, help="tasks of each of the two evaluation splits")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--parts", default="rollout,update,evaluate", help="the parts to time, comma-separated (all three by default)"
    )
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="step-levers-"))
    config = PipelineConfig(state_dir=scratch / "state")
    env = make_environment(config.environment)
    seed_pool, heldout_split = build_initial_pools(config)
    splits = {
        "heldout": heldout_split[: args.eval_tasks],
        "dev": env.build_tasks(args.eval_tasks, seed=103, calls_per_turn=config.pool.calls_per_turn),
    }
    old = module_at(args.before, "agent/transformers_engine.py", "before_transformers_engine", scratch)
    engines = {
        "before": old.TransformersEngine(CHECKPOINT, torch_threads=config.policy.torch_threads, seed=config.seed),
        "after": make_engine(CHECKPOINT, config),
    }
    ours = ReplayGRPOTrainer._get_per_token_logps_and_entropies

    def play(engine: Any, tasks: list, samples: int, temperature: float, batch: int) -> list:
        return play_episodes(
            engine, tasks, samples=samples, temperature=temperature, max_new_tokens=config.rollout.max_new_tokens,
            env_config=config.environment, run_id="bench", round_=0, batch_size=batch, progress=False,
            seed=config.seed,
        )  # fmt: skip

    def rollout(which: str) -> list:
        prefixes = getattr(engines[which], "prefixes", None)
        if prefixes is not None:
            prefixes.clear()  # a step's engine starts on the weights the last update wrote
        return play(
            engines[which], train_tasks, config.rollout.group_size, config.rollout.temperature,
            config.rollout.generate_batch,
        )  # fmt: skip

    def update(which: str) -> dict:
        scoring = ours if which == "after" else GRPOTrainer._get_per_token_logps_and_entropies
        ReplayGRPOTrainer._get_per_token_logps_and_entropies = scoring  # type: ignore[method-assign]
        try:
            return grpo_update(CHECKPOINT, episodes, config, scratch / f"update-{time.monotonic_ns()}")
        finally:
            ReplayGRPOTrainer._get_per_token_logps_and_entropies = ours  # type: ignore[method-assign]

    def evaluate(which: str) -> dict[str, float]:
        if which == "before":
            played = {
                split: play(engines["before"], tasks, 1, config.rollout.eval_temperature, config.rollout.generate_batch)
                for split, tasks in splits.items()
            }
            return {split: sum(t.success for t in p) / len(p) for split, p in played.items()}
        overrides = {
            "after": {},
            "after, prefill_batch 64": {"prefill_batch": 64},
            "after, eval_generate_batch 64": {"eval_generate_batch": 64},
        }[which]
        with open_warehouse(config) as wh:
            return evaluate_splits(config.with_overrides({"rollout": overrides}), wh, str(CHECKPOINT), splits, 0)

    figures: dict[str, dict[str, list[float]]] = {}
    outcomes: dict[str, Any] = {}
    played: dict[str, list[list[int]]] = {}

    def timed(part: str, which: str, what: Callable[[str], Any]) -> Any:
        started = time.perf_counter()
        result = what(which)
        figures.setdefault(part, {}).setdefault(which, []).append(round(time.perf_counter() - started, 3))
        return result

    try:
        # The step's batch: --groups tasks of D_0 whose samples disagreed, then flat ones (see the docstring).
        candidates = seed_pool[: 2 * args.tasks]
        first = play(
            engines["after"], candidates, config.rollout.group_size, config.rollout.temperature,
            config.rollout.generate_batch,
        )  # fmt: skip
        rewards: dict[str, set[float]] = {}
        for episode in first:
            rewards.setdefault(episode.task_id, set()).add(episode.reward)
        varied = [task for task in candidates if len(rewards[task.task_id]) > 1]
        flat = [task for task in candidates if len(rewards[task.task_id]) == 1]
        train_tasks = (varied[: args.groups] + flat)[: args.tasks]
        episodes = rollout("after")
        parts = args.parts.split(",")
        for which in ("before", "after"):  # untimed: imports, first collections, caches
            rollout(which)
            if "update" in parts:
                update(which)
        if "evaluate" in parts:
            evaluate("after")
        free_device_memory()  # as after a rollout stage's engine is closed: long-lived objects frozen
        for _ in range(args.repeat):
            for which in ("before", "after"):
                if "rollout" in parts:
                    played[which] = [e.completion_ids for e in timed("rollout", which, rollout)]
                if "update" in parts:
                    outcomes[f"update {which}"] = timed("update", which, update)["loss"]
            if "evaluate" in parts:
                for which in ("before", "after", "after, prefill_batch 64", "after, eval_generate_batch 64"):
                    outcomes[f"evaluate {which}"] = timed("evaluate", which, evaluate)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {part: {w: statistics.median(v) for w, v in runs.items()} for part, runs in figures.items()}
    print(
        json.dumps(
            {
                "before": args.before,
                "median_s": medians,
                "after_over_before": {p: round(m["after"] / m["before"], 3) for p, m in medians.items()},
                "all_s": figures,
                "outcomes": outcomes,
                "rollout_same_tokens": sum(a == b for a, b in zip(*played.values(), strict=True)) if played else None,
                "episodes": len(episodes),
                "model_tokens": sum(sum(t.completion_mask) for t in episodes),
                "trained_groups": len(varied[: args.groups]),
                "load_average": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
