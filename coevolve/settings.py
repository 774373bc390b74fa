"""Process settings every entry point applies: offline switches, loopback, CPU kernels, state locations.

The CLI applies them before any library loads; every flow applies them again when it starts, so a
Prefect worker started from any directory (with none of these variables set) runs a stage the way
the CLI would. Values already set in the environment are kept: an operator's explicit choice wins.

    from coevolve.settings import apply_settings
    apply_settings(config)
"""

from __future__ import annotations

import os

from coevolve.config import PipelineConfig

# No hub, no telemetry, no analytics, servers and vLLM on loopback.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "TOKENIZERS_PARALLELISM": "false",
}

# policy.cpu_kernels = "avx2": the kernels every x86 CPU of the last decade has, so AVX2 and AVX-512
# machines compute the same bits (torch's ATen, MKL's conditional numerical reproducibility, oneDNN).
AVX2_KERNELS_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def apply_settings(config: PipelineConfig, *, prefect_home: bool = False) -> None:
    """Set the offline switches, CPU kernels and state locations that are not set yet.

    ``prefect_home``: also point Prefect's home into the state folder (the CLI does, before Prefect
    loads; a worker already has its own).
    """
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if config.policy.cpu_kernels == "avx2":
        for key, value in AVX2_KERNELS_ENV.items():
            os.environ.setdefault(key, value)
    state = config.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    if prefect_home:
        os.environ.setdefault("PREFECT_HOME", str(state / "prefect"))
        # The per-round table is the main output; Prefect's own INFO lines go to its API and UI.
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
