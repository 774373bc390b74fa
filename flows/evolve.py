"""N co-evolution rounds in a row: the nightly evolution.

Run: ``coevolve evolve --rounds 3`` or the scheduled ``coevolve-evolve/nightly`` deployment.
Each round is its own ``coevolve-round`` flow run (a subflow), so a failure names its round and
the next evolution resumes from the first unfinished round.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from coevolve.config import PipelineConfig
from coevolve.settings import apply_settings
from flows.round import coevolve_round
from tasks.prepare import next_round_task


@flow(name="coevolve-evolve")
def coevolve_evolve(rounds: int = 3, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run ``rounds`` rounds, starting after the run's last finished round."""
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI
    start = next_round_task(cfg)
    return [coevolve_round(round_=r, config=cfg.model_dump(mode="json")) for r in range(start, start + rounds)]
