"""The view's web application (FastAPI, Jinja2): one page per thing the warehouse stores, addressed by its ids.

Pages: ``/`` (runs, their rounds, curves, pool growth, signal mix), ``/runs/<run>/rounds/<round>`` (its stages with
their costs, training steps, groups), ``/episodes`` and ``/episodes/<trajectory_id>`` (the conversation and
every tool call), ``/tasks`` and ``/tasks/<task_id>`` (where a synthesized task came from and how it was played
later). Lists take filters as query parameters: ``run``, ``round``, ``task``, ``tool``, ``success``, ``kind``,
``verdict``.

Every request opens its own locked, read-only DuckDB session over the warehouse's files (storage/views.py) and
closes it: nothing is written, nothing is held between requests, and a round running beside the view is seen
as far as it has committed. Model output and task text are untrusted: the templates escape everything
(Jinja2's autoescape), and nothing is marked safe.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import duckdb
import jinja2
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from coevolve.optional import optional_module
from flows.view import charts, queries
from flows.view.queries import Filters
from storage.warehouse import Warehouse

tokenizers = optional_module("tokenizers")

TEMPLATES = Path(__file__).parent / "templates"


def _environment() -> jinja2.Environment:
    # Autoescape on for every template, whatever its name: episodes and tasks hold model output.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["pretty"] = lambda value: json.dumps(value, indent=1, sort_keys=True, default=str)
    env.filters["num"] = lambda value, spec=".3f": "-" if value is None else format(value, spec)
    return env


@functools.lru_cache(maxsize=4)
def _tokenizer(checkpoint: str) -> Any:
    """The run's tokenizer (``tokenizer.json`` of checkpoint 0's folder, read by the tokenizers library, which loads
    in a fraction of a second where transformers takes seconds); None when the folder or the file is not there."""
    path = Path(checkpoint) / "tokenizer.json" if checkpoint else None
    if path is None or not path.is_file():
        return None
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - a file this version cannot read: the page shows the stored text only
        return None


def _flag(text: str | None) -> bool | None:
    """A yes/no query parameter (``success=1``, ``true``, ``yes``; ``0``, ``false``, ``no``); None when empty."""
    if text is None or text == "":
        return None
    return text.lower() in ("1", "true", "yes", "on")


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") and text.lstrip("-").isdigit() else None


def _text(text: str | None) -> str | None:
    return text or None


def session(request: Request) -> Iterator[duckdb.DuckDBPyConnection]:
    """A locked read-only session over the app's warehouse for one request, closed after it."""
    con = request.app.state.warehouse.connect(locked=True)
    try:
        yield con
    finally:
        con.close()


def filters(
    run: str | None = None,
    round: str | None = None,
    task: str | None = None,
    tool: str | None = None,
    success: str | None = None,
    kind: str | None = None,
    verdict: str | None = None,
) -> Filters:
    """The list filters of a request's query parameters; an empty or malformed one filters nothing."""
    return Filters(
        run=_text(run), round=_int(round), task=_text(task), tool=_text(tool), success=_flag(success),
        kind=_text(kind), verdict=_text(verdict),
    )  # fmt: skip


