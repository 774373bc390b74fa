"""The built-in ablation's arms: each arm's name and the configuration overrides that make it.

The one registry of arms: flows/ablation.py runs them, tasks/ablation/report_summary.py groups them into families
of comparisons, and `coevolve ablation --help` lists them. The leave-one-out arms follow from the signal kinds'
registry. It imports nothing heavy, so the command line can name the arms before the flows (and Prefect) load.
"""

from __future__ import annotations

import copy
from typing import Any

from coevolve.signals import SIGNAL_KINDS

# The suffix of an arm that is its base arm with the learnability curriculum on.
CURRICULUM_SUFFIX = "+learnability"
# Base arms whose curriculum arm is compared with them (family "curriculum on vs off").
CURRICULUM_BASES: tuple[str, ...] = ("static", "random", "full")
# The most episodes a curriculum arm's step may play, in multiples of its batch (rollout.max_rollout_factor):
# 2 lets a step replace every group of its batch once; its batch is the base batch / 2, so it plays at most
# what a base arm plays.
CURRICULUM_ROLLOUT_FACTOR = 2.0
# What an arm adds to its base arm to turn the curriculum on (the batch size is set by flows/ablation.arm_config).
CURRICULUM: dict[str, Any] = {
    "pool": {"sampler": "learnability"},
    "rollout": {"dynamic_sampling": True, "max_rollout_factor": CURRICULUM_ROLLOUT_FACTOR},
}


def _with_curriculum(overrides: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(overrides), **copy.deepcopy(CURRICULUM)}


# Arm name -> configuration overrides. "full" is the configuration as given.
ARMS: dict[str, dict[str, Any]] = {
    "static": {"synthesis": {"mode": "off"}},
    "random": {"synthesis": {"mode": "random"}},
    "full": {"synthesis": {"mode": "signal"}},
}
# One leave-one-out arm per registered signal kind (coevolve/signals/): signal-guided with that kind left out.
ARMS |= {
    f"no-{kind}": {"synthesis": {"mode": "signal"}, "signals": {"enabled": [k for k in SIGNAL_KINDS if k != kind]}}
    for kind in SIGNAL_KINDS
}
ARMS |= {f"{arm}{CURRICULUM_SUFFIX}": _with_curriculum(ARMS[arm]) for arm in CURRICULUM_BASES}


def arm_run_label(arm: str) -> str:
    """An arm's name as it appears in run ids: ``+`` spelled ``_`` (run ids take letters, digits, _ . -)."""
    return arm.replace("+", "_")
