"""The pipeline's error tree.

Prefect tasks retry `InfrastructureError` (a lost server, a busy file, a flaky engine) and fail
fast on everything else: retrying bad data only repeats the failure.
"""


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""


class ConfigError(PipelineError):
    """Raised when a configuration file, override or environment variable is invalid."""


class DataError(PipelineError):
    """Raised when stored data is missing, corrupt (a digest mismatch) or inconsistent."""


class EnvSetupError(PipelineError):
    """Raised when an environment cannot be built for a task (unknown class, bad initial state)."""


class InfrastructureError(PipelineError):
    """Raised when an external resource fails in a way a retry can fix (engine, store, lock)."""


class RoundLockedError(PipelineError):
    """Raised when another process is already running the same round of the same run."""


def is_retryable(task, task_run, state) -> bool:
    """Prefect `retry_condition_fn`: retry infrastructure failures only."""
    try:
        state.result()
    except InfrastructureError:
        return True
    except Exception:  # noqa: BLE001 - any other failure of the task's own code is not retried
        return False
    return False
