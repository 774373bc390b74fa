"""Command line (``python -m flows.cli``, installed as ``coevolve``); its commands:

    coevolve evolve [--config FILE] [--set section.field=value ...] [--rounds N | --more K]
    coevolve round --round R [--config FILE] [--set ...]
    coevolve evaluate --checkpoint PATH [--categories base,miss_func,...] [--limit N] [--no-heldout] [--dev]
    coevolve ablation [--config configs/ablation.yaml] [--arms static,random,full] [--seeds 1,2,3,4,5]
                      [--rounds 5] [--workers 2]
    coevolve sql "SELECT * FROM v_success_by_round" [--format table|csv|json] [--limit N] [--timeout S]
                 [--database ROOT]
    coevolve warehouse migrate [PATH] [--to ROOT] [--check]
    coevolve lineage VERSION|current|best [--model NAME]
    coevolve config --show
    coevolve status
    coevolve view [--port 8765] [--database ROOT]
    coevolve serve --model CHECKPOINT [--port 8000] [--host 127.0.0.1] [--dry-run]
    coevolve build-policy [--output DIR]

Every command runs offline: the hub, telemetry and analytics switches are set before any
library loads, Prefect uses a temporary local API under the state folder unless
PREFECT_API_URL points at a server.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from coevolve import console
from coevolve.errors import PipelineError
from coevolve.process_exit import exit_promptly
from flows import query_output
from flows.commands import (
    cmd_ablation,
    cmd_build_policy,
    cmd_config,
    cmd_evaluate,
    cmd_evolve,
    cmd_lineage,
    cmd_report,
    cmd_round,
    cmd_serve,
    cmd_sql,
    cmd_status,
    cmd_view,
    cmd_warehouse_migrate,
)
from flows.preflight import Interrupted
from tasks.ablation.arms import ARMS


def _round_count(text: str) -> int:
    """A number of rounds: 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of rounds (0 or more), got {text!r}")
    return value