def first_page(found: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The rows a list page shows, and whether the query found more (queries fetch `LIST_ROWS` + 1 to know)."""
    return found[: queries.LIST_ROWS], len(found) > queries.LIST_ROWS


def conversation(task: Any, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The episode as turns: each user message of the task, then the model's steps of that turn (with their tool
    calls and results); a step of a turn the task does not name (an older record) comes after them."""
    messages = list(task.get("turns") or []) if isinstance(task, dict) else []
    count = max([len(messages)] + [int(s["turn"]) + 1 for s in steps if s["turn"] is not None])
    turns = [
        {"user": messages[i] if i < len(messages) else None, "steps": [s for s in steps if s["turn"] == i]}
        for i in range(count)
    ]
    unplaced = [s for s in steps if s["turn"] is None]
    if unplaced:
        turns.append({"user": None, "steps": unplaced})
    return turns


Session = Annotated[duckdb.DuckDBPyConnection, Depends(session)]
Filtered = Annotated[Filters, Depends(filters)]


def create_app(root: str | Path, storage_options: dict[str, Any] | None = None) -> FastAPI:
    """The view over the warehouse at ``root``, opened read-only (a missing or foreign folder is refused here)."""
    warehouse = Warehouse.for_queries(root, storage_options=storage_options)
    templates = Jinja2Templates(env=_environment())
    app = FastAPI(title="coevolve view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.warehouse = warehouse

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(
            request, name, {"root": str(warehouse.root), **context}, status_code=status_code
        )

    def missing(request: Request, what: str) -> HTMLResponse:
        return page(request, "missing.html", status_code=404, what=what)

    @app.exception_handler(duckdb.IOException)
    def changed(request: Request, exc: duckdb.IOException) -> HTMLResponse:
        # A stage run again beside the view replaced a file the page was reading (storage/VIEWS.md, "Querying while
        # a round runs"): loading the page again reads the new files.
        return page(request, "changed.html", status_code=503, detail=str(exc).splitlines()[0])

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request, con: Session, f: Filtered) -> HTMLResponse:
        # ``run``: one run, or the runs whose id starts with it (an ablation's, e.g. ``run=ablation-full``).
        def shown(run_id: str) -> bool:
            return f.run is None or run_id.startswith(f.run)

        rounds = [r for r in queries.rounds(con) if shown(r["run_id"])]
        base = queries.baselines(con)
        heldout: dict[str, dict[int, float]] = {}
        dev: dict[str, dict[int, float]] = {}
        for r in rounds:
            summary = r["summary"]
            # Round r's summary scores checkpoint r+1; checkpoint 0 (the prepare record) sits at x = 0.
            if summary.get("heldout_success") is not None:
                heldout.setdefault(r["run_id"], {})[r["round"] + 1] = float(summary["heldout_success"])
            if summary.get("dev_success") is not None:
                dev.setdefault(r["run_id"], {})[r["round"] + 1] = float(summary["dev_success"])
        for run_id, b in base.items():
            if b["heldout"] is not None and run_id in heldout:
                heldout[run_id][0] = b["heldout"]
            if b["dev"] is not None and run_id in dev:
                dev[run_id][0] = b["dev"]
        pools: dict[str, dict[int, float]] = {}
        for row in filter(lambda row: shown(row["run_id"]), queries.pool_growth(con)):
            pools.setdefault(row["run_id"], {})[row["round"]] = float(row["pool_size"])
        mix = [row for row in queries.signal_mix(con) if shown(row["run_id"])]
        kinds = sorted({row["kind"] for row in mix})
        shares: dict[tuple[str, int], dict[str, Any]] = {}
        for row in mix:
            shares.setdefault((row["run_id"], row["round"]), {})[row["kind"]] = row
        return page(
            request,
            "index.html",
            runs=[r for r in queries.runs(con) if shown(r["run_id"])],
            f=f,
            rounds=rounds,
            charts=[
                c
                for c in (
                    charts.line_chart("held-out success by checkpoint", heldout, y_max=1.0),
                    charts.line_chart("dev success by checkpoint", dev, y_max=1.0),
                    charts.line_chart("pool size by round", pools),
                )
                if c is not None
            ],
            kinds=kinds,
            shares=sorted(shares.items()),
        )

    @app.get("/runs/{run}/rounds/{round_}", response_class=HTMLResponse)
    def round_page(request: Request, con: Session, run: str, round_: int) -> HTMLResponse:
        record = queries.round_record(con, run, round_)
        costs = queries.stage_costs(con, run, round_)
        if record is None and not costs:
            return missing(request, f"round {round_} of run {run}")
        size = queries.group_size(con, run)
        groups, more_groups = first_page(queries.groups(con, run, round_, size))
        return page(
            request,
            "round.html",
            run=run,
            round=round_,
            record=record or {"summary": {}, "status": "unknown", "seconds": None},
            costs=costs,
            steps=queries.training_steps(con, run, round_),
            group_counts=queries.group_counts(con, run, round_, size),
            groups=groups,
            more_groups=more_groups,
            signals=queries.round_signals(con, run, round_),
        )

    @app.get("/episodes", response_class=HTMLResponse)
    def episode_list(request: Request, con: Session, f: Filtered) -> HTMLResponse:
        episodes, more = first_page(queries.episodes(con, f))
        return page(request, "episodes.html", f=f, episodes=episodes, more=more)

    @app.get("/episodes/{trajectory_id:path}", response_class=HTMLResponse)
    def episode_page(request: Request, con: Session, trajectory_id: str) -> HTMLResponse:
        head = queries.episode(con, trajectory_id)
        if head is None:
            return missing(request, f"episode {trajectory_id}")
        tokenizer = _tokenizer(queries.prepared_checkpoint(con, head["run_id"]) or "")
        prompt = tokenizer.decode(head["prompt_ids"], skip_special_tokens=False) if tokenizer is not None else None
        task = queries.task(con, head["task_id"])
        steps = queries.episode_steps(con, head["run_id"], head["round"], trajectory_id)
        return page(
            request,
            "episode.html",
            e=head,
            prompt=prompt,
            turns=conversation(task["task"] if task else None, steps),
            signals=queries.signals_of_episode(con, head["run_id"], trajectory_id),
        )

    @app.get("/tasks", response_class=HTMLResponse)
    def task_list(request: Request, con: Session, f: Filtered) -> HTMLResponse:
        candidates, more = first_page(queries.candidates(con, f))
        return page(request, "tasks.html", f=f, candidates=candidates, more=more)

    @app.get("/tasks/{task_id:path}", response_class=HTMLResponse)
    def task_page(request: Request, con: Session, task_id: str, f: Filtered) -> HTMLResponse:
        task = queries.task(con, task_id)
        made = queries.task_candidates(con, task_id)
        if task is None and not made:
            return missing(request, f"task {task_id}")
        for c in made:
            c["context"] = (
                queries.synthesis_context(con, c["run_id"], c["round"], c["signal_id"]) if c["signal_id"] else None
            )
        return page(
            request,
            "task.html",
            task_id=task_id,
            t=task,
            made=made,
            plays=queries.task_plays(con, task_id, f),
            pools=queries.task_pools(con, task_id),
            f=f,
        )

    return app
