"""The update stage as its own process group: `tasks.training.update_rank` on several ranks under torchrun or
accelerate launch.

`launch_update` is called by the update stage when ``training.num_processes > 1`` or a launcher is
configured, with the round already grouped (tasks/training/grpo_groups.py). It decides how many ranks the
round's groups allow, writes a launch spec into the run folder (the grouped round without its
trajectories, and each rank's share of task ids) and starts

- ``torchrun --standalone --nproc_per_node P -m tasks.training.update_rank SPEC`` (gloo ranks on CPU, NCCL on GPUs), or
- ``accelerate launch --config_file FILE --num_processes P -m tasks.training.update_rank SPEC`` (DDP, DeepSpeed, FSDP).

Each rank (tasks/training/update_rank.py) sends its output to ``rank-<r>.log`` in the launch folder, reads
the trajectories of its share of the round from the warehouse read-only and trains them; rank 0
writes the checkpoint. Each rank leaves ``rank-<r>.json`` (its statistics, including the task ids
it trained on) or ``rank-<r>.error.json``; a failure in any rank raises `RankFailedError` with
that rank's error and the last lines of its log.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from coevolve.config import PipelineConfig
from coevolve.errors import ConfigError, DataError, DiskFullError, PipelineError
from tasks.training.grpo_groups import RoundGroups

logger = logging.getLogger(__name__)

# Lines of a failing rank's log quoted in the error.
LOG_TAIL_LINES = 40
# The module each rank runs; the repository root goes on the ranks' PYTHONPATH, so the module resolves from
# any working directory.
RANK_MODULE = "tasks.training.update_rank"
_ROOT = Path(__file__).resolve().parent.parent


class RankFailedError(PipelineError):
    """Raised when a rank of a launched update fails:
    names the rank, its error and its log, and quotes the log's end."""

    def __init__(self, message: str, rank: int | None, log_path: Path | None) -> None:
        super().__init__(message)
        self.rank = rank
        self.log_path = log_path


def processes_for(groups: int, wanted: int) -> int:
    """The most ranks, at most ``wanted``, that share ``groups`` whole groups evenly (a divisor of ``groups``)."""
    return max(p for p in range(1, max(1, min(groups, wanted)) + 1) if groups % p == 0)


def launch_dir(config: PipelineConfig, round_: int, step: int = 0) -> Path:
    """Where a training step's launched update keeps its spec, per-rank logs and per-rank statistics."""
    return config.run_dir() / "update" / f"round-{round_:03d}-step-{step:02d}"


def launch_command(config: PipelineConfig, processes: int, spec: Path) -> list[str]:
    """The command line that starts ``processes`` ranks of `main` on ``spec``."""
    training = config.training
    if training.launcher == "accelerate":
        if training.accelerate_config is None:
            raise ConfigError(
                "training.launcher is 'accelerate' but training.accelerate_config is not set; point it at an "
                "accelerate config file (deployments/accelerate/ has DDP, DeepSpeed ZeRO-3 and FSDP2 ones)."
            )
        if not Path(training.accelerate_config).is_file():
            raise ConfigError(f"training.accelerate_config {training.accelerate_config} does not exist.")
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(training.accelerate_config),
            "--num_processes",
            str(processes),
            "--module",
            RANK_MODULE,
            str(spec),
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        "-m",
        RANK_MODULE,
        str(spec),
    ]


def _environment(config: PipelineConfig) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = str(config.policy.torch_threads)
    # Single-node ranks talk over loopback; without this gloo binds whatever the host name resolves to.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def launch_update(
    checkpoint_in: Path,
    round_groups: RoundGroups,
    config: PipelineConfig,
    round_: int,
    out_dir: Path,
    reference_checkpoint: Path | None = None,
    step: int = 0,
    resume_from: Path | None = None,
) -> dict[str, Any]:
    """Train step ``step`` of round ``round_``'s groups on several ranks; return rank 0's statistics plus every
    rank's task ids.

    ``round_groups`` is the step's batch as the update stage grouped it (`group_round`); each rank reads
    the trajectories of its share of that step from the warehouse, and every rank resumes the trainer
    state ``resume_from`` (None: a fresh optimizer). Raises RankFailedError when a rank fails.
    """
    if not round_groups.groups:
        raise DataError(
            f"Round {round_} has no group with reward variance: there is nothing to train on several ranks."
        )
    wanted = config.training.num_processes
    # TRL's groups are the segment slots of the informative task groups (one per task in the compact style).
    slots = len(round_groups.slots)
    processes = processes_for(slots, wanted)
    ranks_line = f"round {round_} step {step}: update on {processes} of {wanted} requested ranks"
    ranks_line += f" ({slots} informative groups"
    ranks_line += ")" if processes == wanted else " cannot be shared evenly by more; the ranks take whole groups)"
    if processes < wanted:
        logger.warning(ranks_line)
    work = launch_dir(config, round_, step)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = work / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "config": config.model_dump(mode="json"),
                "round": round_,
                "step": step,
                "resume_from": None if resume_from is None else str(resume_from),
                "checkpoint": str(checkpoint_in),
                "out_dir": str(out_dir),
                "reference_checkpoint": str(checkpoint_in if reference_checkpoint is None else reference_checkpoint),
                "round_groups": round_groups.plan(),
                "shares": round_groups.shares(processes),
            },
            indent=1,
        )
    )
    command = launch_command(config, processes, spec)
    started = time.perf_counter()
    with (work / "launcher.log").open("w") as log:
        # The launcher itself prints little when all goes well; this says what was started and why.
        log.write(f"{ranks_line}\n$ {' '.join(command)}\n")
        log.flush()
        returncode = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=_environment(config), cwd=_ROOT, check=False
        ).returncode
    ranks = collect_ranks(work, processes, returncode)
    stats = dict(ranks[0])
    stats.pop("rank", None)
    stats["task_ids"] = sorted(t for r in ranks for t in r["task_ids"])
    stats["rank_task_ids"] = {str(r["rank"]): r["task_ids"] for r in ranks}
    stats["launcher"] = "accelerate" if config.training.launcher == "accelerate" else "torchrun"
    stats["launch_s"] = round(time.perf_counter() - started, 3)
    return stats


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def collect_ranks(work: Path, processes: int, returncode: int) -> list[dict[str, Any]]:
    """Every rank's statistics, by rank; raises RankFailedError quoting the first rank that failed."""
    errors = []
    for rank in range(processes):
        error = work / f"rank-{rank}.error.json"
        if error.is_file():
            errors.append((json.loads(error.read_text()), rank))
    if errors:
        first, rank = min(errors, key=lambda e: e[0]["time"])
        if first.get("disk_full"):
            raise DiskFullError(first["disk_full"])
        log = work / f"rank-{rank}.log"
        raise RankFailedError(
            f"Rank {rank} of {processes} failed the update: {first['type']}: {first['message']}\n"
            f"Last lines of {log}:\n{_tail(log)}",
            rank,
            log,
        )
    missing = [rank for rank in range(processes) if not (work / f"rank-{rank}.json").is_file()]
    if returncode != 0 or missing:
        silent = missing[0] if missing else None
        log = work / (f"rank-{silent}.log" if silent is not None else "launcher.log")
        raise RankFailedError(
            f"The update's launcher exited with status {returncode}; ranks without statistics: {missing or 'none'}.\n"
            f"Last lines of {log}:\n{_tail(log)}\n"
            f"Last lines of {work / 'launcher.log'}:\n{_tail(work / 'launcher.log')}",
            silent,
            log,
        )
    return [json.loads((work / f"rank-{rank}.json").read_text()) for rank in range(processes)]
