"""The update stage as its own process group: `grpo_update` on several ranks under torchrun or accelerate launch.

`launch_update` is called by the update stage when ``training.num_processes > 1`` or a launcher is
configured. It decides how many ranks the round's groups allow, writes a launch spec into the run
folder and starts

- ``torchrun --standalone --nproc_per_node P -m tasks.launch SPEC`` (gloo ranks on CPU, NCCL on GPUs), or
- ``accelerate launch --config_file FILE --num_processes P -m tasks.launch SPEC`` (DDP, DeepSpeed, FSDP).

Each rank (`main` below) sends its output to ``rank-<r>.log`` in the launch folder, reads the round's
trajectories from the warehouse read-only (the update is the only stage running at that point of a
round, so no writer holds it), and runs `grpo_update`: TRL gives each rank its share of whole groups,
rank 0 writes the checkpoint. Each rank leaves ``rank-<r>.json`` (its statistics, including the task
ids it trained on) or ``rank-<r>.error.json``; a failure in any rank raises `RankFailedError` with
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
import traceback
from pathlib import Path
from typing import Any

from coevolve.config import PipelineConfig
from coevolve.errors import ConfigError, PipelineError
from coevolve.records import Trajectory

logger = logging.getLogger(__name__)

# Lines of a failing rank's log quoted in the error.
LOG_TAIL_LINES = 40
# The repository root, put on the ranks' PYTHONPATH so `-m tasks.launch` resolves from any working directory.
_ROOT = Path(__file__).resolve().parent.parent


class RankFailedError(PipelineError):
    """Raised when a rank of a launched update fails: names the rank, its error and its log, and quotes the log's end."""

    def __init__(self, message: str, rank: int | None, log_path: Path | None) -> None:
        super().__init__(message)
        self.rank = rank
        self.log_path = log_path


def processes_for(groups: int, wanted: int) -> int:
    """The most ranks, at most ``wanted``, that share ``groups`` whole groups evenly (a divisor of ``groups``)."""
    return max(p for p in range(1, max(1, min(groups, wanted)) + 1) if groups % p == 0)


def launch_dir(config: PipelineConfig, round_: int) -> Path:
    """Where a round's launched update keeps its spec, per-rank logs and per-rank statistics."""
    return config.run_dir() / "update" / f"round-{round_:03d}"


def launch_command(config: PipelineConfig, processes: int, spec: Path) -> list[str]:
    """The command line that starts ``processes`` ranks of `main` on ``spec``."""
    training = config.training
    if training.launcher == "accelerate":
        if training.accelerate_config is None:
            raise ConfigError(
                "training.launcher is 'accelerate' but training.accelerate_config is not set; point it at an accelerate "
                "config file (deployments/accelerate/ has DDP, DeepSpeed ZeRO-3 and FSDP2 ones)."
            )
        if not Path(training.accelerate_config).is_file():
            raise ConfigError(f"training.accelerate_config {training.accelerate_config} does not exist.")
        return [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(training.accelerate_config),
            "--num_processes", str(processes), "--module", "tasks.launch", str(spec),
        ]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
        "-m", "tasks.launch", str(spec),
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
    trajectories: list[Trajectory],
    config: PipelineConfig,
    round_: int,
    out_dir: Path,
    reference_checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Run `grpo_update` for round ``round_`` on several ranks; return rank 0's statistics plus every rank's task ids.

    ``trajectories`` are the round's, as the ranks will read them from the warehouse: they decide how
    many ranks the kept groups allow. A round without any group to learn from is handled in-process
    (`grpo_update` copies the input checkpoint). Raises RankFailedError when a rank fails.
    """
    from tasks.update import group_trajectories, grpo_update, segment_groups

    groups, _ = group_trajectories(trajectories, config.rollout.group_size)
    if not groups:
        return grpo_update(checkpoint_in, trajectories, config, out_dir, reference_checkpoint=reference_checkpoint)
    wanted = config.training.num_processes
    # TRL's groups are the segment slots of the informative task groups (one per task in the compact style).
    slots = len(segment_groups(groups))
    processes = processes_for(slots, wanted)
    ranks_line = f"round {round_}: update on {processes} of {wanted} requested ranks ({slots} informative groups"
    ranks_line += ")" if processes == wanted else f" cannot be shared evenly by more; the ranks take whole groups)"
    if processes < wanted:
        logger.warning(ranks_line)
    work = launch_dir(config, round_)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = work / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "config": config.model_dump(mode="json"),
                "round": round_,
                "checkpoint": str(checkpoint_in),
                "out_dir": str(out_dir),
                "reference_checkpoint": None if reference_checkpoint is None else str(reference_checkpoint),
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
        log = work / f"rank-{rank}.log"
        raise RankFailedError(
            f"Rank {rank} of {processes} failed the update: {first['type']}: {first['message']}\n"
            f"Last lines of {log}:\n{_tail(log)}",
            rank,
            log,
        )
    missing = [rank for rank in range(processes) if not (work / f"rank-{rank}.json").is_file()]
    if returncode != 0 or missing:
        rank = missing[0] if missing else None
        log = work / (f"rank-{rank}.log" if rank is not None else "launcher.log")
        raise RankFailedError(
            f"The update's launcher exited with status {returncode}; ranks without statistics: {missing or 'none'}.\n"
            f"Last lines of {log}:\n{_tail(log)}\nLast lines of {work / 'launcher.log'}:\n{_tail(work / 'launcher.log')}",
            rank,
            log,
        )
    return [json.loads((work / f"rank-{rank}.json").read_text()) for rank in range(processes)]


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


def run_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank's update: read the round from the warehouse (read-only) and train its share of the groups."""
    from storage.warehouse import Warehouse
    from tasks.update import grpo_update

    config = PipelineConfig.model_validate(spec["config"])
    warehouse = Warehouse(config.warehouse_path, read_only=True, storage_options=config.warehouse.storage_options)
    try:
        trajectories = warehouse.trajectories(config.run_id, spec["round"])
    finally:
        warehouse.close()
    reference = spec.get("reference_checkpoint")
    return grpo_update(
        Path(spec["checkpoint"]), trajectories, config, Path(spec["out_dir"]),
        reference_checkpoint=None if reference is None else Path(reference),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank: ``python -m tasks.launch SPEC`` under torchrun or accelerate launch."""
    spec_path = Path((argv if argv is not None else sys.argv[1:])[0])
    work = spec_path.parent
    rank = int(os.environ.get("RANK", "0"))
    _redirect_output(work / f"rank-{rank}.log")
    try:
        stats = run_rank(json.loads(spec_path.read_text()))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher, then the rank exits non-zero
        traceback.print_exc()
        _write_json(
            work / f"rank-{rank}.error.json",
            {"rank": rank, "type": type(exc).__name__, "message": str(exc), "time": time.time()},
        )
        return 1
    _write_json(work / f"rank-{rank}.json", stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
