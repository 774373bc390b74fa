"""Where a round's wall time goes, by part: one real round, its training steps and its per-round stages.

Runs one round of the configuration (default: the embedded default policy, whose checkpoint 0 is shipped
in envs/bfcl/checkpoint0) in this process through the real round flow (`flows.round.coevolve_round`, as
``coevolve round`` runs it), with ``training.batches_per_round`` set by ``--steps``, in a fresh state
folder. Nothing in the project changes: the script wraps the functions the round calls with timers
for the length of the round and puts the originals back afterwards.

What is timed, and how it nests (a part's time includes the parts listed under it; the outermost call
of a part counts, so a part calling itself or another call of the same part is not counted twice):

- each stage as the round calls it (``run_stage``), split into the Prefect task's own overhead (the
  stage less its task body), the stage record (the task body less the stage function: the stage's
  warehouse session, the record's lookup and write) and the parts of the stage function;
- inside them: engine open and weight load (`TransformersEngine.__init__`/``reload``), generation
  (``generate``), engine close, playing episodes (`play_episodes`), the environment (the configured
  environment class's construction, ``reset``, ``step``, ``score``), warehouse writes, reads and session
  opens (`Warehouse` methods), MLflow (`Tracker`), prepare's pools, checkpoint 0, splits and baseline
  scoring, evaluate's scoring, and in the update the policy load, trainer construction,
  ``trainer.train()`` (of which the trainer state load), the reference model load, trainer state save and
  checkpoint save;
- the round's own calls: its checks, run slot and lock, releasing a step's folder, the finish record;
- the episode stepping `play_episodes` runs on its worker thread (decode, environment step, encode)
  while the engine generates the next chunk: timed on that thread, marked "concurrent" and left out
  of the sums, since it overlaps the parts beside it.

Each part with parts inside it also gets a "rest" line: its time not inside any of them. Step parts
are reported as means over the round's steps; the rest per round.

    .venv/bin/python benchmarks/step_parts.py --steps 10
    .venv/bin/python benchmarks/step_parts.py --steps 2 --set rollout.tasks_per_batch=4

Prints a markdown table and one JSON line; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect.context import refresh_global_settings_context

import flows.round as round_flow
import tasks.evaluate as evaluate_module
import tasks.prepare as prepare_module
import tasks.rollout as rollout_module
import tasks.training.grpo_trainer as grpo_trainer
from agent.transformers_engine import TransformersEngine
from coevolve.config import PipelineConfig, load_config
from envs.registry import environment_class
from flows import local_api
from flows.commands import prepare_environment
from flows.stage import _BY_INPUT, STAGES
from storage import tracking
from storage.warehouse import Warehouse

STEP_STAGES = ("rollout", "update")
CONCURRENT = "concurrent: "
Path_ = tuple[str, ...]

# Warehouse methods by what they do; every one is wrapped on the Warehouse class.
WAREHOUSE_WRITES = (
    "ensure_run", "start_round", "finish_round", "mark_stage", "write_trajectories", "write_batch", "write_signals",
    "write_candidates", "write_evaluations", "set_pool", "write_tasks",
)  # fmt: skip
WAREHOUSE_READS = (
    "stage_output", "round_records", "training_steps", "rounds", "finished_round", "round_status", "signals",
    "evaluation_rows", "evaluation_outcomes", "pool", "stored_episodes", "outcomes", "tool_sequences", "trajectories",
    "trajectory_frame", "trajectory_scan", "task_difficulty", "sql",
)  # fmt: skip


class PartTimer:
    """Wall time by nested part: a call's time goes to the path of the parts open around it on its thread."""

    def __init__(self) -> None:
        self.seconds: dict[Path_, float] = defaultdict(float)
        self.calls: dict[Path_, int] = defaultdict(int)
        self.round_calls: list[tuple[str, float]] = []  # the round's own calls (stages, releases), in order
        self._lock = threading.Lock()
        self._local = threading.local()
        self._main = threading.main_thread()
        # The path of the episodes being played now: a part timed on another thread (the episode stepper of
        # play_episodes) goes under it, marked concurrent, since it overlaps what the main thread does meanwhile.
        self.anchor: Path_ = ()

    def _stack(self) -> list[str]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[str] = self._local.stack
        return stack

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        stack = self._stack()
        if name in stack or (CONCURRENT + name) in stack:
            yield  # inside a call of the same part: the outer call counts
            return
        on_main = threading.current_thread() is self._main
        if not on_main and not stack:
            self._local.base = self.anchor  # a worker thread's parts start under the episodes being played
        label = name if on_main or stack else CONCURRENT + name
        base: Path_ = () if on_main else self._local.base
        stack.append(label)
        path = base + tuple(stack)
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            stack.pop()
            with self._lock:
                self.seconds[path] += elapsed
                self.calls[path] += 1
                if on_main and len(path) == 2:
                    self.round_calls.append((label, elapsed))

    def path(self) -> Path_:
        return tuple(self._stack())


