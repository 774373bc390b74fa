"""A bar of the rounds an ablation's runs have finished, drawn on a terminal while `coevolve ablation` waits.

The rounds run in the seeds' own processes, whose output goes to the command's log, so the bars of their rollouts
never reach the terminal. This bar reads the warehouse's record of finished rounds every few seconds instead,
from a thread of the command's process, and draws only where the command's own bars do
(`coevolve.console.log_to_file`: on a terminal, never into a log or a pipe).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

from coevolve.config import PipelineConfig
from coevolve.errors import PipelineError
from storage.warehouse import Warehouse

# Seconds between two reads of the warehouse: a round takes tens of seconds on a CPU, a read a few hundredths.
POLL_S = 5.0


def finished_rounds(config: PipelineConfig, run_ids: list[str], rounds: int) -> int:
    """Rounds 0 to ``rounds`` - 1 of ``run_ids`` recorded as finished in ``config``'s warehouse (0 before it exists).

    Read from the warehouse's catalog of finished rounds (a millisecond a run), not through its SQL views.
    """
    root, options = config.warehouse_path, config.warehouse.storage_options
    if not run_ids or not Warehouse.made_at(root, options):
        return 0
    with Warehouse(root, read_only=True, storage_options=options) as wh:
        return sum(summary.round < rounds for run_id in run_ids for summary in wh.rounds(run_id))


def _finished_now(config: PipelineConfig, run_ids: list[str], rounds: int) -> int | None:
    """`finished_rounds`, or None while the warehouse cannot be read (being made or moved): read again next poll."""
    try:
        return finished_rounds(config, run_ids, rounds)
    except (PipelineError, OSError):
        return None


@contextmanager
def rounds_bar(config: PipelineConfig, run_ids: list[str], rounds: int, desc: str) -> Iterator[None]:
    """Within the block, a bar of the finished rounds of ``run_ids`` (``rounds`` each) on the terminal, if any.

    A resumed ablation's bar starts at the rounds already finished, so its rate and time left are this command's.
    """
    if not sys.stderr.isatty():  # a log, a pipe or CI: no bar (the command's log has each round's lines)
        yield
        return
    initial = _finished_now(config, run_ids, rounds) or 0
    bar = tqdm(total=len(run_ids) * rounds, initial=initial, desc=desc, unit="round", leave=False)
    done = threading.Event()

    def follow() -> None:
        while not done.wait(POLL_S):
            finished = _finished_now(config, run_ids, rounds)
            if finished is not None:
                bar.update(finished - bar.n)

    follower = threading.Thread(target=follow, name="rounds-bar", daemon=True)
    follower.start()
    try:
        yield
    finally:
        done.set()
        follower.join()
        bar.close()
