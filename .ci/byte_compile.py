"""Byte-compile the running environment's installed packages, and a project's own packages, on every core.

The Makefile's installs skip pip's own byte-compilation, which runs in one process and was most of an install's
time on 2 cores, and run this afterwards: the same .pyc files (compileall's, timestamp-checked), written by a
process pool. compileall's own `-j` hands its pool one file at a time, and that traffic cost about a third more
CPU than the compiling itself here, so the files go out in large batches instead. A module that does not compile
(torch ships one in Python 3.12 syntax) only stays uncached, as under pip: it is named, and the status is 0.

With --project, the packages that pyproject.toml's `[tool.setuptools.packages.find] include` names are compiled
too: an editable install imports them from the checkout and never compiles them.

Usage: python .ci/byte_compile.py [--project pyproject.toml]
"""

import argparse
import compileall
import os
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# Batches per worker: enough that the last ones even out the workers' finishing times.
BATCHES_PER_WORKER = 8


def sources(folders: list[str]) -> Iterator[str]:
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            yield from (os.path.join(root, name) for name in sorted(files) if name.endswith(".py"))


def project_packages(pyproject: Path) -> list[str]:
    """The top-level package folders of the project's `include` patterns ("coevolve*" -> coevolve/)."""
    found = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"]
    tops = {pattern.split(".")[0].rstrip("*") for pattern in found["include"]}
    return [str(pyproject.parent / top) for top in sorted(tops) if (pyproject.parent / top).is_dir()]


def compiled(path: str) -> bool:
    return bool(compileall.compile_file(path, quiet=2))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, help="pyproject.toml whose packages are compiled too")
    args = parser.parse_args(argv)
    installed = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    files = list(sources(installed + (project_packages(args.project) if args.project else [])))
    workers = os.cpu_count() or 1
    batch = max(1, len(files) // (workers * BATCHES_PER_WORKER))
    with ProcessPoolExecutor(workers) as pool:
        failed = [path for path, ok in zip(files, pool.map(compiled, files, chunksize=batch), strict=True) if not ok]
    print(f"byte-compiled {len(files)} modules on {workers} processes; {len(failed)} did not compile")
    for path in failed:
        print(f"did not compile (stays uncached): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
