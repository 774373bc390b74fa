"""Co-evolution rounds in a row, up to a target: what `coevolve evolve` and the nightly deployment run.

Run: ``coevolve evolve --rounds 3`` (until rounds 0..2 are finished) or the scheduled
``coevolve-evolve/nightly`` deployment (``more_rounds``: K rounds after the last finished one, fixed
when its flow run first starts). flows/rounds_target.py says how the target is fixed, so that a command
run again and a retried flow run stop where the first attempt would have. Each round is its own
``coevolve-round`` flow run (a subflow), so a failure names its round and the next evolution resumes
from the first unfinished round.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from coevolve.config import PipelineConfig
from coevolve.console import shown, table_stream
from coevolve.settings import apply_settings
from flows.round import coevolve_round
from flows.rounds_target import evolve_target, nothing_to_run
from flows.table import COLUMNS, format_row, summary_row
from tasks.prepare import next_round_task


def query_command(cfg: PipelineConfig, query: str = "SELECT * FROM v_success_by_round") -> str:
    """The `coevolve sql` line that queries this run's warehouse, as the user can type it where the run was started.

    The executable beside this interpreter (``.venv/bin/coevolve`` after `make run`, which does not put the
    environment on PATH), and the warehouse named: another state folder holds another run of the same name.
    """
    beside = Path(sys.executable).with_name("coevolve")
    command = shown(beside) if beside.exists() else "coevolve"
    where = ["--database", cfg.warehouse.uri] if cfg.warehouse.uri else ["--set", f"state_dir={shown(cfg.state_dir)}"]
    return shlex.join([command, "sql", *where, query])


@flow(name="coevolve-evolve")
def coevolve_evolve(
    rounds: int | None = None,
    more_rounds: int | None = None,
    config: dict[str, Any] | None = None,
    print_table: bool = False,
) -> list[dict[str, Any]]:
    """Run rounds from the first unfinished one until the target; returns the summaries of the rounds it ran.

    ``rounds`` N: until rounds 0..N-1 are finished (default: the configuration's ``rounds``).
    ``more_rounds`` K: K rounds from the first unfinished one when this flow run first starts; a retry of
    the flow run reaches that target and stops. Give one of the two.
    ``print_table``: print the per-round table as each round finishes (``coevolve evolve``), to stdout or,
    while the command sends the rest of its output to a log file, to the console (coevolve/console.py).
    """
    cfg = PipelineConfig.model_validate(config or {})
    apply_settings(cfg)  # a worker started anywhere runs like the CLI

    def show(line: str) -> None:
        if print_table:
            print(line, file=table_stream(), flush=True)

    start = next_round_task(cfg)
    target = evolve_target(cfg, start, rounds, more_rounds, flow_run.get_id())
    if start >= target:
        line = nothing_to_run(cfg, start, target)
        get_run_logger().info(line)
        show(line)
        return []
    show(f"run {cfg.run_id!r}: rounds {start}..{target - 1}, state in {shown(cfg.state_dir)}")
    show(format_row(COLUMNS))
    began = time.perf_counter()
    summaries = []
    for round_ in range(start, target):
        t0 = time.perf_counter()
        summary = coevolve_round(round_=round_, config=cfg.model_dump(mode="json"))
        if round_ == 0 and summary.get("baseline_heldout_success") is not None:
            show(f"{'':>5}  checkpoint 0 held-out success: {summary['baseline_heldout_success']:.3f}")
        show(summary_row(summary, time.perf_counter() - t0))
        summaries.append(summary)
    show(f"done in {time.perf_counter() - began:.0f}s; query with: {query_command(cfg)}")
    return summaries
