"""The root of the configuration: the run, its state folder, every section, and checks across sections."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from coevolve.config.base import Section, deep_merge, explain
from coevolve.config.environment import EnvironmentConfig
from coevolve.config.placement import PlacementConfig
from coevolve.config.policy import PolicyConfig
from coevolve.config.rollout import RolloutConfig
from coevolve.config.stores import TrackingConfig, WarehouseConfig
from coevolve.config.synthesis import PoolConfig, SignalConfig, SynthesisConfig, ValidationConfig
from coevolve.config.training import TrainingConfig
from coevolve.errors import ConfigError

# A run id names a folder (state_dir/runs/<run_id>), a Hive partition of every table (run_id=<run_id>), catalog
# records (catalog/runs/<run_id>.json) and the run's registered model. So it takes only characters every one of
# those keeps as they are, and starts with a letter or digit: '.' and '..' would put the run's files in other
# folders, a leading '.' hides them, and '_' starts the warehouse's own names (its placeholder partition
# run_id=_empty, which every view leaves out, so a run of that name would be invisible). The length keeps the
# longest file name made from it (a catalog record's partial file) under the filesystems' 255 bytes.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
RUN_ID_RULE = (
    "Run ids are up to 100 letters, digits, '_', '.' and '-', starting with a letter or digit (so not '.', '..' or "
    "'_empty', the warehouse's placeholder)"
)


class PipelineConfig(Section):
    run_id: str = Field(
        "default",
        description=f"Names a run; rounds of one run share a pool. {RUN_ID_RULE}.",
    )
    state_dir: Path = Field(
        Path(".coevolve"),
        description=(
            "Holds the warehouse, MLflow store, checkpoints, pool snapshots. Made absolute when the configuration "
            "loads, so recorded checkpoint paths never depend on the working directory (a relative path that went "
            "missing would otherwise look like a hub model id)."
        ),
    )
    # Off by default: a state folder then holds everything its run needs. A lab running many runs with the same
    # builtin:tiny settings on one machine (an ablation's seeds, a test suite) builds checkpoint 0 once instead.
    policy_cache_dir: Path | None = Field(
        None,
        description=(
            "A folder shared by state folders where builds of the builtin tiny policy are kept by their recipe key: "
            "round 0 copies a matching build from it into its state folder instead of building, and adds the builds "
            "it makes. Only a build whose digest matches today's recipe is copied. None: no shared folder."
        ),
    )
    seed: int = Field(0, description="Seeds exploration, sampling and training.")
    rounds: int = Field(
        3,
        ge=1,
        description=(
            "The evolve command's target: it runs until rounds 0..rounds-1 are finished, so the same command run "
            "again after an interruption resumes and stops there (`--more K` asks for K more rounds instead)."
        ),
    )
    # Two: a round's torch work uses one thread (policy.torch_threads), so one seed's chain of runs keeps one
    # core busy, and two chains at once fill the 2-core machine this default is for. More than the cores
    # only makes the chains take turns. Never changes a result: each seed's runs are the same either way.
    ablation_workers: int = Field(
        2, ge=1, description="Seeds whose runs the ablation command plays at the same time, each in its own process."
    )
    # Five: every arm of the built-in ablation at its earlier schedule (20 optimizer steps,
    # configs/ablation_20steps.yaml); configs/ablation.yaml sets 14, the paper's length of 120 steps a run.
    ablation_rounds: int = Field(
        5, ge=1, description="Rounds of every (arm, seed) run of the ablation command, the same for every arm."
    )
    environment: EnvironmentConfig = EnvironmentConfig()
    policy: PolicyConfig = PolicyConfig()
    rollout: RolloutConfig = RolloutConfig()
    signals: SignalConfig = SignalConfig()
    synthesis: SynthesisConfig = SynthesisConfig()
    validation: ValidationConfig = ValidationConfig()
    pool: PoolConfig = PoolConfig()
    training: TrainingConfig = TrainingConfig()
    tracking: TrackingConfig = TrackingConfig()
    warehouse: WarehouseConfig = WarehouseConfig()
    placement: PlacementConfig = PlacementConfig()

    @field_validator("run_id", mode="before")
    @classmethod
    def _digits_are_a_name(cls, value: Any) -> Any:
        # `--set run_id=2024` and an unquoted `run_id: 2024` arrive as YAML integers; as a name they are text.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("run_id", mode="after")
    @classmethod
    def _usable_run_id(cls, value: str) -> str:
        if RUN_ID_PATTERN.fullmatch(value) is None:
            raise PydanticCustomError("run_id", RUN_ID_RULE)
        return value

    @field_validator("state_dir", mode="after")
    @classmethod
    def _absolute_state_dir(cls, value: Path) -> Path:
        return Path(os.path.abspath(value.expanduser()))

    @field_validator("policy_cache_dir", mode="after")
    @classmethod
    def _absolute_cache_dir(cls, value: Path | None) -> Path | None:
        return None if value is None else Path(os.path.abspath(value.expanduser()))

    @model_validator(mode="after")
    def _check_ranges(self) -> PipelineConfig:
        env = self.environment
        settings = env.settings()
        completed = settings.for_policy(self.policy.model)
        if completed != settings:
            # Filled in once so every stage (rollout, evaluation, synthesis) reads the same values.
            self.__dict__["environment"] = env.model_copy(update=completed.model_dump())
        if self.synthesis.max_task_steps < self.synthesis.min_task_steps:
            raise ValueError(
                f"synthesis.max_task_steps ({self.synthesis.max_task_steps}) is below synthesis.min_task_steps "
                f"({self.synthesis.min_task_steps}); raise max_task_steps or lower min_task_steps."
            )
        if self.policy.sft_max_calls < self.policy.sft_min_calls:
            raise ValueError(
                f"policy.sft_max_calls ({self.policy.sft_max_calls}) is below policy.sft_min_calls "
                f"({self.policy.sft_min_calls}); raise sft_max_calls or lower sft_min_calls."
            )
        server = (self.tracking.mlflow_uri or "").startswith(("http://", "https://"))
        if self.tracking.register_checkpoints == "uri" and server:
            raise ValueError(
                f"tracking.register_checkpoints='uri' cannot be used with the MLflow tracking server "
                f"{self.tracking.mlflow_uri}: a server refuses to register a local checkpoint folder (a file:// source "
                "outside the run's artifacts). Use tracking.register_checkpoints=copy, or a store of your own "
                "(tracking.mlflow_uri unset, or sqlite:///<shared path>) to register the folder where it is."
            )
        needs_llm = self.synthesis.synthesizer == "llm" or self.validation.llm_judge
        if needs_llm and not self.synthesis.llm_model:
            raise ValueError(
                "synthesis.llm_model is empty but synthesis.synthesizer is 'llm' or validation.llm_judge is on; "
                "set synthesis.llm_model to the endpoint's model name (and synthesis.llm_base_url to its /v1 root)."
            )
        return self

    @property
    def start_seed(self) -> int:
        """The seed of everything round 0 builds: seed pool, held-out split, checkpoint 0."""
        return self.seed if self.pool.seed is None else self.pool.seed

    # Paths derived from state_dir, so one setting moves every store.
    @property
    def warehouse_path(self) -> Path | str:
        """The warehouse root: ``warehouse.uri``, else the folder ``state_dir/warehouse``."""
        return self.warehouse.uri or self.state_dir / "warehouse"

    @property
    def mlflow_tracking_uri(self) -> str:
        return self.tracking.mlflow_uri or f"sqlite:///{(self.state_dir / 'mlflow.db').resolve()}"

    @property
    def registered_model_name(self) -> str:
        """The run's own registered model: ``<tracking.registered_model>-<run_id>``."""
        return f"{self.tracking.registered_model}-{self.run_id}"

    @property
    def artifacts_dir(self) -> Path:
        return self.state_dir / "mlartifacts"

    def run_dir(self) -> Path:
        return self.state_dir / "runs" / self.run_id

    def checkpoint_dir(self, round_: int) -> Path:
        return self.run_dir() / "checkpoints" / f"round-{round_:03d}"

    def checkpoint_after(self, round_: int, step: int) -> Path:
        """The checkpoint training step ``step`` of round ``round_`` writes (checkpoint ``round_ + 1`` at the last)."""
        if step >= self.training.batches_per_round - 1:
            return self.checkpoint_dir(round_ + 1)
        return self.run_dir() / "checkpoints" / f"round-{round_:03d}-step-{step + 1:02d}"

    def pool_path(self, round_: int) -> Path:
        return self.run_dir() / "pools" / f"pool-{round_:03d}.parquet"

    def with_overrides(self, overrides: dict[str, Any]) -> PipelineConfig:
        """This configuration with ``overrides`` applied: values given in code win, the environment is not read."""
        try:
            return PipelineConfig.model_validate(deep_merge(self.model_dump(mode="json"), overrides))
        except ValidationError as exc:
            raise ConfigError(explain(exc)) from None
