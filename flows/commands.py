"""The command line's commands: each loads the configuration, runs its flow or query and prints the result.

flows/cli.py builds the parser that names them; ``coevolve <command>`` calls ``cmd_<command>`` here.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from coevolve import console
from coevolve.config import PipelineConfig, load_config
from coevolve.errors import ConfigError, PipelineError
from coevolve.optional import optional_module, preload
from coevolve.settings import OFFLINE_ENV, apply_settings
from flows import preflight, query_output
from flows.table import COLUMNS, WIDTHS, format_row, summary_row
from tasks.ablation.arms import arm_run_label

# Each command applies the configuration's settings (offline switches, CPU kernels, Prefect's home)
# before Prefect, MLflow, torch or bfcl-eval load: Prefect reads its settings once, when it
# is imported, and torch picks its CPU kernels then. So the flows and the storage below them are
# imported when a command first uses them (which also keeps `coevolve config` quick).
duckdb = optional_module("duckdb")
if TYPE_CHECKING:
    import agent.serve as serve
    import agent.shipped_policy as shipped_policy
    import flows.ablation as ablation_flow
    import flows.evaluate as evaluate_flow
    import flows.evolve as evolve_flow
    import flows.local_api as local_api
    import flows.progress as progress
    import flows.round as round_flow
    import flows.rounds_target as rounds_target
    import flows.view.serve as view
    import storage.single_file_conversion as migrate
    import storage.state_version as state_version
    import storage.tracking as tracking
    import storage.views as views
    import storage.warehouse as warehouse
    import tasks.ablation.outcomes as ablation_outcomes
    import tasks.ablation.report as ablation_report
    import tasks.evaluate as evaluate_stage
    import tasks.prepare as prepare_stage
else:
    ablation_flow = optional_module("flows.ablation")
    evaluate_flow = optional_module("flows.evaluate")
    evolve_flow = optional_module("flows.evolve")
    local_api = optional_module("flows.local_api")
    progress = optional_module("flows.progress")
    round_flow = optional_module("flows.round")
    rounds_target = optional_module("flows.rounds_target")
    serve = optional_module("agent.serve")
    evaluate_stage = optional_module("tasks.evaluate")
    prepare_stage = optional_module("tasks.prepare")
    shipped_policy = optional_module("agent.shipped_policy")
    migrate = optional_module("storage.single_file_conversion")
    state_version = optional_module("storage.state_version")
    tracking = optional_module("storage.tracking")
    views = optional_module("storage.views")
    warehouse = optional_module("storage.warehouse")
    view = optional_module("flows.view.serve")
    ablation_outcomes = optional_module("tasks.ablation.outcomes")
    ablation_report = optional_module("tasks.ablation.report")


def prepare_environment(config: PipelineConfig, log_file: bool = False, create_state: bool = True) -> None:
    """Offline switches, CPU kernels and state locations, set before torch, prefect, mlflow or bfcl_eval load.

    ``log_file``: the command sends all but its table to a log file (coevolve/console.py). ``create_state``:
    make the state folder (a command that only reads leaves a folder without state as it found it).
    """
    apply_settings(config, prefect_home=True, log_file=log_file, create_state=create_state)


def _load(args: argparse.Namespace, log_file: bool = False, create_state: bool = True) -> PipelineConfig:
    config = load_config(args.config, args.set)
    prepare_environment(config, log_file, create_state)
    # MLflow and its migrations log at INFO on first use; the table is the output people read.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return config


def _no_local_warehouse(root: str | Path) -> bool:
    """A warehouse folder that does not exist (a URL is left for the warehouse itself to check)."""
    return "://" not in str(root) and not Path(root).exists()


def _is_store_connection_error(exc: BaseException) -> bool:
    """An object store that cannot be reached or refuses the credentials (s3fs raises botocore's errors)."""
    module = type(exc).__module__ or ""
    return isinstance(exc, (ConnectionError, TimeoutError, PermissionError)) or module.startswith(
        ("botocore", "aiobotocore", "aiohttp")
    )


@contextmanager
def _store_errors(config: PipelineConfig, root: str | Path) -> Iterator[None]:
    """One line naming the endpoint and the settings instead of the object store client's traceback."""
    try:
        yield
    except Exception as exc:
        if "://" not in str(root) or not _is_store_connection_error(exc):
            raise
        endpoint = (
            config.warehouse.storage_options.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL")
            or "AWS's default"
        )
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PipelineError(
            f"cannot reach the warehouse {root} at endpoint {endpoint} ({first_line}). Check warehouse.storage_options "
            "endpoint_url (or AWS_ENDPOINT_URL), the AWS_* credentials and that the bucket exists."
        ) from None


def cmd_evolve(args: argparse.Namespace) -> int:
    config = _load(args, log_file=True)
    preflight.require_writable(config)  # a read-only state folder: one line before anything reads or writes it
    with _store_errors(config, config.warehouse_path):
        state_version.check_state(config)  # a state folder made by another version: refused before any work
    # --rounds is a target (flows/rounds_target.py): one already reached is told here, before Prefect
    # starts or a log file opens, so running the command again on a finished run changes nothing on disk.
    target = None if args.more is not None else (config.rounds if args.rounds is None else args.rounds)
    if target is not None:
        with _store_errors(config, config.warehouse_path):
            finished = rounds_target.finished_rounds(config)
        if finished >= target:
            with _store_errors(config, config.warehouse_path):
                state_version.refuse_other_finished_run(config, finished)  # another configuration's rounds
            print(rounds_target.nothing_to_run(config, finished, target), flush=True)
            return 0
    with _store_errors(config, config.warehouse_path):
        resumed = preflight.check(config)  # the round lock and the round's inputs, refused before Prefect starts
    log = console.command_log(config.state_dir, "evolve")
    if resumed:
        print(resumed, flush=True)
    # The flow prints the table as each round finishes (the nightly deployment runs the same flow); the
    # rest of the run's output goes to the log. An error leaves the block first, so its line reaches the console.
    with preflight.reported(config, None, log), console.log_to_file(log):
        # The libraries the rounds import, imported while the command's Prefect API starts in another process.
        local_api.start(while_starting=functools.partial(preload, round_flow.round_imports(config)))
        with local_api.no_heartbeats_on_temporary_api():
            evolve_flow.coevolve_evolve(
                rounds=target, more_rounds=args.more, config=config.model_dump(mode="json"), print_table=True
            )
    return 0


def cmd_round(args: argparse.Namespace) -> int:
    config = _load(args, log_file=True)
    preflight.require_writable(config)
    # Before any work: a state folder made by another version is refused; a finished round is never run again.
    with _store_errors(config, config.warehouse_path):
        finished = state_version.finished_round_notice(config, args.round)
    if finished is not None:
        print(finished)
        return 0
    with _store_errors(config, config.warehouse_path):
        resumed = preflight.check(config, args.round)  # the round lock and its inputs, refused before Prefect starts
    log = console.command_log(config.state_dir, "round")
    if resumed:
        print(resumed, flush=True)
    t0 = time.perf_counter()
    # As `coevolve evolve`: the table on the console, the rest of the round's output in the log.
    with preflight.reported(config, args.round, log), console.log_to_file(log):
        local_api.start(while_starting=functools.partial(preload, round_flow.round_imports(config)))
        with local_api.no_heartbeats_on_temporary_api():
            summary = round_flow.coevolve_round(round_=args.round, config=config.model_dump(mode="json"))
        print(format_row(COLUMNS), file=console.table_stream())
        print(summary_row(summary, time.perf_counter() - t0), file=console.table_stream(), flush=True)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    config = _load(args, create_state=False)
    root = args.database or config.warehouse_path
    if _no_local_warehouse(root):
        raise PipelineError(f"No warehouse at {root}; run `coevolve evolve` first or pass --database.")
    # Read-only and lock-free: the views scan the table files, which writers replace atomically. Only reads
    # run, in a session that opens no file outside the warehouse (storage/views.py, WarehouseViews.sql).
    with (
        _store_errors(config, root),
        warehouse.Warehouse.for_queries(root, storage_options=config.warehouse.storage_options) as wh,
    ):
        timeout = config.warehouse.query_timeout_s if args.timeout is None else (args.timeout or None)
        # DuckDB spills past its memory limit to a folder of the query's own under the state folder (when there is
        # one: `--database` may name a warehouse elsewhere), removed when the query ends.
        spill_root = config.state_dir / "tmp" if config.state_dir.is_dir() else None
        limits = views.QueryLimits(timeout, config.warehouse.query_memory_mb, spill_root)
        shown = query_output.rows_to_show(args.limit, args.format)
        try:
            result = wh.query(args.query, rows=shown, limits=limits)
        except duckdb.Error as exc:
            # The database's own words on one line; the echo of the query and its ^ pointer are left out.
            lines = (line.strip() for line in str(exc).splitlines())
            message = " ".join(line for line in lines if line.strip("^") and not line.startswith("LINE "))
            raise PipelineError(f"query failed: {message}") from None
    text, note = query_output.render(result.frame, args.format, shown, total=result.total)
    print(text)
    if note is not None:  # CSV and JSON stay parseable: what was left out is said beside them
        print(note, file=sys.stderr)
    return 0


def cmd_warehouse_migrate(args: argparse.Namespace) -> int:
    """Convert a single-file warehouse to the open-table layout and compare every table; 1 when any differs."""
    config = load_config(args.config, args.set)
    source = Path(args.path) if args.path else config.state_dir / "warehouse.duckdb"
    target = args.target or str(migrate.default_target(source))
    options = config.warehouse.storage_options
    if args.check:
        report = migrate.compare(source, target, storage_options=options)
    else:
        print(f"converting {source} to {target}")
        report = migrate.migrate(source, target, storage_options=options)
    print(report.format())
    if not report.ok:
        print(
            f"error: {', '.join(report.mismatched)} differ between {source} and {report.target}; nothing was deleted. "
            "Inspect the new warehouse, move it aside and convert again; the old file is unchanged.",
            file=sys.stderr,
        )
        return 1
    print(f"every table matches; {source} is unchanged and can be archived.")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    config = _load(args)
    name = args.model or config.registered_model_name
    # Read-only: lineage only reads, so a read-only state folder (or a store another process writes) answers.
    tracker = tracking.Tracker(
        config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir, read_only=True
    )
    chain = tracker.lineage(name, args.version)
    alias = "" if args.version.isdigit() else f" (alias {args.version})"
    print(f"lineage of {name} version {chain[0]['version']}{alias}, newest first")
    for entry in chain:
        print(
            f"version {entry['version']}  (round {entry['coevolve.round']} of run {entry['coevolve.run_id']}, "
            f"flow run {entry['flow_run_id'] or '-'})"
        )
        print(f"    checkpoint digest     {entry['checkpoint_digest']}")
        print(f"    trained from pool     {entry['pool_digest']}")
        print(f"    its round produced    {entry['produced_pool_digest']}")
        print(
            f"    trained on            {entry['trajectories.count'] or '?'} trajectories of run "
            f"{entry['trajectories.run_id'] or '?'} round {entry['trajectories.round'] or '?'} "
            f"(ids digest {entry['trajectories.ids_digest'][:16] or '?'})"
        )
        if entry.get("trajectories.copied_from"):
            # A later arm of an ablation seed reuses the first arm's round 0 (flows/ablation_round0.py copy_round0).
            print(f"    round 0 copied from   run {entry['trajectories.copied_from']}")
        if entry.get("checkpoint_artifacts"):  # MLflow's copy of the checkpoint: what a damaged folder is restored from
            print(f"    checkpoint copy       {entry['checkpoint_artifacts']}")
        if entry.get("run_artifacts"):  # the round's MLflow run: its pool/ holds the pools it trained on and produced
            print(f"    run artifacts         {entry['run_artifacts']}")
        round_ = int(entry["coevolve.round"] or 0)
        if entry["parent_version"]:
            parent = f"version {entry['parent_version']}"
        elif round_ == 0:
            parent = "checkpoint 0"
        else:  # registered after the MLflow store was moved aside: its parent's version is in the old store
            parent = f"round {round_}'s input checkpoint, not registered in this MLflow store"
        print(f"    parent                {parent} (digest {entry['parent_checkpoint_digest']})")
    root = chain[-1]
    first_round = int(root["coevolve.round"] or 0)
    run = config.with_overrides({"run_id": root["coevolve.run_id"] or config.run_id})
    if first_round > 0:
        # The versions before it were registered in a store that was moved aside (or restored without them).
        print(f"checkpoint {first_round}  {root['parent_checkpoint']}  digest {root['parent_checkpoint_digest']}")
        print(f"pool {first_round}        {run.pool_path(first_round)}  digest {root['pool_digest']}")
        print(
            f"rounds 0..{first_round - 1} were registered in an earlier MLflow store (moved aside); their lineage is "
            "in the warehouse: coevolve sql \"SELECT round, output->>'model_version', output->>'checkpoint_digest' "
            "FROM stage_runs WHERE stage = 'version' ORDER BY round\""
        )
        return 0
    print(f"checkpoint 0  {root['parent_checkpoint']}  digest {root['parent_checkpoint_digest']}")
    print(f"D_0           {run.pool_path(0)}  digest {root['pool_digest']}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.set)
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    config = _load(args)
    # Checked before the flow starts, so a typo fails in a second with the valid names.
    given = args.categories.split(",") if args.categories is not None else None
    categories = [
        evaluate_stage.category_name(config.environment, c.strip())
        for c in (given if given is not None else evaluate_stage.default_categories(config.environment))
        if c.strip()
    ]
    # A temporary Prefect API that ends with this command, however it ends; the checkpoint's libraries are imported
    # while it starts.
    local_api.start(while_starting=functools.partial(preload, evaluate_flow.EVALUATE_IMPORTS))
    with local_api.no_heartbeats_on_temporary_api():
        results = evaluate_flow.coevolve_evaluate(
            checkpoint=args.checkpoint,
            categories=categories,
            heldout=not args.no_heldout,
            config=config.model_dump(mode="json"),
            limit=args.limit,
            dev=args.dev,
        )
    for split, accuracy in results.items():
        print(f"{split:<26} {accuracy:.3f}")
    overall = evaluate_stage.official_overall(config.environment, results)
    if overall is not None:
        name, value = overall
        official = evaluate_stage.official_categories(config.environment)
        missing = [c for c in official if c not in results]
        note = f"  ({', '.join(missing)} not evaluated: counted as 0, as the leaderboard does)" if missing else ""
        print(f"{name:<26} {value:.3f}{note}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """The run's rounds; 1 with one line, and nothing written, when the state folder holds no round of it."""
    config = _load(args, create_state=False)
    root = config.warehouse_path
    if _no_local_warehouse(root):
        records = []
    else:
        with (
            _store_errors(config, root),
            warehouse.Warehouse(root, read_only=True, storage_options=config.warehouse.storage_options) as wh,
        ):
            records = wh.round_records(config.run_id)
    if not records:
        where = f"the warehouse {root}" if "://" in str(root) else f"state folder {console.shown(config.state_dir)}"
        print(
            f"no round of run {config.run_id!r} in {where}: start one with `coevolve evolve` (`make run`), or name "
            "the folder of a run with --set state_dir=DIR",
            file=sys.stderr,
        )
        return 1
    print(format_row(COLUMNS))
    for r in records:
        started = datetime.fromisoformat(r["started_at"]) if r.get("started_at") else None
        if r.get("status") == "finished" and r.get("summary"):
            ended = datetime.fromisoformat(r["finished_at"]) if r.get("finished_at") else started
            seconds = (ended - started).total_seconds() if started and ended else 0.0
            print(summary_row(r["summary"], seconds))
        else:
            since = f"since {started:%Y-%m-%d %H:%M:%S} UTC" if started else ""
            print(f"{r['round']:>{WIDTHS[0]}}  {r.get('status') or 'unknown'} {since}".rstrip())
    return 0


def cmd_ablation(args: argparse.Namespace) -> int:
    config = _load(args, log_file=True)
    arms = args.arms.split(",") if args.arms else list(ablation_flow.ARMS)
    unknown = [a for a in arms if a not in ablation_flow.ARMS]
    if unknown:
        raise PipelineError(f"Unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ablation_flow.ARMS)}.")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.workers is not None:
        config = config.with_overrides({"ablation_workers": args.workers})
    run_ids = [cfg.run_id for _, _, cfg in ablation_flow.arm_configs(config, arms, seeds, args.name)]
    rounds = config.ablation_rounds if args.rounds is None else args.rounds
    t0 = time.perf_counter()
    log = console.command_log(config.state_dir, "ablation")
    # As `coevolve evolve`: the runs' output goes to the log, Ctrl-C or SIGTERM ends the command in one line
    # (the seeds' processes too), and the same command resumes every run where it stopped. On a terminal, a bar
    # counts the runs' finished rounds.
    with preflight.reported(config, None, log, where=f"ablation '{args.name}'"), console.log_to_file(log):
        local_api.start()  # the arms' pool processes report to it and it ends with the command
        with (
            progress.rounds_bar(config, run_ids, rounds, f"ablation '{args.name}'"),
            local_api.no_heartbeats_on_temporary_api(),
        ):
            out = ablation_flow.coevolve_ablation(
                arms=arms,
                seeds=seeds,
                rounds=rounds,
                official_limit=args.official_limit,
                name=args.name,
                config=config.model_dump(mode="json"),
            )
    print(Path(out["report"]).read_text())
    print(f"report: {out['report']} ({time.perf_counter() - t0:.0f}s)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Recompute an ablation's report from the outcome files written beside it (tasks/ablation/outcomes.py).

    Several folders are the parts of one ablation (other seeds, played elsewhere): one report tests them together.
    """
    parts = {folder: ablation_outcomes.read_results(Path(folder)) for folder in args.folders}
    results = ablation_outcomes.merge_results(parts)
    if not results:
        raise PipelineError(f"{' and '.join(f'{f}/{ablation_outcomes.RUNS_FILE}' for f in parts)}: no runs.")
    first = results[0]
    suffix = f"-{arm_run_label(first['arm'])}-s{first['seed']}"
    name = first["run_id"].removesuffix(suffix)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=f"report-{name}-"))
    draws = args.power_draws or ablation_report.POWER_DRAWS
    written = ablation_report.write_report(results, out, f"Ablation `{name}`", power_draws=draws)
    print(Path(written["report"]).read_text())
    print(f"report: {written['report']}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Start one rollout server (vLLM) the way engine 'openai' expects it, in the foreground.

    Stopping this process (SIGTERM, SIGINT, SIGHUP) stops the server and every process it started.
    """
    config = load_config(args.config, args.set)
    model = Path(args.model).expanduser()
    if not model.exists() and (model.is_absolute() or args.model.startswith(".") or len(model.parts) > 2):
        raise PipelineError(
            f"No checkpoint folder at {model.resolve()}. Checkpoint 0 of a run is "
            f"{config.state_dir / 'models'}/<name> (the policy built by round 0); round r's is "
            f"{config.checkpoint_dir(1).parent}/round-NNN (from round-001 on)."
        )
    overrides: dict[str, Any] = {"host": args.host, "port": args.port}
    if args.cpu is not None:
        overrides["cpu"] = args.cpu
    options = serve.ServeOptions.from_config(config, args.model, **overrides)
    command = " ".join(serve.server_command(options, args.python))
    if args.dry_run:
        print(command)
        return 0
    if args.python is not None and shutil.which(args.python) is None:
        raise PipelineError(
            f"--python {args.python} is not an interpreter this user can run (no such executable file); name the "
            "python of an environment with vLLM (`make setup-vllm` builds .venv-vllm/bin/python, used when --python "
            "is left out)."
        )
    print(command, file=sys.stderr, flush=True)
    return serve.serve_foreground(options, args.python)


def cmd_build_policy(args: argparse.Namespace) -> int:
    """Build checkpoint 0 of the configuration from the recipe and ship it (``make policy``)."""
    config = _load(args)
    folder = Path(args.output).resolve() if args.output else prepare_stage.shipped_folder(config)
    if folder is None:
        raise ConfigError(
            f"environment {config.environment.name!r} ships no checkpoint 0 (its `shipped_checkpoint` is None): "
            "name the folder to write it to with `coevolve build-policy --output DIR`."
        )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coevolve-policy-") as scratch:
        record = prepare_stage.rebuild_shipped_policy(config, Path(scratch), folder)
    print(f"checkpoint 0 built in {time.perf_counter() - t0:.0f}s and written to {folder}")
    print(f"files digest {record['checkpoint_digest']}; what it was built from: {shipped_policy.record_path(folder)}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the read-only view of the warehouse on 127.0.0.1 until Ctrl-C (flows/view/)."""
    config = load_config(args.config, args.set)
    for key, value in OFFLINE_ENV.items():  # the view may load the run's tokenizer: never from the hub
        os.environ.setdefault(key, value)
    root = args.database or config.warehouse_path
    if _no_local_warehouse(root):
        raise PipelineError(f"No warehouse at {root}; run `coevolve evolve` first or pass --database.")
    with _store_errors(config, root):
        try:
            return view.serve(root, args.port, storage_options=config.warehouse.storage_options)
        except KeyboardInterrupt:
            return 0
