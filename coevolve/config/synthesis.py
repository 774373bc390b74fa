"""How the task pool grows: signals mined from trajectories, synthesis, validation and the pool itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from coevolve.config.base import Section
from coevolve.signals.registry import KINDS, SIGNAL_KINDS


def _signal_config() -> type[Section]:
    """The ``signals`` block: which kinds to mine, every registered kind's thresholds (coevolve/signals/), and how
    many signals a round passes to synthesis. A kind's settings are fields of this block, named as it names them."""
    enabled = Literal[SIGNAL_KINDS]  # type: ignore[valid-type]
    fields: dict[str, Any] = {
        "enabled": (
            list[enabled],
            Field(list(SIGNAL_KINDS), description="Signals to mine; leave one out for an ablation."),
        ),
    }
    for kind in KINDS.values():
        fields |= {name: (info.annotation, info) for name, info in kind.settings_type.model_fields.items()}
    fields["max_signals_per_round"] = (
        int,
        Field(24, ge=1, description="Signals passed to synthesis per round, kinds interleaved."),
    )
    model: type[Section] = create_model("SignalConfig", __base__=Section, __module__=__name__, **fields)
    return model


if TYPE_CHECKING:

    class SignalConfig(Section):
        """What the pipeline reads of the block itself; each kind reads its own settings (`SignalKind.settings`)."""

        enabled: list[str] = []
        max_signals_per_round: int = 24

else:
    SignalConfig = _signal_config()


class SynthesisConfig(Section):
    mode: Literal["signal", "random", "off"] = Field(
        "signal",
        description=(
            "'signal' explores where signals point; 'random' draws the same number of targets uniformly (the control); "
            "'off' keeps the seed pool static (GRPO on D_0 alone, the paper's baseline)."
        ),
    )
    synthesizer: Literal["programmatic", "llm"] = Field(
        "programmatic",
        description=(
            "'programmatic' needs no LLM (the offline default); 'llm' has a chat model on an OpenAI-compatible "
            "endpoint write the contexts, propose each exploration call and write the queries, as in the paper."
        ),
    )
    llm_base_url: str = Field(
        "http://127.0.0.1:8000/v1",
        description=(
            "OpenAI-compatible API root (ending in /v1) of the LLM synthesizer and the LLM judge; a local vLLM "
            "server by default."
        ),
    )
    llm_model: str = Field(
        "", description="Model name sent to the endpoint; required when synthesizer is 'llm' or the judge is on."
    )
    llm_api_key_env: str = Field(
        "OPENAI_API_KEY",
        description=(
            "Name of the environment variable holding the endpoint's API key, so no secret lives in a config file; "
            "unset sends none."
        ),
    )
    llm_temperature: float = Field(
        0.7, ge=0, description="Sampling temperature of synthesis calls: some variety across exploration runs."
    )
    llm_max_tokens: int = Field(384, ge=16, description="Tokens per LLM reply; contexts and single calls are short.")
    llm_timeout_s: float = Field(
        120.0, gt=0, description="Seconds per LLM request before it counts as an infrastructure failure."
    )
    explorations_per_signal: int = Field(2, ge=1, description="Independent exploration runs per signal (multi-round).")
    steps_per_exploration: int = Field(5, ge=1, description="Environment steps per exploration run (multi-step).")
    min_task_steps: int = Field(3, ge=1, description="Minimal reference length of a synthesized task (paper: 3).")
    max_task_steps: int = Field(5, ge=1, description="Longest reference kept, so the policy can fit it in one message.")


class ValidationConfig(Section):
    llm_judge: bool = Field(
        False,
        description=(
            "Also ask an LLM (synthesis.llm_* endpoint) to judge each replayed candidate on the paper's five criteria; "
            "off by default because the embedded run has no LLM endpoint."
        ),
    )
    embedding_dedupe: bool = Field(
        False,
        description=(
            "Reject candidates whose query is too similar to a pool task's (all-MiniLM-L6-v2 embeddings, optional "
            "extra 'similarity'); off by default: exact and normalized action-sequence dedupe already runs."
        ),
    )
    similarity_threshold: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Cosine similarity at or above which a candidate's query counts as a near-duplicate.",
    )


