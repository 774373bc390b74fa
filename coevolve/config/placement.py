"""Where each stage of a round runs, and how rounds of one run wait for each other."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from coevolve.config.base import Section


class PlacementConfig(Section):
    """Where each stage of a round runs: 'inline' in the round's process, or a deployment on a work pool."""

    rollout: str = Field(
        "inline", description="'inline', or the deployment that runs the stage, e.g. 'coevolve-stage/rollout-gpu'."
    )
    mine: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/mine-cpu'.")
    synthesize: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/synthesize-cpu'.")
    validate_: str = Field(
        "inline", alias="validate", description="'inline', or a deployment such as 'coevolve-stage/validate-cpu'."
    )
    update: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/update-gpu'.")
    evaluate: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/evaluate-gpu'.")
    stage_timeout_s: float = Field(
        6 * 3600.0,
        gt=0,
        description="Seconds the round waits for a deployed stage before failing it (a 4B update can take hours).",
    )
    round_concurrency: Literal["wait", "fail"] = Field(
        "wait",
        description=(
            "A second round of the same run started while one runs (on any machine that shares the Prefect server): "
            "'wait' until the first finishes (up to round_wait_s), or 'fail' at once naming the run."
        ),
    )
    round_wait_s: float = Field(
        24 * 3600.0, gt=0, description="Seconds a waiting round waits for the run's slot before it fails."
    )

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, serialize_by_alias=True)

    @field_validator("rollout", "mine", "synthesize", "validate_", "update", "evaluate")
    @classmethod
    def _deployment_name(cls, value: str) -> str:
        if value != "inline" and value.count("/") != 1:
            raise ValueError(
                f"{value!r} is neither 'inline' nor a deployment name '<flow>/<deployment>'; e.g. "
                "'coevolve-stage/rollout-gpu' (prefect.yaml defines one per placeable stage)."
            )
        return value

    def target(self, stage: str) -> str:
        """'inline' or the deployment of ``stage``."""
        return getattr(self, "validate_" if stage == "validate" else stage)
