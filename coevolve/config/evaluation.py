"""What each round scores its checkpoint on: the held-out, final held-out and dev splits.

Fields of the ``rollout`` section (`RolloutConfig` composes them): their YAML keys, variables and
overrides are ``rollout.*``. Evaluation decodes at ``rollout.eval_temperature``.
"""

from __future__ import annotations

from pydantic import Field

from coevolve.config.base import Section


class EvaluationSettings(Section):
    # Evaluation splits sized and reused across runs; every split is scored greedily by default.
    heldout_tasks: int = Field(
        100,
        ge=0,
        description=(
            "Held-out synthetic tasks scored greedily after each round; 100 resolves about 0.04 (one sd 0.03 at 10%)."
        ),
    )
    final_heldout_tasks: int = Field(
        0,
        ge=0,
        description=(
            "Size of the final held-out split (tasks/splits.build_final_heldout): frozen at round 0, refused by "
            "validation, and scored by the ablation only on checkpoint 0 (once) and each run's final checkpoint, "
            "where its power is needed; 0 leaves it out. configs/ablation.yaml sets 500 (one sd about 0.018 at 0.2, "
            "against 0.04 on 100)."
        ),
    )
    checkpoint0_scores_from: str | None = Field(
        None,
        description=(
            "Run id whose round-0 scores of checkpoint 0 (held-out and dev rows) this run copies instead of scoring "
            "it again, when that run's checkpoint 0 has the same digest and its rows cover the same tasks; the "
            "ablation sets it to its first run for every other run, whose evaluation settings are the same, so "
            "checkpoint 0 is scored once."
        ),
    )
    eval_generate_batch: int = Field(
        256,
        ge=1,
        description=(
            "Episodes per generate call when a checkpoint is scored; the held-out and dev splits are played together. "
            "256 takes configs/ablation.yaml's 200 evaluation tasks in one call a turn: a greedy batch drops its "
            "finished rows and reads its prompts rollout.prefill_batch at a time, so a large call costs its KV cache "
            "only; calls of 64 measured within noise of it on a CPU (benchmarks/STEP.md)."
        ),
    )
    dev_eval_tasks: int = Field(
        0,
        ge=0,
        description=(
            "Dev tasks (the first N of tasks/splits.build_dev_split) each round's checkpoint, and checkpoint 0, are "
            "also scored on greedily, for the report's dev curve; 0 skips it, so a round costs one evaluation."
        ),
    )
