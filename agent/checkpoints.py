"""A checkpoint: a folder of weights, config and tokenizer, written whole, digested, verified, found.

Everything the pipeline knows about a checkpoint as files lives here:

- its layout: a LoRA round keeps its adapter under ``<checkpoint>/adapter`` (`ADAPTER_SUBDIR`), next
  to the merged weights;
- the optimizer, scheduler and trainer state of the update that wrote it (transformers' own
  checkpoint files: trainer_state.json, optimizer.pt, scheduler.pt, rng_state*.pth) under
  ``<checkpoint>/trainer_state`` (`TRAINER_STATE_SUBDIR`), which the next update resumes
  (`trainer_state_to_resume`); engines load the top level and never read it;
- `save_atomically`: a checkpoint is filled in a staging folder beside its target and renamed onto
  it, so a retried or interrupted writer never leaves half a checkpoint;
- `checkpoint_digest`: sha256 over its files, recorded by the version stage;
- `checkpoint_folder`: the local folder of a checkpoint named by path or by hub model id (its
  snapshot in the local hub cache);
- `verify_checkpoint`: a recorded checkpoint checked against its recorded digest before a round
  loads it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from coevolve.errors import DataError, disk_full_as_error
from coevolve.optional import optional_module

huggingface_hub = optional_module("huggingface_hub")

# Where a LoRA round's adapter lives inside its checkpoint (its base_model_name_or_path names the round before).
ADAPTER_SUBDIR = "adapter"
# Where an update keeps the trainer state (optimizer, scheduler, global step, RNG) the next update resumes.
TRAINER_STATE_SUBDIR = "trainer_state"
# transformers' name for the trainer state file of a checkpoint (transformers.trainer.TRAINER_STATE_NAME).
TRAINER_STATE_FILE = "trainer_state.json"
# Suffix of the folder a checkpoint is written into before it is renamed onto its target.
STAGING_SUFFIX = ".partial"
# The builtin tiny policy's build report (agent/tiny.py) and a warm-up's (agent/warmup.py): they hold
# wall-clock timings, so two identical builds differ there;
# the weights, config and tokenizer are what the digest covers.
_NOT_DIGESTED = frozenset({"tiny_policy.json", "warmup.json"})
# transformers' RNG snapshot in a trainer state (rng_state.pth, rng_state_<rank>.pth): the generators of the
# whole process at save time, which other threads (Prefect's, MLflow's) draw from too, so two identical
# updates in one process can save different bytes. The update draws no random numbers that change its
# result (no dropout, no shuffling, stored rollouts), so it is not part of what the digest vouches for.
_RNG_STATE_PREFIX = "rng_state"


def _digested(file: Path) -> bool:
    if file.name in _NOT_DIGESTED:
        return False
    return not (file.parent.name == TRAINER_STATE_SUBDIR and file.name.startswith(_RNG_STATE_PREFIX))


def save_atomically(out_dir: Path, write: Callable[[Path], object]) -> None:
    """Publish a checkpoint folder whole:
    ``write(staging)`` fills a folder beside ``out_dir``, which then replaces it.

    A disk that fills up meanwhile is a `DiskFullError` naming the checkpoints' folder: the staging folder
    is deleted (its space is free again) and ``out_dir`` is as it was.
    """
    staging = out_dir.with_name(out_dir.name + STAGING_SUFFIX)
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted writer left
    with disk_full_as_error(out_dir.parent, remove=staging):
        staging.parent.mkdir(parents=True, exist_ok=True)
        write(staging)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)


def checkpoint_digest(directory: str | Path) -> str:
    """sha256 over every file of a checkpoint directory: names relative to it and contents, sorted.

    Recorded by the version stage and checked before the next round loads the checkpoint, so a
    truncated, replaced or partly deleted checkpoint is caught by name instead of training on.
    """
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"Checkpoint {root} does not exist; it cannot be digested.")
    outer = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file() and _digested(p)):
        inner = hashlib.sha256()
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                inner.update(block)
        outer.update(f"{file.relative_to(root).as_posix()}\0{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


def checkpoint_folder(checkpoint: str, local_only: bool = False) -> Path:
    """The local folder holding a checkpoint's files, so it can be digested.

    A local path must exist. A name that is not a path (a hub model id given as ``policy.model``)
    resolves to its snapshot in the hub cache unless ``local_only`` (every checkpoint an update
    wrote); a model that is neither stops the round.
    """
    local = Path(checkpoint).expanduser()
    if local.is_dir():
        return local
    if local_only or local.is_absolute() or checkpoint.startswith((".", "~")) or local.exists():
        raise DataError(f"Checkpoint {checkpoint} is missing (no such folder); it cannot be verified or loaded.")
    try:
        # Downloads into the hub cache when the hub is reachable and allowed (HF_HUB_OFFLINE unset or 0);
        # offline it resolves the cached snapshot, so the digest covers the files the engines load.
        return Path(huggingface_hub.snapshot_download(checkpoint))
    except Exception as exc:  # noqa: BLE001 - any failure means the model is not on this machine
        raise DataError(
            f"Checkpoint {checkpoint!r} is neither a local folder nor in the local hub cache ({type(exc).__name__}); "
            "give policy.model as a local path, or download the model into the hub cache first "
            "(HF_HUB_OFFLINE=0 on a machine that reaches the hub)."
        ) from None


def verify_checkpoint(
    checkpoint: str, expected: str | None, what: str, local_only: bool = True, restore: str | None = None
) -> None:
    """Check a recorded checkpoint against its recorded digest; DataError naming the folder otherwise.

    ``restore``: how to bring changed files back (a round's input names its MLflow copy); None: from a backup.
    """
    folder = checkpoint_folder(checkpoint, local_only)
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise DataError(f"{what} at {folder} is incomplete (no config.json or *.safetensors weights).")
    if not expected:
        raise DataError(
            f"{what} at {folder} has no recorded digest, so it cannot be verified; its round was recorded by an older "
            "version or by hand. Re-run that round (coevolve round --round R) or start a new run_id."
        )
    actual = checkpoint_digest(folder)
    if actual != expected:
        raise DataError(
            f"{what} at {folder} has digest {actual[:16]}, but {expected[:16]} was recorded: the files changed after "
            f"they were recorded. {restore or 'Restore them from a backup, or start a new run_id.'}"
        )


def trainer_state_global_step(folder: Path | None) -> int:
    """The global step a trainer state folder records: optimizer steps since checkpoint 0 (0 for None, a fresh one)."""
    if folder is None:
        return 0
    return int(json.loads((Path(folder) / TRAINER_STATE_FILE).read_text())["global_step"])


# The training step that wrote a checkpoint is recorded, and a finished round is never opened again, so the
# step cannot be re-run; the run's recorded settings cannot change mid-run either. What works is the state as it
# was, or the run from its start.
OPTIMIZER_STATE_FIX = (
    "restore the state folder from a backup, or start the run again in a new state folder (--set "
    "state_dir=NEW_FOLDER; add --set training.carry_optimizer=false there to train every step with a fresh optimizer)"
)


def trainer_state_to_resume(checkpoint: Path, expected: bool) -> Path | None:
    """The trainer state folder the update of ``checkpoint`` resumes, or None to start a fresh optimizer.

    None when the checkpoint holds no state and none is ``expected`` (checkpoint 0), or when its state
    records no optimizer step yet (a skipped first update). Raises DataError naming the fix when a state
    is expected but missing, or is there but damaged or incomplete: training on with a fresh optimizer
    would silently change the run.
    """
    folder = Path(checkpoint) / TRAINER_STATE_SUBDIR
    fix = OPTIMIZER_STATE_FIX
    if not folder.is_dir():
        if expected:
            raise DataError(
                f"Checkpoint {checkpoint} has no optimizer state ({TRAINER_STATE_SUBDIR}/) to resume: it was written "
                f"with training.carry_optimizer=false or by an older version. To continue this run, {fix}."
            )
        return None
    try:
        global_step = trainer_state_global_step(folder)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"The optimizer state {folder} has no readable {TRAINER_STATE_FILE} ({type(exc).__name__}: {exc}); {fix}."
        ) from None
    if global_step == 0:
        return None
    # optimizer.pt and scheduler.pt under DDP; DeepSpeed and FSDP keep their optimizer in folders of their own.
    sharded = any(p.is_dir() for p in folder.iterdir())
    if not sharded and not all((folder / name).is_file() for name in ("optimizer.pt", "scheduler.pt")):
        raise DataError(f"The optimizer state {folder} lacks optimizer.pt or scheduler.pt; {fix}.")
    return folder
