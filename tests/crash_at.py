"""Run the ``coevolve`` command line and die at one commit point: a real process death, for crash tests.

``python -m tests.crash_at WHEN:PATH[#N] ARGS...`` runs ``coevolve ARGS...`` in this process with every
warehouse write (`storage.tables.TableFiles.write_bytes`: table files, catalog records, the layout)
watched: at the N-th write (default 1) whose target contains PATH, the process ends with `os._exit`
(no cleanup, no finally blocks, like kill -9) just ``before`` or ``after`` that write. It exits with
CRASH_EXIT then, so a test knows the point was reached; without reaching it, it exits as the command does.
"""

from __future__ import annotations

import os
import sys

from storage.tables import TableFiles

CRASH_EXIT = 86


def arm(spec: str) -> None:
    """Patch the warehouse's one write path to end the process at the point ``spec`` names."""
    when, _, rest = spec.partition(":")
    if when not in ("before", "after"):
        raise SystemExit(f"crash point {spec!r}: start it with before: or after:")
    fragment, _, nth = rest.partition("#")
    wanted = int(nth or 1)
    seen = 0
    write_bytes = TableFiles.write_bytes

    def watched(self: TableFiles, target: str, data: bytes) -> None:
        nonlocal seen
        hit = fragment in target and (seen := seen + 1) == wanted
        if hit and when == "before":
            os._exit(CRASH_EXIT)
        write_bytes(self, target, data)
        if hit:
            os._exit(CRASH_EXIT)

    TableFiles.write_bytes = watched  # type: ignore[method-assign]


if __name__ == "__main__":
    arm(sys.argv[1])
    from coevolve.cli import main

    sys.exit(main(sys.argv[2:]))
