"""The workplace's own settings: what its checkpoint 0 is fine-tuned on. Fields of the ``environment`` configuration
section where environment.name is 'workplace', validated when the configuration loads (coevolve/config/environment.py
finds this model without importing the environment).
"""

from __future__ import annotations

from pydantic import Field

from coevolve.config.environment import EnvironmentSettings


class WorkplaceSettings(EnvironmentSettings):
    sft_target_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description=(
            "Share of the builtin tiny model's policy.sft_tasks demonstrations that are jobs of the target's shape "
            "(3-5 calls over user turns of pool.calls_per_turn calls, from their own explorer seed, none of D_0 or a "
            "held-out split); the rest are the short 1-2 call tasks. 0 keeps the shipped checkpoint 0's recipe. At "
            "0.5 and the same 800 SFT steps, checkpoint 0 learns the jobs' shape (it reaches second turns and waits "
            "for lookups across them) but copies the requests' values worse, and still solves no held-out task "
            "(docs/workplace_ablation_report.md); more SFT steps for this environment are the next thing to try."
        ),
    )

    def target_demonstrations(self) -> float:
        return self.sft_target_share
