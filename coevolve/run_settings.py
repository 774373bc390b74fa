"""The settings that decide a run's results: what a round records when it starts, and what a later command on the
same run must match.

A round resumed with other settings would mix its recorded stages with the new ones (storage/round_records.py
refuses it), and a finished run asked again with another environment or schedule would answer for a run it is not
(storage/state_version.py refuses it). Settings that change only how a run is carried out (workers, servers,
where state lives) are left out, so moving a run or adding a worker continues it.
"""

from __future__ import annotations

from typing import Any

from coevolve.config import PipelineConfig
from coevolve.config.policy import WARMUP_SETTINGS

# The configuration that decides a round's results: a round resumed with other values would mix episodes, signals or
# updates made under both. Endpoints, timeouts, placement, tracking and storage do not change what a round computes
# and may change between attempts. training.torch_threads is left out too: like the device, it changes only the last
# bits of an update's sums (runs agree in distribution), and rounds recorded before it existed resume unrefused.
RESULT_SECTIONS: tuple[str, ...] = ("environment", "policy", "signals", "synthesis", "validation", "pool")
RESULT_FIELDS: dict[str, tuple[str, ...]] = {
    "rollout": ("tasks_per_batch", "group_size", "temperature", "eval_temperature", "max_new_tokens", "heldout_tasks",
                "dev_eval_tasks"),
    "training": ("learning_rate", "batches_per_round", "updates_per_batch", "carry_optimizer", "epsilon_low",
                 "epsilon_high", "beta", "kl_reference", "use_lora", "lora_rank"),
}  # fmt: skip


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config to MLflow params: ``{"rollout": {"group_size": 6}}`` -> ``{"rollout.group_size": 6}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def round_settings(config: PipelineConfig) -> dict[str, Any]:
    """The flattened settings a round records when it starts (RESULT_SECTIONS, RESULT_FIELDS and the seed)."""
    data = config.model_dump(mode="json")
    chosen: dict[str, Any] = {"seed": data["seed"]}
    chosen.update(flatten({k: data[k] for k in RESULT_SECTIONS}))
    for section, names in RESULT_FIELDS.items():
        chosen.update({f"{section}.{n}": data[section][n] for n in names})
    if not config.policy.warmup_steps:
        # Without a warm-up they decide nothing, and rounds recorded before they existed resume unrefused.
        for name in WARMUP_SETTINGS:
            chosen.pop(f"policy.{name}", None)
    return chosen


def changed_settings(recorded: dict[str, Any], current: dict[str, Any], shown: int = 4) -> str:
    """The settings that differ, ``name: recorded -> current``, the first ``shown`` of them; empty when none do."""
    changed = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
    listed = ", ".join(f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in changed[:shown])
    more = f" and {len(changed) - shown} more" if len(changed) > shown else ""
    return listed + more
