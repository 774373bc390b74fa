"""The ablation's report as a Prefect task: the runs' tested outcomes from the warehouse, report.md, MLflow.

The report itself (its tables, figures and statistics) is tasks/ablation/report.py's ``write_report``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from coevolve.config import PipelineConfig
from storage.pool import pool_digest
from storage.tracking import Tracker
from tasks.ablation.report import FINAL_SPLIT, write_report
from tasks.common import open_warehouse
from tasks.splits import HELDOUT_ROUND, HELDOUT_SPLIT


def metric_name(name: str) -> str:
    """A metric name MLflow accepts: an arm's ``+`` (``full+learnability``) spelled ``_``."""
    return name.replace("+", "_")


def _tested_outcomes(wh: Any, run: dict[str, Any]) -> dict[str, Any]:
    """A run with the per-task outcomes its tests use.

    The final held-out split's outcomes when the ablation scored it, else the held-out split's; and the
    per-round held-out split's after each round and for checkpoint 0.
    """
    prepared = wh.stage_output(run["run_id"], 0, "prepare") or {}
    tested = {
        "baseline_dev_success": prepared.get("baseline_dev_success"),
        # The per-round held-out split's outcomes after each round: the step-matched comparison reads them.
        "round_heldout_outcomes": {
            s["round"]: wh.evaluation_outcomes(run["run_id"], s["round"], HELDOUT_SPLIT) for s in run["rounds"]
        },
        "baseline_round_outcomes": wh.evaluation_outcomes(run["run_id"], HELDOUT_ROUND, HELDOUT_SPLIT),
    }
    if run.get("final_heldout_outcomes"):
        tested |= {
            "heldout_outcomes": run["final_heldout_outcomes"],
            "baseline_outcomes": run["final_baseline_outcomes"],
            "heldout_size": run["final_heldout_size"],
            "heldout_digest": run["final_heldout_digest"],
            "tested_split": FINAL_SPLIT,
        }
    else:
        # Checkpoint 0's held-out rows: the prepare stage stores them under HELDOUT_ROUND.
        tasks = wh.pool(run["run_id"], HELDOUT_ROUND)
        tested |= {
            "heldout_outcomes": wh.evaluation_outcomes(run["run_id"], run["rounds"][-1]["round"], HELDOUT_SPLIT),
            "baseline_outcomes": wh.evaluation_outcomes(run["run_id"], HELDOUT_ROUND, HELDOUT_SPLIT),
            "heldout_size": len(tasks),
            "heldout_digest": pool_digest(tasks) if tasks else None,
            "tested_split": HELDOUT_SPLIT,
        }
    return {**run, **tested}


@task(name="report", cache_policy=NO_CACHE)
def report_task(config: PipelineConfig, name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the ablation report under the state folder and log it to MLflow as one run."""
    with open_warehouse(config) as wh:
        results = [_tested_outcomes(wh, run) for run in results]
    out = write_report(results, config.state_dir / "reports" / name, f"Ablation `{name}`")
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    metrics = {}
    for arm, row in out["arms"].items():
        if not math.isnan(row["heldout"][0]):
            metrics[metric_name(f"heldout.{arm}.mean")] = row["heldout"][0]
            metrics[metric_name(f"heldout.{arm}.sd")] = row["heldout"][1]
    families = (
        (out["tests"], "full_vs_{}"),
        (out["ckpt0_tests"], "{}_vs_ckpt0"),
        (out["curriculum_arm_tests"], "full+learnability_vs_{}"),
        (out["curriculum_tests"], "{0}+learnability_vs_{0}"),
        (out["new_task_tests"], "random_vs_{}"),
        ({k.replace(" vs ", "_vs_"): t for k, t in out["step_matched_tests"].items()}, "step_matched.{}"),
    )
    for family, label in families:
        for name_, t in family.items():
            for key in ("p", "p_holm"):
                if not math.isnan(t[key]):
                    metrics[metric_name(f"{key}.{label.format(name_)}")] = t[key]
    for comparison, effect in out["detectable_effect"].items():
        if not math.isnan(effect):
            metrics[f"detectable_effect.{comparison}"] = effect
    params = {
        "runs": len(results),
        "heldout_split.size": out["heldout_split"]["size"],
        "heldout_split.digest": out["heldout_split"]["digest"],
    }
    run_id = tracker.log_evaluation(f"{name}-report", metrics, params, {"coevolve.kind": "ablation"})
    for path in [Path(out["report"]), *map(Path, out["figures"])]:
        tracker.attach_artifact(run_id, path, "report")
    get_run_logger().info("ablation report at %s", out["report"])
    return {**out, "mlflow_run_id": run_id}
