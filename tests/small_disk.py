"""A real filesystem that fills up: a tmpfs of a chosen size mounted for one test, so writes fail with ENOSPC as
they do on a full disk (not a mock, and not RLIMIT_FSIZE, whose EFBIG is another error).

Mounting needs root (the test machines run as root); elsewhere the tests that need it skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def mount(path: Path, size_kb: int, inodes: int | None = None) -> str | None:
    """Mount a tmpfs of ``size_kb`` KiB (and at most ``inodes`` files and folders) at ``path`` (made if missing);
    None once mounted, else why it cannot be."""
    if os.geteuid() != 0:
        return "a full disk is made by mounting a small tmpfs, which needs root"
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kb}k" + ("" if inodes is None else f",nr_inodes={inodes}")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    return None if done.returncode == 0 else f"cannot mount a tmpfs at {path}: {done.stderr.strip()}"


def unmount(path: Path) -> None:
    # Lazily: a process of the test still holding a file there must not keep the mount (or fail the test).
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextmanager
def small_disk(path: Path, size_kb: int, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size_kb`` KiB (``inodes``: files and folders at most) mounted at ``path`` until the block ends;
    the test skips where none can be."""
    reason = mount(path, size_kb, inodes)
    if reason is not None:
        pytest.skip(reason)
    try:
        yield path
    finally:
        unmount(path)


def resize(disk: Path, size_kb: int) -> None:
    """Grow (or shrink) a mounted small disk: what an operator does who frees space."""
    subprocess.run(["mount", "-o", f"remount,size={size_kb}k", str(disk)], check=True, capture_output=True)


def fill(disk: Path, leave_bytes: int) -> Path:
    """A file taking all but about ``leave_bytes`` of the disk's free space; deleting it frees that space again."""
    filler = disk / "filler"
    size = max(0, shutil.disk_usage(disk).free - leave_bytes)
    with filler.open("wb") as handle:
        handle.truncate(0)
        handle.write(b"\0" * size)
    return filler


@contextmanager
def read_only(source: Path, path: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``path`` until the block ends: a read-only mount of a state folder, where
    every write fails with EROFS (root's permission bits would not stop it). The test skips where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("a read-only folder is made by a read-only bind mount, which needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount {source} read-only at {path}: {done.stderr.strip()}")
    try:
        yield path
    finally:
        unmount(path)
