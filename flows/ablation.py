"""The built-in ablation: does signal-guided co-evolution beat a static pool and random synthesis?

Every arm runs the same rounds with the same batch size, group size and update steps (equal
compute), from the same seed pool and checkpoint 0 (``pool.seed``); the random arm explores as many
targets as the signal arms select (equal task volume). Each (arm, seed) pair is its own run in the
warehouse, so everything is queryable afterwards; the report compares arms paired by seed and task.

With ``rollout.final_heldout_tasks`` > 0 (configs/ablation.yaml: 500), checkpoint 0 is scored on the
final held-out split once per ablation (rows under run ``<name>-checkpoint-0``) and every run's final
checkpoint once, after its last round; the per-round evaluation keeps the 100-task split, so the
larger split costs two evaluations per run's worth of time instead of one per round.

Run: ``coevolve ablation --config configs/ablation.yaml [--arms static,random,full] [--seeds 1,2,3,4,5] [--rounds 5]``.
"""

from __future__ import annotations

import copy
from typing import Any

from prefect import flow

from coevolve.config import PipelineConfig
from coevolve.settings import apply_settings
from coevolve.errors import ConfigError, DataError
from coevolve.records import Task, canonical_json
from flows.evaluate import coevolve_evaluate
from flows.round import coevolve_round
from tasks.common import FINAL_HELDOUT_ROUND, HELDOUT_ROUND, open_warehouse
from tasks.evaluate import evaluate_checkpoint
from tasks.report import FINAL_SPLIT, report_task

# Arm name -> configuration overrides. "full" is the configuration as given.
ARMS: dict[str, dict[str, Any]] = {
    "static": {"synthesis": {"mode": "off"}},
    "random": {"synthesis": {"mode": "random"}},
    "full": {"synthesis": {"mode": "signal"}},
    "no-forgetting": {"synthesis": {"mode": "signal"}, "signals": {"enabled": ["boundary", "rare"]}},
    "no-boundary": {"synthesis": {"mode": "signal"}, "signals": {"enabled": ["forgetting", "rare"]}},
    "no-rare": {"synthesis": {"mode": "signal"}, "signals": {"enabled": ["forgetting", "boundary"]}},
}


def arm_config(base: PipelineConfig, arm: str, seed: int, name: str, checkpoint0_scores_from: str | None = None) -> PipelineConfig:
    """The configuration of one (arm, seed) run: the arm's overrides, its own run id and loop seed.

    ``checkpoint0_scores_from``: the run whose scores of the shared checkpoint 0 this run copies.
    """
    if arm not in ARMS:
        raise ValueError(f"unknown ablation arm {arm!r}; choose from {', '.join(ARMS)}")
    overrides = copy.deepcopy(ARMS[arm])
    overrides.update({"run_id": f"{name}-{arm}-s{seed}", "seed": seed})
    overrides.setdefault("pool", {})["seed"] = base.start_seed
    if checkpoint0_scores_from:
        overrides.setdefault("rollout", {})["checkpoint0_scores_from"] = checkpoint0_scores_from
    return base.with_overrides(overrides)


def arm_configs(base: PipelineConfig, arms: list[str], seeds: list[int], name: str) -> list[tuple[str, int, PipelineConfig]]:
    """Every (arm, seed) run's configuration, checked to be distinct runs before any of them starts.

    Raises ConfigError naming the arms when two runs resolve to one run id (they would share a pool
    and recorded stages, and the report would compare a run with itself), or when two arms of one seed
    resolve to the same settings (e.g. ``signals.enabled`` already leaves out what a leave-one-out arm
    removes), which would make the comparison empty.
    """
    # Every run shares checkpoint 0 (pool.seed) and its evaluation settings: the first run scores it, the others copy.
    first = f"{name}-{arms[0]}-s{seeds[0]}" if arms and seeds else None
    runs = [
        (arm, seed, arm_config(base, arm, seed, name, None if (arm, seed) == (arms[0], seeds[0]) else first))
        for seed in seeds
        for arm in arms
    ]
    by_run_id: dict[str, list[str]] = {}
    by_settings: dict[tuple[int, str], list[str]] = {}
    for arm, seed, cfg in runs:
        by_run_id.setdefault(cfg.run_id, []).append(f"{arm} (seed {seed})")
        settings = cfg.model_dump(mode="json", exclude={"run_id": True, "rollout": {"checkpoint0_scores_from": True}})
        by_settings.setdefault((seed, canonical_json(settings)), []).append(arm)
    for run_id, names in by_run_id.items():
        if len(names) > 1:
            raise ConfigError(f"Ablation runs {', '.join(names)} all resolve to run id {run_id!r}; give each arm and seed its own.")
    for (seed, _), names in by_settings.items():
        if len(names) > 1:
            raise ConfigError(
                f"Ablation arms {', '.join(names)} resolve to the same settings for seed {seed}, so comparing them "
                "measures nothing; check the base configuration's synthesis.mode and signals.enabled, or drop one arm."
            )
    return runs