class Wrapped:
    """Attributes replaced by timed versions, put back by `restore`."""

    def __init__(self, timer: PartTimer) -> None:
        self.timer = timer
        self._undo: list[Callable[[], None]] = []

    def timed(self, function: Callable[..., Any], name: str | Callable[..., str]) -> Callable[..., Any]:
        timer = self.timer

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with timer.part(name if isinstance(name, str) else name(*args, **kwargs)):
                return function(*args, **kwargs)

        return run

    def attribute(self, owner: Any, attribute: str, name: str | Callable[..., str]) -> None:
        original = owner.__dict__[attribute] if attribute in vars(owner) else getattr(owner, attribute)
        setattr(owner, attribute, self.timed(original, name))
        if attribute in vars(owner):
            self._undo.append(lambda: setattr(owner, attribute, original))
        else:
            self._undo.append(lambda: delattr(owner, attribute))

    def context(self, owner: Any, attribute: str, name: str) -> None:
        """A context manager function: entering and leaving it are timed as ``name``, what runs inside it is not."""
        original, timer = getattr(owner, attribute), self.timer

        @functools.wraps(original)
        @contextlib.contextmanager
        def run(*args: Any, **kwargs: Any) -> Iterator[Any]:
            stack = contextlib.ExitStack()
            with timer.part(name):
                value = stack.enter_context(original(*args, **kwargs))
            try:
                yield value
            except BaseException:
                with timer.part(name):
                    if not stack.__exit__(*sys.exc_info()):
                        raise
            else:
                with timer.part(name):
                    stack.close()

        setattr(owner, attribute, run)
        self._undo.append(lambda: setattr(owner, attribute, original))

    def anchored(self, owner: Any, attribute: str, name: str) -> None:
        """Like `attribute`, and what other threads time while it runs goes under it."""
        original, timer = getattr(owner, attribute), self.timer

        @functools.wraps(original)
        def run(*args: Any, **kwargs: Any) -> Any:
            with timer.part(name):
                outer, timer.anchor = timer.anchor, timer.path()
                try:
                    return original(*args, **kwargs)
                finally:
                    timer.anchor = outer

        setattr(owner, attribute, run)
        self._undo.append(lambda: setattr(owner, attribute, original))

    def stage_function(self, run: Callable[..., Any], stage_name: str) -> None:
        """The stage function inside a registered stage's task body (tasks/registry.py's ``run`` closure)."""
        cell = run.__closure__[run.__code__.co_freevars.index("function")]  # type: ignore[index]
        original = cell.cell_contents
        cell.cell_contents = self.timed(original, f"{stage_name} function")
        self._undo.append(lambda: setattr(cell, "cell_contents", original))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _stage_name(cfg: PipelineConfig, inputs: Any) -> str:
    return _BY_INPUT[type(inputs)].name


