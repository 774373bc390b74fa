"""The workplace's own settings: what its checkpoint 0 is fine-tuned on. Fields of the ``environment`` configuration
section where environment.name is 'workplace', validated when the configuration loads (coevolve/config/environment.py
finds this model without importing the environment).
"""

from __future__ import annotations

from pydantic import Field

from coevolve.config.environment import EnvironmentSettings
from coevolve.config.policy import PolicyConfig


class WorkplaceSettings(EnvironmentSettings):
    sft_target_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description=(
            "Share of the builtin tiny model's policy.sft_tasks demonstrations that are jobs of the target's shape "
            "(3-5 calls over user turns of pool.calls_per_turn calls, from their own explorer seed, none of D_0 or a "
            "held-out split); the rest are the short 1-2 call tasks. A workplace request chains on looked-up values "
            "across turns, which the short tasks alone never show: at 0 checkpoint 0 solved no dev task, at 0.5 "
            "with sft_steps 2400 it solves 0.34 of them (docs/history/workplace_ablation_report_5rounds_floor.md)."
        ),
    )
    sft_steps: int = Field(
        2400,
        ge=0,
        description=(
            "SFT steps of the builtin tiny model on this environment's demonstrations, in place of policy.sft_steps: "
            "its jobs are longer than BFCL's and at 800 steps it still copied their values wrong (the loss was "
            "0.22 and falling); 2400 took it to 0.015."
        ),
    )

    def target_demonstrations(self) -> float:
        return self.sft_target_share

    def tiny_policy(self, policy: PolicyConfig) -> PolicyConfig:
        return policy.model_copy(update={"sft_steps": self.sft_steps})
