"""The ``rollout`` section: sampling of training rollouts, composed with engines, servers and evaluation.

One flat section, as configs/*.yaml, prefect.yaml, ``COEVOLVE_ROLLOUT__*`` and ``--set rollout.*``
spell it; its fields are declared by concern in `coevolve.config.engines` and
`coevolve.config.evaluation`. Pydantic orders the fields of bases last-listed first, so the bases
are listed in reverse and the section shows its fields in their usual order.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from coevolve.config.base import Section
from coevolve.config.engines import EngineSettings, ServerSettings
from coevolve.config.evaluation import EvaluationSettings
from coevolve.plugins import declared_names

# The gates tasks/curriculum.py builds in (tests/flows/test_gate_plugin.py checks the lists agree), and the
# entry-point group under which an installed package declares another; the names are read without importing it.
BUILT_IN_GATES: tuple[str, ...] = ("informative",)
GATE_ENTRY_POINTS = "coevolve.gates"


def gate_names() -> list[str]:
    """Every gate rollout.gates may name here: the built-in ones, then those installed packages declare."""
    return [*BUILT_IN_GATES, *declared_names(GATE_ENTRY_POINTS)]


class SamplingSettings(Section):
    # What a step samples: tasks, the GRPO group, temperatures and message length.
    RENAMED: ClassVar[dict[str, str]] = {
        "tasks_per_round": (
            "it is now rollout.tasks_per_batch, the tasks of each of a round's training.batches_per_round batches."
        )
    }
    tasks_per_batch: int = Field(
        8,
        ge=1,
        description=(
            "Tasks drawn from the pool for each training step's batch (paper: 32); 3 steps x 8 tasks x 6 samples "
            "keep the 144 episodes a round the embedded default always played (chosen on dev with "
            "training.batches_per_round)."
        ),
    )
    group_size: int = Field(
        6, ge=2, description="Samples per task, the GRPO group n (paper: 8). At least 2 for an advantage."
    )
    temperature: float = Field(0.9, ge=0, description="Sampling temperature of training rollouts (paper: 0.9).")
    eval_temperature: float = Field(0.0, ge=0, description="Evaluation decoding; 0 is greedy (paper: greedy).")
    # At most 131072 (128K), the longest context window of today's open models: a message cannot be longer than
    # the context it is generated in, and engines allocate buffers sized by it (10^12 asked for terabytes).
    max_new_tokens: int = Field(96, ge=8, le=131072, description="Tokens per model message (paper: 4096 per response).")
    dynamic_sampling: bool = Field(
        False,
        description=(
            "After a batch is played, groups whose rewards are all equal stay in the warehouse (the miner reads "
            "them) but do not count toward the update; replacement tasks drawn by pool.sampler are played until the "
            "step has tasks_per_batch groups with reward variance or has played max_rollout_factor x its episodes "
            "(DAPO's dynamic sampling). Off: the paper trains on whatever groups the batch gives."
        ),
    )
    max_rollout_factor: float = Field(
        2.0,
        ge=1,
        description=(
            "With dynamic_sampling or gates, the most episodes a step plays, in multiples of tasks_per_batch x "
            "group_size: bounds what a step costs when few groups are admitted."
        ),
    )
    gates: list[str] = Field(
        [],
        description=(
            "Admission gates besides dynamic_sampling's (which is the gate 'informative'): a group counts toward the "
            "update only when every gate admits it, and replacements are drawn as dynamic_sampling draws them. "
            "Installed packages declare gates (entry-point group coevolve.gates, docs/extending.md); none by default."
        ),
    )

    @field_validator("gates")
    @classmethod
    def _known_gates(cls, value: list[str]) -> list[str]:
        known = gate_names()
        unknown = [name for name in value if name not in known]
        if unknown:
            raise ValueError(f"unknown gate(s) {unknown}; use {known}, or install the package that declares them")
        return value


class RolloutConfig(EvaluationSettings, SamplingSettings, ServerSettings, EngineSettings):
    generate_batch: int = Field(
        64,
        ge=1,
        description=(
            "Episodes per generate call; one call's environment steps run while the next call generates. 64 bounds "
            "transformers' padded batch memory on a CPU; vLLM schedules its own batches, so raise it there."
        ),
    )

    @model_validator(mode="after")
    def _check_engine(self) -> RolloutConfig:
        if self.managed_servers > 0:
            if self.engine != "openai":
                raise ValueError(
                    f"rollout.managed_servers={self.managed_servers} starts servers for engine 'openai', but "
                    f"rollout.engine is {self.engine!r}; set rollout.engine=openai or rollout.managed_servers=0."
                )
            if self.base_url or self.base_urls:
                raise ValueError(
                    f"rollout.managed_servers={self.managed_servers} starts the pipeline's own servers, so "
                    "rollout.base_url and rollout.base_urls must be empty; remove them to use managed servers, or "
                    "set rollout.managed_servers=0 to use the servers at those URLs."
                )
        elif self.weight_sync == "restart":
            raise ValueError(
                "rollout.weight_sync=restart restarts servers the pipeline starts itself, but "
                "rollout.managed_servers is 0; set rollout.managed_servers=1 (or more), or choose weight_sync auto, "
                "lora, reload or off for servers at rollout.base_url(s)."
            )
        if self.engine == "openai" and not self.base_url and not self.base_urls and self.managed_servers == 0:
            raise ValueError(
                "rollout.engine is 'openai' but rollout.base_url is not set; give the server URL, e.g. "
                "http://127.0.0.1:8000/v1, or let the pipeline start its own servers with rollout.managed_servers=1."
            )
        return self