def checkpoint0_run_id(name: str) -> str:
    """The run id under which an ablation stores checkpoint 0's scores on the final held-out split (one per ablation)."""
    return f"{name}-checkpoint-0"


def score_once(config: PipelineConfig, checkpoint: str, tasks: list[Task], round_: int) -> dict[str, bool]:
    """``checkpoint``'s outcomes on the final held-out split under (config.run_id, round_), scored only if not stored yet."""
    with open_warehouse(config) as wh:
        stored = wh.evaluation_outcomes(config.run_id, round_, FINAL_SPLIT)
    if len(stored) < len(tasks):
        evaluate_checkpoint(config, checkpoint, tasks, round_, FINAL_SPLIT)
        with open_warehouse(config) as wh:
            stored = wh.evaluation_outcomes(config.run_id, round_, FINAL_SPLIT)
    return stored


def final_heldout_of(config: PipelineConfig) -> tuple[list[Task], dict]:
    """A run's stored final held-out split and its round-0 prepare output (checkpoint 0, its digest, the split's digest)."""
    with open_warehouse(config) as wh:
        return wh.pool(config.run_id, FINAL_HELDOUT_ROUND), wh.stage_output(config.run_id, 0, "prepare") or {}


def score_final_heldout(base: PipelineConfig, name: str, cfg: PipelineConfig, summaries: list[dict], baseline: dict) -> dict[str, Any]:
    """Score one run's final checkpoint on the final held-out split, and checkpoint 0 the first time only.

    ``baseline`` holds the split's digest, checkpoint 0's digest and its outcomes, filled by the first
    run, so an ablation scores its shared checkpoint 0 once. Every run must hold the same split and
    start from the same checkpoint 0: both come from ``pool.seed``, which every arm shares.
    """
    tasks, prepared = final_heldout_of(cfg)
    if not tasks:
        return {}
    shared = {"split_digest": prepared.get("final_heldout_digest"), "checkpoint_digest": prepared.get("checkpoint_digest")}
    for key, value in shared.items():
        if baseline.setdefault(key, value) != value:
            raise DataError(
                f"Run {cfg.run_id!r} has {key.replace('_', ' ')} {str(value)[:16]}, not {str(baseline[key])[:16]} like the "
                "ablation's other runs: its arms must share pool.seed and the policy settings. Give them the same, or a new name."
            )
    if "outcomes" not in baseline:
        ckpt0_config = base.with_overrides({"run_id": checkpoint0_run_id(name)})
        baseline["outcomes"] = score_once(ckpt0_config, prepared["checkpoint"], tasks, HELDOUT_ROUND)
    final = score_once(cfg, summaries[-1]["checkpoint"], tasks, summaries[-1]["round"])
    return {
        "final_heldout_outcomes": final,
        "final_baseline_outcomes": baseline["outcomes"],
        "final_heldout_size": len(tasks),
        "final_heldout_digest": shared["split_digest"],
    }


@flow(name="coevolve-ablation")
def coevolve_ablation(
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    rounds: int = 5,
    official_limit: int | None = 50,
    name: str = "ablation",
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every arm for every seed, score the final checkpoints, and write the report."""
    base = PipelineConfig.model_validate(config or {})
    apply_settings(base)  # a worker started anywhere runs like the CLI
    arms = list(arms or ARMS)
    seeds = list(seeds or [1, 2, 3, 4, 5])
    results: list[dict[str, Any]] = []
    baseline: dict[str, Any] = {}
    for arm, seed, cfg in arm_configs(base, arms, seeds, name):
        summaries = [coevolve_round(round_=r, config=cfg.model_dump(mode="json")) for r in range(rounds)]
        official = coevolve_evaluate(
            checkpoint=summaries[-1]["checkpoint"],
            categories=["multi_turn_base"],
            heldout=False,
            config=cfg.model_dump(mode="json"),
            limit=official_limit,
        )
        final = score_final_heldout(base, name, cfg, summaries, baseline)
        results.append({"arm": arm, "seed": seed, "run_id": cfg.run_id, "rounds": summaries, "official": official, **final})
    return report_task(base, name, results)
