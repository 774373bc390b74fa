"""The one typed configuration of the pipeline, and the only place defaults live.

Defaults are the embedded run: a 2-core laptop, no GPU, no network, three rounds in minutes.
Where that differs from the paper (arXiv 2604.15840), the comment gives the paper's value;
`configs/paper.yaml` sets all of them back for a GPU machine.

Sources, later ones winning, layered by pydantic-settings in `load_config`: defaults < YAML file
(``--config``) < environment variables (``COEVOLVE_<SECTION>__<FIELD>``, e.g.
``COEVOLVE_ROLLOUT__GROUP_SIZE=8``; list values as JSON) < CLI overrides (``--set rollout.group_size=8``).
A loaded configuration is a plain `PipelineConfig`: `PipelineConfig.with_overrides` and the flows
never read the environment again, so overrides given in code (an ablation arm's) always win.

One module per domain, each section declared once:

- `environment`: the environment, its limits and its own settings (`EnvironmentConfig`, `EnvironmentSettings`);
- `policy`: the model and the builtin tiny model's fine-tuning (`PolicyConfig`);
- `rollout`: the ``rollout`` section (`RolloutConfig`), its sampling fields, composed with
  `engines` (engine and server fields) and `evaluation` (evaluation splits), all flat under ``rollout``;
- `synthesis`: signals, synthesis, validation and the pool (`SignalConfig`, `SynthesisConfig`,
  `ValidationConfig`, `PoolConfig`);
- `training`: the GRPO update (`TrainingConfig`);
- `stores`: MLflow and the warehouse (`TrackingConfig`, `WarehouseConfig`);
- `placement`: where stages run (`PlacementConfig`);
- `pipeline`: the root (`PipelineConfig`) and its checks across sections;
- `loading`: the sources and their order (`load_config`, `parse_overrides`).
"""

from coevolve.config.environment import EnvironmentConfig, EnvironmentSettings
from coevolve.config.loading import load_config, parse_overrides
from coevolve.config.pipeline import PipelineConfig
from coevolve.config.placement import PlacementConfig
from coevolve.config.policy import PolicyConfig
from coevolve.config.rollout import RolloutConfig
from coevolve.config.stores import TrackingConfig, WarehouseConfig
from coevolve.config.synthesis import PoolConfig, SignalConfig, SynthesisConfig, ValidationConfig
from coevolve.config.training import TrainingConfig

__all__ = [
    "EnvironmentConfig",
    "EnvironmentSettings",
    "PipelineConfig",
    "PlacementConfig",
    "PolicyConfig",
    "PoolConfig",
    "RolloutConfig",
    "SignalConfig",
    "SynthesisConfig",
    "TrackingConfig",
    "TrainingConfig",
    "ValidationConfig",
    "WarehouseConfig",
    "load_config",
    "parse_overrides",
]