def _rows(text: str) -> int:
    """A row count for --limit: 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a row count (0 or more; 0 prints all)")
    return value


def _seconds(text: str) -> float:
    """A time limit for --timeout: seconds, 0 or more (0: none)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more; 0 for no limit), got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coevolve", description="Co-evolve an LLM agent and its task pool.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="YAML file with configuration sections (see `coevolve config --show`).")
        p.add_argument(
            "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="Override one field; repeatable."
        )

    p = sub.add_parser(
        "evolve",
        help="Run rounds until rounds 0..N-1 are finished (the main job; running it again resumes, never adds).",
    )
    common(p)
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--rounds",
        type=_round_count,
        default=None,
        metavar="N",
        help=(
            "Run until rounds 0..N-1 of the run are finished (default: the configuration's rounds, 3 unless set). A "
            "target, not a count: an interrupted command run again resumes and stops there, and on a finished run it "
            "does nothing."
        ),
    )
    target.add_argument(
        "--more",
        type=_round_count,
        default=None,
        metavar="K",
        help=(
            "Run K more rounds from the first unfinished one (what the nightly deployment does with its "
            "more_rounds). Every command is a new flow run with a new target: running it again adds K more."
        ),
    )
    p.set_defaults(func=cmd_evolve)

    p = sub.add_parser("round", help="Run (or resume) one round.")
    common(p)
    p.add_argument("--round", type=int, required=True)
    p.set_defaults(func=cmd_round)

    p = sub.add_parser(
        "sql",
        help="Run a read-only SQL query on the warehouse.",
        description=(
            "Run read statements (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE) over the warehouse's "
            "views; anything else (COPY, ATTACH, INSTALL, LOAD, CREATE, DROP, SET, ...) is refused and nothing is "
            "run, and no file outside the warehouse can be read. Derived tables go in a DuckDB file of your own: "
            "docs/warehouse.md."
        ),
    )
    common(p)
    p.add_argument("query", help="The SQL; several statements (separated by ;) run only when all are reads.")
    p.add_argument(
        "--database",
        help="Warehouse folder or URL (default: the configuration's warehouse.uri, else state_dir/warehouse).",
    )
    p.add_argument(
        "--format",
        choices=query_output.FORMATS,
        default="table",
        help=(
            "table (default): aligned columns for reading; csv or json (an array of one object per row): for "
            "scripts. Every cell is printed whole."
        ),
    )
    p.add_argument(
        "--limit",
        type=_rows,
        default=None,
        metavar="N",
        help=(
            f"Print the first N rows, in the query's order (0: all). Default: {query_output.TABLE_ROWS} for a "
            "table, all rows for csv and json. Rows left out are counted below the table, or on stderr."
        ),
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help=(
            "Stop the query after S seconds (0: no limit). Default: warehouse.query_timeout_s (120 unless set). "
            "Its memory is bounded by warehouse.query_memory_mb."
        ),
    )
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("warehouse", help="Manage the warehouse's storage.")
    wsub = p.add_subparsers(dest="warehouse_command", required=True)
    m = wsub.add_parser(
        "migrate",
        help="Convert a single-file warehouse (warehouse.duckdb) to the open-table layout and compare every table.",
    )
    common(m)
    m.add_argument(
        "path", nargs="?", help="The old warehouse file (default: state_dir/warehouse.duckdb); it is left unchanged."
    )
    m.add_argument(
        "--to", dest="target", help="New warehouse folder or URL (default: the folder warehouse beside PATH)."
    )
    m.add_argument(
        "--check", action="store_true", help="Only compare PATH with an already converted warehouse at --to."
    )
    m.set_defaults(func=cmd_warehouse_migrate)

    p = sub.add_parser(
        "ablation",
        help=(
            "Static vs random vs signal-guided synthesis (and each signal left out), each also with the "
            "learnability curriculum, over seeds."
        ),
    )
    common(p)
    p.add_argument("--arms", help=f"Comma-separated arms (default: all): {', '.join(ARMS)}.")
    p.add_argument(
        "--seeds",
        default="1,2,3,4,5",
        help="Comma-separated loop seeds (default: %(default)s); arms are paired by seed.",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="Rounds per run (default: ablation_rounds); every arm gets the same number.",
    )
    p.add_argument(
        "--official-limit",
        type=int,
        default=50,
        help=(
            "Entries of each of the environment's official splits (BFCL: multi_turn_base; the workplace has none) "
            "scored per final checkpoint (default: %(default)s)."
        ),
    )
    p.add_argument(
        "--name", default="ablation", help="Prefix of the runs and the report folder (default: %(default)s)."
    )
    p.add_argument(
        "--workers",
        type=int,
        help="Seeds played at the same time, each in its own process (default: ablation_workers).",
    )
    p.set_defaults(func=cmd_ablation)

    p = sub.add_parser(
        "report",
        help="Recompute an ablation's report (every table, test, p-value and Holm adjustment) from its outcome files.",
        description=(
            "Reads outcomes.csv, round_outcomes.csv and runs.jsonl, which `coevolve ablation` writes beside its "
            "report.md, and writes the report again from them alone: no warehouse, model or configuration is needed."
        ),
    )
    p.add_argument(
        "folders",
        nargs="+",
        metavar="folder",
        help=(
            "The folder holding the files: state_dir/reports/NAME, or a copy of them. Several folders are parts of "
            "one ablation (the same command with other seeds): one report of all their runs, whose files hold them all."
        ),
    )
    p.add_argument("--out", help="Folder to write the report and its figures to (default: a new temporary folder).")
    p.add_argument(
        "--power-draws",
        type=int,
        default=None,
        metavar="N",
        help=(
            "Simulated experiments per effect size in the power search (default: as many as the ablation draws, "
            "tasks/ablation/report.POWER_DRAWS); fewer is quicker and the power line coarser, every test the same."
        ),
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("lineage", help="Walk a registered checkpoint version back to checkpoint 0 and D_0.")
    common(p)
    p.add_argument(
        "version",
        help=(
            "Model version number, e.g. 3, or an alias: current (the newest round's) or best (highest held-out "
            "success). Of the run's registered model unless --model is given."
        ),
    )
    p.add_argument(
        "--model", help="Registered model name (default: <tracking.registered_model>-<run_id> of the configured run)."
    )
    p.set_defaults(func=cmd_lineage)

    p = sub.add_parser("config", help="Print the effective configuration.")
    common(p)
    p.add_argument("--show", action="store_true")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser(
        "evaluate", help="Score a checkpoint greedily on the environment's official categories and the held-out split."
    )
    common(p)
    p.add_argument("--checkpoint", required=True, help="Model directory or Hugging Face id.")
    p.add_argument(
        "--categories",
        default=None,
        help=(
            "Comma-separated official categories of the environment; BFCL's: base, miss_func, miss_param, "
            "long_context. Default: the environment's (BFCL: multi_turn_base, the paper's protocol)."
        ),
    )
    p.add_argument("--no-heldout", action="store_true", help="Skip the run's held-out synthetic split.")
    p.add_argument("--limit", type=int, default=None, help="Score only the first N tasks of each split.")
    p.add_argument(
        "--dev",
        action="store_true",
        help=(
            "Also score the dev split: 200 synthetic tasks outside the seed pool, the SFT set and the held-out "
            "split, for choosing settings."
        ),
    )
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "serve",
        help=(
            "Start a vLLM rollout server for engine 'openai' (processed logprobs, prefix caching, LoRA and weight "
            "reloads)."
        ),
    )
    common(p)
    p.add_argument("--model", required=True, help="Checkpoint folder to serve: checkpoint 0 of the run for LoRA runs.")
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default loopback only).")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--python", default=None, help="Interpreter with vLLM (default .venv-vllm/bin/python when present).")
    cpu = p.add_mutually_exclusive_group()
    cpu.add_argument(
        "--cpu", dest="cpu", action="store_true", default=None, help="CPU build flags (detected when omitted)."
    )
    cpu.add_argument("--gpu", dest="cpu", action="store_false", help="GPU build: chunked prefill stays on.")
    p.add_argument("--dry-run", action="store_true", help="Print the command line instead of starting the server.")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "build-policy",
        help=(
            "Build checkpoint 0 of the builtin tiny policy from its recipe (tokenizer, SFT) and ship it beside the "
            "code, where round 0 of a run with the same settings copies it instead of building (make policy)."
        ),
    )
    common(p)
    p.add_argument(
        "--output",
        help="Folder to write it to (default: the environment's shipped checkpoint 0, e.g. envs/bfcl/checkpoint0).",
    )
    p.set_defaults(func=cmd_build_policy)

    p = sub.add_parser("status", help="Print a run's rounds: finished ones with their duration, and a running one.")
    common(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "view",
        help="Serve a read-only web view of the warehouse on 127.0.0.1: runs, rounds, episodes, where tasks came from.",
        description=(
            "Pages: / (runs, rounds, curves), /runs/RUN/rounds/R (stages and their costs, groups), /episodes/ID (the "
            "conversation and every tool call), /tasks/ID (the signal and episode a task came from, its later plays). "
            "It reads the warehouse as `coevolve sql` does, never writes, and may run while rounds run; Ctrl-C stops "
            "it. docs/view.md."
        ),
    )
    common(p)
    p.add_argument("--port", type=int, default=8765, help="Port on 127.0.0.1 (default: %(default)s; 0: a free one).")
    p.add_argument(
        "--database",
        help="Warehouse folder or URL (default: the configuration's warehouse.uri, else state_dir/warehouse).",
    )
    p.set_defaults(func=cmd_view)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:  # what was done is recorded: the same command resumes (flows/preflight.py)
        print(exc, file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # before a command started anything
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        console.exit_to_log()  # after the last console line, the exit's own output joins the command's log


def run() -> NoReturn:
    """The installed ``coevolve`` command (and ``python -m flows.cli``): `main`, then a prompt exit."""
    exit_promptly(main())


if __name__ == "__main__":
    run()
