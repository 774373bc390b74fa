"""The built-in ablation: does signal-guided co-evolution beat a static pool and random synthesis?

Every arm runs the same rounds with the same batch size, group size and update steps (equal
compute), from the same seed pool and checkpoint 0 (``pool.seed``); the random arm explores as many
targets as the signal arms select (equal task volume). Each (arm, seed) pair is its own run in the
warehouse, so everything is queryable afterwards; the report compares arms paired by seed.

Run: ``coevolve ablation --config configs/ablation.yaml [--arms static,random,full] [--seeds 1,2,3,4,5] [--rounds 5]``.
"""

from __future__ import annotations

import copy
from typing import Any

from prefect import flow

from coevolve.config import PipelineConfig
from coevolve.settings import apply_settings
from coevolve.errors import ConfigError
from coevolve.records import canonical_json
from flows.evaluate import coevolve_evaluate
from flows.round import coevolve_round
from tasks.report import report_task

# Arm name -> configuration overrides. "full" is the configuration as given.
ARMS: dict[str, dict[str, Any]] = {
    "static": {"synthesis": {"mode": "off"}},
    "random": {"synthesis": {"mode": "random"}},
    "full": {"synthesis": {"mode": "signal"}},
    "no-forgetting": {"synthesis": {"mode": "signal"}, "signals": {"enabled": ["boundary", "rare"]}},
    "no-boundary": {"synthesis": {"mode": "signal"}, "signals": {"enabled": ["forgetting", "rare"]}},
    "no-rare": {"synthesis": {"mode": "signal"}, "signals": {"enabled": ["forgetting", "boundary"]}},
}


def arm_config(base: PipelineConfig, arm: str, seed: int, name: str) -> PipelineConfig:
    """The configuration of one (arm, seed) run: the arm's overrides, its own run id and loop seed."""
    if arm not in ARMS:
        raise ValueError(f"unknown ablation arm {arm!r}; choose from {', '.join(ARMS)}")
    overrides = copy.deepcopy(ARMS[arm])
    overrides.update({"run_id": f"{name}-{arm}-s{seed}", "seed": seed})
    overrides.setdefault("pool", {})["seed"] = base.start_seed
    return base.with_overrides(overrides)


def arm_configs(base: PipelineConfig, arms: list[str], seeds: list[int], name: str) -> list[tuple[str, int, PipelineConfig]]:
    """Every (arm, seed) run's configuration, checked to be distinct runs before any of them starts.

    Raises ConfigError naming the arms when two runs resolve to one run id (they would share a pool
    and recorded stages, and the report would compare a run with itself), or when two arms of one seed
    resolve to the same settings (e.g. ``signals.enabled`` already leaves out what a leave-one-out arm
    removes), which would make the comparison empty.
    """
    runs = [(arm, seed, arm_config(base, arm, seed, name)) for seed in seeds for arm in arms]
    by_run_id: dict[str, list[str]] = {}
    by_settings: dict[tuple[int, str], list[str]] = {}
    for arm, seed, cfg in runs:
        by_run_id.setdefault(cfg.run_id, []).append(f"{arm} (seed {seed})")
        settings = cfg.model_dump(mode="json", exclude={"run_id"})
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
    for arm, seed, cfg in arm_configs(base, arms, seeds, name):
        summaries = [coevolve_round(round_=r, config=cfg.model_dump(mode="json")) for r in range(rounds)]
        official = coevolve_evaluate(
            checkpoint=summaries[-1]["checkpoint"],
            categories=["multi_turn_base"],
            heldout=False,
            config=cfg.model_dump(mode="json"),
            limit=official_limit,
        )
        results.append({"arm": arm, "seed": seed, "run_id": cfg.run_id, "rounds": summaries, "official": official})
    return report_task(base, name, results)
