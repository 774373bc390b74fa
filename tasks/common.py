"""Plumbing every stage's Prefect task shares: the warehouse, the engine, resumable stages, the round lock.

A stage that finished records its output in the warehouse (``stage_runs``); running the round
again returns that output instead of redoing the work, so a round that failed midway resumes
where it stopped without duplicating rows.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from coevolve.config import EnvironmentConfig, PipelineConfig
from coevolve.errors import RoundLockedError

# Pool membership round that holds the run's held-out split: never drawn for training.
HELDOUT_ROUND = -1
# Pool membership round that holds the run's dev split (tasks/prepare.build_dev_split): never drawn
# for training either. Not -2, which the evaluations table uses for checkpoints from outside the run.
DEV_ROUND = -3
# Pool membership round of the final held-out split (tasks/splits.build_final_heldout): never drawn for
# training and refused by validation; the ablation scores checkpoint 0 and final checkpoints on it.
FINAL_HELDOUT_ROUND = -4


@contextlib.contextmanager
def open_warehouse(config: PipelineConfig) -> Iterator[Any]:
    from storage.warehouse import Warehouse

    config.state_dir.mkdir(parents=True, exist_ok=True)
    warehouse = Warehouse(config.warehouse_path, storage_options=config.warehouse.storage_options)
    try:
        yield warehouse
    finally:
        warehouse.close()


def resumable(config: PipelineConfig, round_: int, stage: str, compute: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """Return the stage's recorded output if it already finished, else ``compute(warehouse)`` and record it.

    The stage works in this one warehouse session. Its output is recorded last: a stage that wrote
    several tables counts as finished only once every write is done, and one that stopped midway
    is run again, replacing what it wrote (rows are keyed or in files named after what they hold).
    """
    with open_warehouse(config) as wh:
        done = wh.stage_output(config.run_id, round_, stage)
        if done is not None:
            return done
        output = compute(wh)
        wh.mark_stage(config.run_id, round_, stage, output)
    return output


def make_environment(env_config: EnvironmentConfig):
    """A fresh environment as the configuration describes it (one per episode)."""
    from envs.bfcl import BfclEnvironment

    return BfclEnvironment(
        max_steps_per_turn=env_config.max_steps_per_turn,
        max_observation_chars=env_config.max_observation_chars,
        tool_list=env_config.tool_list,
        bfcl_loop=env_config.prompt_style == "bfcl",
    )


def load_engine(checkpoint: str, config: PipelineConfig):
    """The engine ``config.rollout.engine`` names (transformers, vllm or openai), on this checkpoint.

    With 'openai', the checkpoint's weights are pushed to every server first (agent/weights.py).
    """
    from agent.engines import open_engine

    return open_engine(checkpoint, config)


@contextlib.contextmanager
def engine_session(checkpoint: str, config: PipelineConfig) -> Iterator[Any]:
    """`load_engine` for the length of a stage: released at the end (vLLM shut down, GPU memory freed)."""
    from agent.engines import release

    engine = load_engine(checkpoint, config)
    try:
        yield engine
    finally:
        release(engine)


def max_context(engine) -> int | None:
    from agent.engines import context_length

    return context_length(engine)


@contextlib.contextmanager
def round_lock(config: PipelineConfig, round_: int) -> Iterator[None]:
    """Hold the run's lock for the round; a second process running the same run stops at once.

    The lock is an OS file lock, so a process killed with -9 releases it and a re-run resumes.
    """
    from filelock import FileLock, Timeout

    lock_path = config.run_dir() / "round.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RoundLockedError(
            f"Run {config.run_id!r} is already running a round in another process (lock {lock_path}). "
            "Wait for it to finish; rounds of one run execute one at a time."
        ) from None
    try:
        (lock_path.parent / "round.owner").write_text(f"pid={os.getpid()} round={round_}\n")
        yield
    finally:
        lock.release()