def instrument(wrapped: Wrapped, environment: str) -> None:
    """Wrap every part the round calls (see the module's docstring)."""
    # The round's calls: each stage (by name, steps aggregated), releasing a step's folder, the round's end.
    wrapped.attribute(round_flow, "run_stage", _stage_name)
    wrapped.attribute(round_flow, "release_step_checkpoint", "release of the previous step's folder")
    wrapped.attribute(round_flow, "finish_round", "finish round record")
    for check in (
        "apply_settings",
        "check_state",
        "finished_round_result",
        "check_round_stores",
        "follow_moved_records",
    ):
        wrapped.attribute(round_flow, check, "round checks (state, stores, finished round)")
    wrapped.context(round_flow, "run_slot", "run slot (Prefect global concurrency limit)")
    wrapped.context(round_flow, "round_lock", "round lock")
    # Prepare: the pools, checkpoint 0 (copied from envs/bfcl/checkpoint0 or built), the splits, the baseline scores.
    wrapped.attribute(prepare_module, "build_initial_pools", "initial pools")
    wrapped.attribute(prepare_module, "initial_checkpoint", "checkpoint 0 (copied or built)")
    wrapped.attribute(prepare_module, "store_dev_split", "dev and final held-out splits")
    wrapped.attribute(prepare_module, "store_final_heldout", "dev and final held-out splits")
    wrapped.attribute(prepare_module, "evaluate_splits", "checkpoint 0 scored on held-out and dev tasks")
    wrapped.attribute(evaluate_module, "evaluate_splits", "scoring on held-out and dev tasks")
    wrapped.attribute(tracking.Tracker, "__init__", "MLflow (tracker open, log_round)")
    wrapped.attribute(tracking.Tracker, "log_round", "MLflow (tracker open, log_round)")
    for stage in STAGES.values():
        wrapped.attribute(stage.task, "fn", f"{stage.name} task body")
        wrapped.stage_function(vars(stage.task)["fn"].__wrapped__, stage.name)
    # The engine, the environment, the warehouse.
    wrapped.attribute(TransformersEngine, "__init__", "engine open and weight load")
    wrapped.attribute(TransformersEngine, "reload", "engine open and weight load")
    wrapped.attribute(TransformersEngine, "generate", "generation")
    wrapped.attribute(TransformersEngine, "close", "engine close")
    for method in ("__init__", "reset", "step", "score"):
        wrapped.attribute(environment_class(environment), method, "environment")
    for method in WAREHOUSE_WRITES:
        wrapped.attribute(Warehouse, method, "warehouse writes")
    for method in WAREHOUSE_READS:
        wrapped.attribute(Warehouse, method, "warehouse reads")
    wrapped.attribute(Warehouse, "__init__", "warehouse open and close")
    wrapped.attribute(Warehouse, "close", "warehouse open and close")
    # The rollout's episode stepping (on its worker thread) and the update's parts.
    wrapped.anchored(rollout_module, "play_episodes", "playing episodes (play_episodes)")
    wrapped.anchored(evaluate_module, "play_episodes", "playing episodes (play_episodes)")
    wrapped.attribute(rollout_module, "advance_episode", "episode stepping")
    wrapped.attribute(grpo_trainer, "load_policy", "policy load")
    wrapped.attribute(grpo_trainer.ReplayGRPOTrainer, "__init__", "trainer construction")
    wrapped.attribute(grpo_trainer.ReplayGRPOTrainer, "train", "trainer.train() (optimizer steps)")
    wrapped.attribute(grpo_trainer.ReplayGRPOTrainer, "_load_optimizer_and_scheduler", "trainer state load")
    wrapped.attribute(grpo_trainer.ReplayGRPOTrainer, "_load_rng_state", "trainer state load")
    wrapped.attribute(grpo_trainer, "use_reference", "reference model load")
    wrapped.attribute(grpo_trainer, "save_trainer_state", "trainer state save")
    wrapped.attribute(grpo_trainer, "save_atomically", "checkpoint save")


ROOT = "round"
REST = "rest"
API = "Prefect temporary API start"


def step_seconds(round_calls: list[tuple[str, float]]) -> list[float]:
    """Each training step's wall time: its rollout, its update and the release that follows the update."""
    steps: list[float] = []
    for name, seconds in round_calls:
        if name == "rollout":
            steps.append(seconds)
        elif steps and _is_step_part(name):
            steps[-1] += seconds
    return steps


