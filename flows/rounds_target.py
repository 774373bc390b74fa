"""Where `coevolve evolve` stops: a target of rounds that running it again reaches and never passes.

Two ways to name the target:

- ``rounds`` N (``coevolve evolve --rounds N``, default the configuration's ``rounds``): the run is done when
  rounds 0..N-1 are finished. The target does not depend on when it is asked, so a command killed midway
  and run again, or a script that re-runs a failed command, resumes the unfinished round and stops at
  round N-1; on a finished run the command does nothing.
- ``more_rounds`` K (``coevolve evolve --more K``, the nightly deployment): K rounds from the first
  unfinished one *when the flow run first starts*. That start is recorded in the state folder under the
  Prefect flow run id (``<run_dir>/evolve-targets/<flow run id>.json``), so a retry of the same flow run
  (Prefect's retries and ``prefect flow-run retry`` keep its id) reads the recorded target back instead of
  adding K more; a new flow run (the next night, another command) fixes a new one.

Plain functions without Prefect, so the command can tell a finished run in a second, before it starts
Prefect or opens a log file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from coevolve.config import PipelineConfig
from coevolve.console import shown
from coevolve.errors import ConfigError
from coevolve.optional import optional_module

# The warehouse loads duckdb and polars: only when a finished run is checked.
if TYPE_CHECKING:
    import storage.warehouse as storage_warehouse
else:
    storage_warehouse = optional_module("storage.warehouse")

TARGETS_FOLDER = "evolve-targets"


def finished_rounds(config: PipelineConfig) -> int:
    """The run's first unfinished round, read without writing anything (0 where no warehouse exists yet).

    Rounds run in order, so it is also the number of finished rounds (as tasks/prepare.next_round_task counts).
    """
    root, options = config.warehouse_path, config.warehouse.storage_options
    if "://" not in str(root) and not Path(root).exists():
        return 0
    if "://" in str(root) and not storage_warehouse.Warehouse.made_at(root, options):
        return 0  # an object-store prefix has no folder to look for: its layout record says a warehouse is there
    with storage_warehouse.Warehouse(root, read_only=True, storage_options=options) as wh:
        finished = [summary.round for summary in wh.rounds(config.run_id)]
    return max(finished) + 1 if finished else 0


def target_record(config: PipelineConfig, flow_run_id: str) -> Path:
    """Where flow run ``flow_run_id`` of the run records its target."""
    return config.run_dir() / TARGETS_FOLDER / f"{flow_run_id}.json"


def fixed_target(config: PipelineConfig, flow_run_id: str | None, start: int, more_rounds: int) -> int:
    """``start + more_rounds``, fixed by the first start of flow run ``flow_run_id``: later starts read it back.

    Without a flow run id (the flow's function called directly) nothing can retry it, and nothing is recorded.
    """
    target = start + more_rounds
    if not flow_run_id:
        return target
    path = target_record(config, flow_run_id)
    if not path.exists():
        record = {
            "flow_run_id": flow_run_id,
            "run_id": config.run_id,
            "first_unfinished_round": start,
            "more_rounds": more_rounds,
            "target": target,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
                out.flush()
                os.fsync(out.fileno())
            # A link never replaces an existing file: of two starts racing, the first record stays, whole.
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return int(json.loads(path.read_text())["target"])


def evolve_target(
    config: PipelineConfig, start: int, rounds: int | None, more_rounds: int | None, flow_run_id: str | None
) -> int:
    """How many rounds the run has when the evolution is done: rounds 0..target-1 finished.

    ``start``: the run's first unfinished round now; ``rounds`` or ``more_rounds`` as the module docstring says.
    """
    if rounds is not None and more_rounds is not None:
        raise ConfigError(
            f"Both rounds ({rounds}) and more_rounds ({more_rounds}) were given; give one: rounds N runs until "
            "rounds 0..N-1 are finished, more_rounds K runs K rounds after the last finished one."
        )
    if more_rounds is None:
        target = config.rounds if rounds is None else rounds
        if target < 0:
            raise ConfigError(f"rounds must be 0 or more, not {target}.")
        return target
    if more_rounds < 0:
        raise ConfigError(f"more_rounds must be 0 or more, not {more_rounds}.")
    return fixed_target(config, flow_run_id, start, more_rounds)


def nothing_to_run(config: PipelineConfig, finished: int, target: int) -> str:
    """The line an evolution prints when its target is already reached."""
    done = f"rounds 0..{finished - 1} are finished" if finished else "no round is finished"
    plural = "" if target == 1 else "s"
    return (
        f"run {config.run_id!r}: {done} (target: {target} round{plural}), nothing to run; "
        f"state in {shown(config.state_dir)}"
    )