class PoolConfig(Section):
    seed_size: int = Field(100, ge=1, description="Tasks of D_0 from unguided exploration (paper: 100).")
    calls_per_turn: int | None = Field(
        2,
        ge=1,
        description=(
            "The target distribution: D_0, the dev and held-out splits and every synthesized task ask for 3-5 calls "
            "spread over user turns of at most this many calls (2: two or three turns), as the official multi-turn "
            "entries spread a job over several requests. None makes single-turn tasks."
        ),
    )
    policy: Literal["append", "dedupe"] = Field(
        "append", description="How validated tasks join the pool; the paper appends."
    )
    max_size: int | None = Field(None, ge=1, description="Cap on the pool; None keeps every task (the paper).")
    seed: int | None = Field(
        None,
        description=(
            "Seeds the seed pool, the held-out split and the builtin policy; None uses the run's seed. An ablation "
            "fixes it so every arm and every loop seed starts from the same pool and checkpoint 0."
        ),
    )
    sampler: Literal["uniform", "learnability", "band"] = Field(
        "uniform",
        description=(
            "How a training step draws its batch from the pool (tasks/samplers.py): 'uniform' (the paper: every task "
            "equally likely), 'learnability' (weight p(1-p) of the task's estimated success p, so tasks the policy "
            "sometimes solves come first), or 'band' (tasks whose estimate lies in band_low..band_high)."
        ),
    )
    prior_strength: float = Field(
        2.0,
        gt=0,
        description=(
            "Pseudo-episodes of the Beta prior of a task's success (its mean: the success of the pool's other tasks of "
            "its kind, those calling the same tools). 2 lets one group of 6 episodes outweigh the prior threefold "
            "while a task never played still gets the prior of its kind (v_task_difficulty)."
        ),
    )
    kind_strength: float = Field(
        6.0,
        gt=0,
        description=(
            "Pseudo-episodes of the pool's success rate in a kind's prior: a kind whose tasks have one group of 6 "
            "episodes between them is weighed half by them and half by the pool."
        ),
    )
    history_episodes: int = Field(
        24,
        ge=1,
        description=(
            "A task's most recent episodes its estimate counts (4 groups of 6): the policy changes every step, so "
            "older outcomes say less about how it does now."
        ),
    )
    weight_floor: float = Field(
        0.02,
        ge=0,
        le=0.25,
        description=(
            "The least weight a task gets under 'learnability' and 'band' (the largest p(1-p) is 0.25): every task "
            "keeps a chance, so a task estimated as always failed or always solved is still drawn now and then and "
            "its estimate can move."
        ),
    )
    sharpness: float = Field(
        4.0,
        gt=0,
        description=(
            "Exponent on every weight of 'learnability' and 'band': 1 draws in proportion to p(1-p); higher "
            "concentrates the draws on the most learnable tasks, which matters when tasks with little evidence "
            "outnumber those known to be learnable. 4 gave the highest informative share on dev of 1, 4 and 8 "
            "(docs/experiments.md, the curriculum's settings)."
        ),
    )
    explore_unplayed: bool = Field(
        False,
        description=(
            "Give a task never played the largest weight (0.25) instead of its prior's p(1-p). Off: a new task is "
            "drawn by what tasks of its kind scored, after tasks known to be learnable and before tasks known to be "
            "always failed or always solved; on dev, exploring first drew mostly new tasks (most of a growing pool is "
            "unplayed) and kept the informative share where uniform draws have it (docs/experiments.md)."
        ),
    )
    band_low: float = Field(0.2, ge=0, le=1, description="Lowest estimate 'band' keeps at full weight.")
    band_high: float = Field(0.8, ge=0, le=1, description="Highest estimate 'band' keeps at full weight.")

    @model_validator(mode="after")
    def _check_band(self) -> PoolConfig:
        if self.band_low > self.band_high:
            raise ValueError(
                f"pool.band_low ({self.band_low}) is above pool.band_high ({self.band_high}); "
                "set band_low <= band_high."
            )
        return self
