"""An ablation's results as three small files beside its report, and back: what `coevolve report` recomputes from.

- ``outcomes.csv``: one row per task of the tested split (the final held-out split when the ablation scored it),
  ``task_id``, then ``checkpoint0`` and one column per run named ``<arm>/s<seed>``: 1 where that checkpoint
  solved the task, 0 where it did not.
- ``round_outcomes.csv``: one row per task of the per-round held-out split, ``task_id``, then ``checkpoint0``
  and one column per run and round, ``<arm>/s<seed>/r<round>``: the step-matched comparison reads them.
- ``runs.jsonl``: one line per run: its arm, seed, run id, official scores, the tested split's name, size and
  digest, checkpoint 0's dev success, and the figures each round returned (without the paths and ids that
  name files of the machine it ran on).

``read_results`` gives back the runs as ``write_report`` takes them, so every table, test, Holm adjustment and
power figure of a report can be recomputed from the committed files alone. ``merge_results`` joins the runs of an
ablation played in parts (seeds on different machines or days) into one, refusing parts that did not test the
same split with the same checkpoint 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from coevolve.errors import DataError

OUTCOMES_FILE = "outcomes.csv"
ROUND_OUTCOMES_FILE = "round_outcomes.csv"
RUNS_FILE = "runs.jsonl"
CHECKPOINT0 = "checkpoint0"
# Round figures that name files, processes or registry entries of the machine that ran them: not results.
MACHINE_FIELDS = ("checkpoint", "checkpoint_digest", "flow_run_id", "mlflow_run_id", "model_version", "best_version")
# The run fields a report reads besides its rounds and per-task outcomes.
RUN_FIELDS = (
    "arm",
    "seed",
    "run_id",
    "official",
    "tested_split",
    "heldout_size",
    "heldout_digest",
    "baseline_dev_success",
)


def run_column(run: dict[str, Any]) -> str:
    return f"{run['arm']}/s{run['seed']}"


def _wide(columns: dict[str, dict[str, bool]]) -> pl.DataFrame:
    """task_id and one 0/1 column per entry, over the tasks every entry scored, in task id order."""
    tasks = sorted(set.intersection(*(set(v) for v in columns.values()))) if columns else []
    data: dict[str, list[Any]] = {"task_id": tasks}
    data |= {name: [int(bool(v[t])) for t in tasks] for name, v in columns.items()}
    return pl.DataFrame(data, schema={"task_id": pl.String, **dict.fromkeys(columns, pl.Int8)})


def write_results(results: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Write the three files into ``folder``; the per-round file only where the runs carry per-round outcomes."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    tested = {run_column(r): r["heldout_outcomes"] for r in results if r.get("heldout_outcomes")}
    if tested:
        baseline = next(r["baseline_outcomes"] for r in results if r.get("heldout_outcomes"))
        _wide({CHECKPOINT0: baseline, **tested}).write_csv(folder / OUTCOMES_FILE)
        written.append(folder / OUTCOMES_FILE)
    per_round = {
        f"{run_column(r)}/r{round_}": outcomes
        for r in results
        for round_, outcomes in sorted((r.get("round_heldout_outcomes") or {}).items())
        if outcomes  # a round the schedule did not score on the held-out split
    }
    if per_round:
        baseline = next(r["baseline_round_outcomes"] for r in results if r.get("round_heldout_outcomes"))
        _wide({CHECKPOINT0: baseline, **per_round}).write_csv(folder / ROUND_OUTCOMES_FILE)
        written.append(folder / ROUND_OUTCOMES_FILE)
    with (folder / RUNS_FILE).open("w") as out:
        for r in results:
            line = {key: r.get(key) for key in RUN_FIELDS}
            line["rounds"] = [{k: v for k, v in s.items() if k not in MACHINE_FIELDS} for s in r["rounds"]]
            out.write(json.dumps(line, sort_keys=True) + "\n")
    written.append(folder / RUNS_FILE)
    return written


def _columns(path: Path) -> dict[str, dict[str, bool]]:
    """Column name -> task id -> outcome, from one of the wide files; a file that is not one is a DataError."""
    try:
        frame = pl.read_csv(path, schema_overrides={"task_id": pl.String})
        if frame.columns[:2] != ["task_id", CHECKPOINT0]:
            raise ValueError("its first columns are not task_id and checkpoint0")
        outcomes = frame.drop("task_id")
        if any(outcomes.select(~pl.all().is_in([0, 1]).fill_null(False).all()).row(0)):
            raise ValueError("a cell is neither 0 nor 1")
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise DataError(
            f"{path} is not an outcomes file as `coevolve ablation` writes it ({exc}); run the `coevolve ablation` "
            "command that wrote it again, which writes its report and these files anew from the state folder."
        ) from None
    tasks = frame["task_id"].to_list()
    return {name: dict(zip(tasks, map(bool, outcomes[name].to_list()), strict=True)) for name in outcomes.columns}


def read_results(folder: Path) -> list[dict[str, Any]]:
    """The runs as ``write_report`` takes them, from the files ``write_results`` wrote into ``folder``."""
    runs_file = folder / RUNS_FILE
    if not runs_file.is_file():
        raise DataError(
            f"No {RUNS_FILE} in {folder}: give the folder an ablation's report was written to "
            "(state_dir/reports/<name>), or a copy of its files."
        )
    try:
        runs = [json.loads(line) for line in runs_file.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise DataError(f"{runs_file} line {exc.lineno} is not JSON: {exc.msg}.") from exc
    tested = _columns(folder / OUTCOMES_FILE) if (folder / OUTCOMES_FILE).is_file() else {}
    per_round = _columns(folder / ROUND_OUTCOMES_FILE) if (folder / ROUND_OUTCOMES_FILE).is_file() else {}
    for run in runs:
        column = run_column(run)
        if column in tested:
            run["heldout_outcomes"], run["baseline_outcomes"] = tested[column], tested[CHECKPOINT0]
        prefix = f"{column}/r"
        rounds = {int(name[len(prefix) :]): v for name, v in per_round.items() if name.startswith(prefix)}
        if rounds:
            run["round_heldout_outcomes"], run["baseline_round_outcomes"] = rounds, per_round[CHECKPOINT0]
    return runs


# What every part of one ablation shares: the split its tests use and checkpoint 0's outcomes on it.
_SHARED_FIELDS = ("tested_split", "heldout_size", "heldout_digest")
_SHARED_OUTCOMES = ("baseline_outcomes", "baseline_round_outcomes")


def merge_results(parts: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One ablation's runs from the runs of its parts (folder name -> runs), in the parts' order.

    A DataError names the two folders when a run (arm, seed) is in both, or when they did not test the same split
    or checkpoint 0 (then they are parts of different ablations and their arms cannot be compared paired).
    """
    runs = [(folder, run) for folder, part in parts.items() for run in part]
    first_folder, reference = runs[0] if runs else ("", {})
    seen: dict[str, str] = {}
    merged: list[dict[str, Any]] = []
    for folder, run in runs:
        column = run_column(run)
        if column in seen:
            raise DataError(
                f"Run {column} is in both {seen[column]} and {folder}; give each run's folder once "
                "(a part's runs must be seeds or arms the other parts did not play)."
            )
        seen[column] = folder
        differs = [f for f in (*_SHARED_FIELDS, *_SHARED_OUTCOMES) if run.get(f) != reference.get(f)]
        if differs:
            raise DataError(
                f"{folder} and {first_folder} are parts of different ablations: their {', '.join(differs)} "
                "differ. Parts join into one report only when they ran the same command with other seeds."
            )
        merged.append(run)
    return merged
