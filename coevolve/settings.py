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

# A command whose output other than its table goes to a log file (coevolve/console.py): MLflow's records
# reach the log's handler instead of a stderr handler of its own, and the Hugging Face libraries draw no
# bars (they would leave lines between the table's rows, or fill the log), here and in processes a round starts.
LOG_FILE_ENV = {
    "MLFLOW_CONFIGURE_LOGGING": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}


def apply_settings(
    config: PipelineConfig, *, prefect_home: bool = False, log_file: bool = False, create_state: bool = True
) -> None:
    """Set the offline switches, CPU kernels and state locations that are not set yet.

    ``prefect_home``: also point Prefect's home into the state folder (the CLI does, before Prefect
    loads; a worker already has its own). ``log_file``: the command writes all but its table to a log
    file (`coevolve evolve`), which keeps Prefect's INFO lines. ``create_state``: make the state folder;
    a command that only reads (`coevolve sql`, `coevolve status`) leaves a folder without state as it is.
    """
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if config.policy.cpu_kernels == "avx2":
        for key, value in AVX2_KERNELS_ENV.items():
            os.environ.setdefault(key, value)
    state = config.state_dir.resolve()
    if create_state:
        state.mkdir(parents=True, exist_ok=True)
    if prefect_home:
        os.environ.setdefault("PREFECT_HOME", str(state / "prefect"))
        # The per-round table is the main output; Prefect's own INFO lines go to its API and UI, and to the
        # log file of a command that keeps one (on the console they would bury the table).
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if log_file else "WARNING")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if log_file:
        for key, value in LOG_FILE_ENV.items():
            os.environ.setdefault(key, value)
