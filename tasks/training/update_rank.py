"""One rank of a launched update: ``python -m tasks.training.update_rank SPEC`` under torchrun or accelerate launch.

tasks/training/launch.py writes SPEC (the configuration, the round grouped without its trajectories, each
rank's share of task ids) and starts the ranks. A rank reads only the trajectories of its own share
from the warehouse, read-only (the update is the only stage running at that point of a round, so no
writer holds it), trains through tasks/training/grpo_trainer.py (TRL hands it exactly the groups of its share)
and leaves ``rank-<r>.json`` with its statistics, or ``rank-<r>.error.json`` with its error, beside
SPEC; its output goes to ``rank-<r>.log`` there.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevolve.config import PipelineConfig
from coevolve.errors import DataError, DiskFullError
from coevolve.optional import optional_module, preload
from coevolve.process_exit import exit_promptly
from coevolve.stages import step_samples
from storage.warehouse import Warehouse
from tasks.training.grpo_groups import RoundGroups, group_trajectories

# Torch, trl and peft, imported when the rank starts, with the cycle collector paused (coevolve/optional.py).
TRAINER_MODULE = "tasks.training.grpo_trainer"
if TYPE_CHECKING:
    import tasks.training.grpo_trainer as grpo_trainer
else:
    grpo_trainer = optional_module(TRAINER_MODULE)


def read_share(config: PipelineConfig, round_: int, task_ids: list[str], step: int = 0) -> list:
    """The stored trajectories of ``task_ids`` in step ``step`` of round ``round_``, read from the warehouse without
    a writer's lock (a task drawn by several steps of the round has episodes in each; only this step's count)."""
    warehouse = Warehouse(config.warehouse_path, read_only=True, storage_options=config.warehouse.storage_options)
    try:
        return warehouse.trajectories(
            config.run_id, round_, task_ids=task_ids, samples=step_samples(step, config.rollout.group_size)
        )
    finally:
        warehouse.close()


def run_rank(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """One rank's update: read its share of the round and train it, with the rest of the round as planned."""
    config = PipelineConfig.model_validate(spec["config"])
    shares = spec["shares"]
    if len(shares) != world:
        raise DataError(f"The launch spec shares the round among {len(shares)} ranks, but {world} were started.")
    share = shares[rank]
    step = int(spec.get("step", 0))
    groups, _ = group_trajectories(read_share(config, spec["round"], share, step), config.rollout.group_size)
    # The stage planned these groups from the same stored rows; a difference means the round changed since.
    if sorted(groups) != sorted(share):
        raise DataError(
            f"Rank {rank} found the groups {sorted(groups)} in the warehouse where the update planned {sorted(share)}: "
            f"round {spec['round']}'s trajectories changed while it was training. Run the round again."
        )
    round_groups = RoundGroups.from_plan(spec["round_groups"], groups)
    resume_from = Path(spec["resume_from"]) if spec.get("resume_from") else None
    return grpo_trainer.train(
        Path(spec["checkpoint"]),
        round_groups,
        config,
        Path(spec["out_dir"]),
        Path(spec["reference_checkpoint"]),
        resume_from,
    )


def _redirect_output(log: Path) -> None:
    """Send this process's stdout and stderr (file descriptors included, so native libraries too) to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _write_json(path: Path, value: dict[str, Any]) -> None:
    staging = path.with_name(path.name + ".partial")
    staging.write_text(json.dumps(value, indent=1))
    staging.rename(path)


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank: RANK and WORLD_SIZE come from torchrun or accelerate launch."""
    spec_path = Path((argv if argv is not None else sys.argv[1:])[0])
    work = spec_path.parent
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    _redirect_output(work / f"rank-{rank}.log")
    try:
        # The trainer's libraries first, then frozen out of the collections training triggers (coevolve/optional.py).
        preload([TRAINER_MODULE])
        stats = run_rank(json.loads(spec_path.read_text()), rank, world)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher, then the rank exits non-zero
        traceback.print_exc()
        _write_json(
            work / f"rank-{rank}.error.json",
            {
                "rank": rank,
                "type": type(exc).__name__,
                "message": str(exc),
                "time": time.time(),
                # A full disk is reported by the stage as such: one line naming the folder, not retried.
                "disk_full": exc.folder if isinstance(exc, DiskFullError) else None,
            },
        )
        return 1
    _write_json(work / f"rank-{rank}.json", stats)
    return 0


if __name__ == "__main__":
    exit_promptly(main())