def _is_step_part(name: str) -> bool:
    return name in STEP_STAGES or name.startswith("release")


def _children(seconds: dict[Path_, float], parent: Path_) -> list[Path_]:
    return [p for p in seconds if len(p) == len(parent) + 1 and p[: len(parent)] == parent]


def _order(round_order: list[str], path: Path_, seconds: float) -> tuple[int, int, float]:
    name = path[-1]
    concurrent = name.startswith(CONCURRENT)
    rank = round_order.index(name) if len(path) == 2 and name in round_order else len(round_order)
    return (int(concurrent), rank, -seconds)


OVERHEAD = "Prefect task overhead (the stage less its task body)"
RECORD = "stage record and session (the task body less the stage function)"


def collapse(seconds: dict[Path_, float], calls: dict[Path_, int]) -> tuple[dict[Path_, float], dict[Path_, int]]:
    """Each stage's parts as stage -> (Prefect task overhead, stage record, the stage function's parts).

    A stage function's parts move up to the stage; what its task body does outside the function (the
    warehouse session, the record's lookup and write) is the stage record's line, whatever it is made of.
    """
    out: dict[Path_, float] = defaultdict(float)
    out_calls: dict[Path_, int] = defaultdict(int)
    for path, value in seconds.items():
        moved = path
        if len(path) >= 3 and path[2] == f"{path[1]} task body":
            if len(path) == 3:
                out[(*path[:2], OVERHEAD)] += seconds[path[:2]] - value
                out_calls[(*path[:2], OVERHEAD)] += calls.get(path, 0)
                function = (*path, f"{path[1]} function")
                out[(*path[:2], RECORD)] += value - seconds.get(function, 0.0)
                out_calls[(*path[:2], RECORD)] += calls.get(path, 0)
                continue
            if path[3] != f"{path[1]} function" or len(path) == 4:
                continue  # inside the record's line, or the function itself (its parts follow)
            moved = (*path[:2], *path[4:])
        out[moved] += value
        out_calls[moved] += calls.get(path, 0)
    return out, out_calls


def parts_table(timer: PartTimer, steps: int) -> list[dict[str, Any]]:
    """The rows of the table, depth first: every timed part, and for each part with parts inside it, its rest.

    A row says its depth, its seconds in the round, its calls, whether it is a step part (reported per step
    too), whether it ran concurrently (left out of its parent's sum) and, for a rest, that it is one.
    """
    seconds, calls = collapse(timer.seconds, timer.calls)
    round_order = [name for name, _ in timer.round_calls]
    round_order = list(dict.fromkeys(round_order))
    rows: list[dict[str, Any]] = []

    def visit(path: Path_, step_part: bool, concurrent: bool) -> None:
        total = seconds[path]
        name = path[-1]
        concurrent = concurrent or name.startswith(CONCURRENT)
        rows.append(
            {"part": name, "depth": len(path) - 1, "seconds": total, "calls": calls[path], "step": step_part,
             "concurrent": concurrent, "rest": False, "path": list(path)}
        )  # fmt: skip
        inside = sorted(_children(seconds, path), key=lambda p: _order(round_order, p, seconds[p]))
        for child in inside:
            visit(child, step_part or (len(child) == 2 and _is_step_part(child[-1])), concurrent)
        if inside:
            summed = sum(seconds[c] for c in inside if not c[-1].startswith(CONCURRENT))
            rows.append(
                {"part": REST, "depth": len(path), "seconds": total - summed, "calls": 0, "step": step_part,
                 "concurrent": concurrent, "rest": True, "path": [*path, REST]}
            )  # fmt: skip

    for root in sorted(_children(seconds, ()), key=lambda p: p[-1] == API):
        visit(root, False, False)
    for row in rows:
        row["per_step"] = row["seconds"] / steps if row["step"] and steps else None
    return rows


