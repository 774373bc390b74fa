"""Checkpoint 0 of an environment's default configuration, shipped beside the code so a first run starts at round 0.

An environment names the folder (`Environment.shipped_checkpoint`: envs/bfcl/checkpoint0/,
envs/workplace/checkpoint0/). It holds exactly what `agent.tiny.build_tiny_policy` writes for that environment's
default configuration: weights, model config, tokenizer and the build marker. Its record, the .json of the same
name beside it, says what it was built from and on: the run key round 0 files checkpoint 0 under, the build
digest (demonstrations, settings, seed and the recipe's code), the digest of its files, and the library
versions and CPU of the build.

Round 0 copies the shipped folder into the state folder instead of building when all three agree with
the configuration in hand (`shipped_policy`): the same key, the same build digest as today's recipe
computes, and files that still match their digest. Anything else builds from the recipe as before, so a
changed recipe never runs on stale weights. `make policy` (``coevolve build-policy``) rebuilds the
shipped files; tests/agent/test_shipped_policy.py fails, naming that command, when the recipe changed
without them being rebuilt.
"""

from __future__ import annotations

import json
import platform
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from agent.checkpoints import checkpoint_digest, save_atomically
from agent.tiny import MARKER, build_digest
from coevolve.config import PolicyConfig
from coevolve.records import Message

REBUILD_COMMAND = "make policy"
# Recorded with a build, not compared: the weights are the shipped ones on every machine, whatever it runs.
_RECORDED_PACKAGES = ("torch", "transformers", "trl", "tokenizers", "datasets", "numpy")


@dataclass(frozen=True)
class ShippedCheck:
    """Whether the shipped checkpoint 0 is the one these inputs would build, and if not, why."""

    folder: Path | None
    reason: str | None

    @property
    def usable(self) -> bool:
        return self.folder is not None


def record_path(folder: Path) -> Path:
    """Where the record of the checkpoint shipped in ``folder`` is kept: beside it, ``<folder>.json``."""
    return folder.with_suffix(".json")


def read_record(folder: Path) -> dict[str, Any] | None:
    """The record of the checkpoint shipped in ``folder``; None when it is missing or unreadable."""
    try:
        value = json.loads(record_path(folder).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def check_shipped(
    key: str,
    conversations: Sequence[Sequence[Message]],
    config: PolicyConfig,
    seed: int,
    folder: Path | None,
) -> ShippedCheck:
    """The shipped folder if it is checkpoint 0 of exactly these inputs under today's recipe, intact."""
    if folder is None:
        return ShippedCheck(None, "the environment ships no checkpoint 0")
    record = read_record(folder)
    if record is None or not (folder / MARKER).is_file():
        return ShippedCheck(None, f"no shipped checkpoint 0 at {folder}")
    if record.get("key") != key:
        return ShippedCheck(None, "the shipped checkpoint 0 was built for other settings, seed or demonstrations")
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        marker = {}
    if marker.get("digest") != build_digest(conversations, config, seed):
        return ShippedCheck(
            None,
            "the shipped checkpoint 0 was built by another recipe (agent/tiny.py, agent/chat.py, the "
            "demonstrations or the SFT settings changed since)",
        )
    if checkpoint_digest(folder) != record.get("checkpoint_digest"):
        return ShippedCheck(None, f"the files of the shipped checkpoint 0 in {folder} no longer match their digest")
    return ShippedCheck(folder, None)


def copy_shipped(shipped: Path, out_dir: Path) -> Path:
    """Copy the shipped checkpoint into the run's state folder whole, so the run never depends on the checkout."""
    save_atomically(out_dir, lambda staging: shutil.copytree(shipped, staging))
    return out_dir


def ship(built: Path, key: str, folder: Path) -> dict[str, Any]:
    """Replace the shipped checkpoint 0 with ``built`` and record what it was built from and on."""
    save_atomically(folder, lambda staging: shutil.copytree(built, staging))
    summary = json.loads((folder / MARKER).read_text())
    record = {
        "key": key,
        "build_digest": summary["digest"],
        "checkpoint_digest": checkpoint_digest(folder),
        "parameters": summary.get("parameters"),
        "sft_steps": summary.get("sft_steps"),
        "final_loss": summary.get("final_loss"),
        "build_seconds": summary.get("duration_s"),
        "built_with": {name: _version(name) for name in _RECORDED_PACKAGES},
        "machine": {"cpu": _cpu_name(), "python": platform.python_version()},
        "rebuild": REBUILD_COMMAND,
    }
    record_path(folder).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