def _label(row: dict[str, Any]) -> str:
    name = row["part"]
    if row["rest"]:
        parent = row["path"][-2]
        if parent in STAGES:
            name = "rest of the stage function (in no part above)"
        elif parent == ROOT:
            name = "rest of the round: Prefect flow run, round record, flow code"
        else:
            name = "rest (in no part above)"
    elif row["depth"] == 1 and name in STAGES:
        name = f"{name} stage"
    elif name.startswith(CONCURRENT):
        name = name[len(CONCURRENT) :] + " on play_episodes' worker thread (concurrent with generation, not summed)"
    elif row["concurrent"]:
        name += " (concurrent, not summed)"
    indent = "&nbsp;&nbsp;" * max(row["depth"] - 1, 0) + ("of which " if row["depth"] > 1 else "")
    return indent + name


SHOWN_FROM_S = 0.005  # parts under this many seconds a round stay out of the table (they are in the JSON line)


def markdown(rows: list[dict[str, Any]], steps: int, round_s: float) -> str:
    lines = [
        f"| part | per step (mean of {steps}) | per round | share of round |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        if row["seconds"] < SHOWN_FROM_S and row["depth"] > 1:
            continue
        per_step = "" if row["per_step"] is None else f"{row['per_step']:.3f} s"
        share = "" if row["part"] == API else f"{100 * row['seconds'] / round_s:.1f}%"
        label = _label(row)
        if row["depth"] == 0:
            label = f"**{'whole round' if row['part'] == ROOT else label + ' (before the round, not in it)'}**"
        lines.append(f"| {label} | {per_step} | {row['seconds']:.2f} s | {share} |")
    step_total = sum(r["seconds"] for r in rows if r["depth"] == 1 and r["step"])
    lines.append(
        f"| **training steps: rollout + update + release, all {steps}** | **{step_total / steps:.3f} s** | "
        f"**{step_total:.2f} s** | **{100 * step_total / round_s:.1f}%** |"
    )
    return "\n".join(lines)


def measure(config: PipelineConfig) -> dict[str, Any]:
    """Run round 0 of ``config`` with every part timed; the table's rows and the round's figures."""
    steps = config.training.batches_per_round
    timer = PartTimer()
    wrapped = Wrapped(timer)
    instrument(wrapped, config.environment.name)
    try:
        with timer.part(API):
            local_api.start()
        with timer.part(ROOT):
            summary = round_flow.coevolve_round(round_=0, config=config.model_dump(mode="json"))
    finally:
        wrapped.restore()
    rows = parts_table(timer, steps)
    round_s = timer.seconds[(ROOT,)]
    per_step = step_seconds(timer.round_calls)
    return {
        "steps": steps,
        "round_s": round_s,
        "steps_s": sum(per_step),
        "s_per_step": sum(per_step) / len(per_step) if per_step else None,
        "step_s": per_step,
        "rows": rows,
        "rollouts": summary.get("rollouts"),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="training.batches_per_round of the round (default 10)")
    parser.add_argument("--state-dir", help="a fresh state folder (default: a temporary one, deleted afterwards)")
    parser.add_argument("--config", help="YAML configuration file, as coevolve --config (default: the defaults)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override one field; repeatable"
    )
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        state_dir = args.state_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="step-parts-"))
        if Path(state_dir).exists() and any(Path(state_dir).iterdir()):
            raise SystemExit(f"--state-dir {state_dir} is not empty; the round must start in a fresh state folder.")
        overrides = [*args.set, f"state_dir={state_dir}", f"training.batches_per_round={args.steps}"]
        config = load_config(args.config, overrides)
        prepare_environment(config)  # as the CLI: offline switches, CPU threads, Prefect's home in the state folder
        # Prefect loaded with this module's imports, before those settings: it reads them again, so the round's
        # temporary API gets the commands' start-up timeout (coevolve/settings.py), not Prefect's 20 s.
        refresh_global_settings_context()
        result = measure(config)
    result["load_average_before"], result["load_average_after"] = load_before, os.getloadavg()
    print(markdown(result["rows"], result["steps"], result["round_s"]))
    print(
        f"\nround {result['round_s']:.2f} s; {result['steps']} steps {result['steps_s']:.2f} s, "
        f"{result['s_per_step']:.3f} s per step"
    )
    print(json.dumps(result, default=str))
    return result


if __name__ == "__main__":
    main()
