"""What a stage costs: the figures a stage record keeps (tasks/stage_cost.py), `v_stage_cost` over them, and the
per-step metrics the version stage logs to MLflow (each optimizer step at its global step, each stage's cost)."""

from __future__ import annotations

import mmap
from types import SimpleNamespace

from coevolve.records import Step, Trajectory
from storage.warehouse import Warehouse
from tasks.stage_cost import measured
from tasks.training.step_metrics import OptimizerStepLog, informative_share
from tasks.version import optimizer_step_metrics, stage_cost_metrics

RUN = "r"


def _episode(sample: int, tokens: int) -> Trajectory:
    return Trajectory(
        run_id=RUN, round=0, task_id="t-1", sample=sample, steps=[Step(turn=0, index=0, model_text="done",
        completion_tokens=tokens)], prompt_ids=[1], completion_ids=[2], completion_mask=[1], logprobs=[-0.1],
        reward=float(sample % 2), success=bool(sample % 2), finish_reason="done",
    )  # fmt: skip


def test_every_stage_record_is_a_row_with_its_cost_tokens_episodes_and_optimizer_steps(tmp_path):
    with Warehouse(tmp_path / "warehouse") as wh:
        wh.ensure_run(RUN, {"rollout": {"group_size": 2}})
        # Training step 0 played samples 0-1 (10 + 20 tokens), step 1 samples 2-3 (30 + 40 tokens).
        wh.write_trajectories([_episode(s, 10 * (s + 1)) for s in range(4)])
        cost = {"seconds": 2.0, "peak_rss_mib": 512.0}
        wh.mark_stage(RUN, 0, "prepare", {"checkpoint": "c0"})  # as an older version recorded it: no cost
        wh.mark_stage(RUN, 0, "rollout", {"trajectories": 2}, cost=cost)
        wh.mark_stage(RUN, 0, "update", {"stats": {"steps": 0, "skipped": True, "groups": 0, "groups_flat": 1,
                                                   "trajectories": 2}}, cost=cost)  # fmt: skip
        wh.mark_stage(RUN, 0, "rollout@1", {"trajectories": 2}, cost={**cost, "seconds": 4.0})
        wh.mark_stage(RUN, 0, "update@1", {"stats": {"steps": 3, "groups": 1, "groups_flat": 0}}, cost=cost)
        wh.mark_stage(RUN, 0, "evaluate", {"heldout_tasks": 5, "dev_tasks": 2}, cost=cost)
        rows = {r["stage"]: r for r in wh.sql("SELECT * FROM v_stage_cost").to_dicts()}
        logged = wh.stage_costs(RUN, 0)  # what the version stage logs to MLflow: the rows with a cost
    assert set(logged) == {"rollout", "update", "rollout@1", "update@1", "evaluate"}
    assert logged["rollout@1"] == {"seconds": 4.0, "tokens_generated": 70, "tokens_per_s": 17.5, "episodes": 2,
                                   "peak_rss_mib": 512.0}  # fmt: skip
    assert set(rows) == {"prepare", "rollout", "update", "rollout@1", "update@1", "evaluate"}
    assert rows["prepare"]["seconds"] is None and rows["prepare"]["peak_rss_mib"] is None
    assert (rows["rollout"]["tokens_generated"], rows["rollout"]["tokens_per_s"]) == (30, 15.0)
    assert (rows["rollout@1"]["step"], rows["rollout@1"]["tokens_generated"], rows["rollout@1"]["tokens_per_s"]) == (
        1, 70, 17.5,
    )  # fmt: skip
    assert [rows[s]["episodes"] for s in ("rollout", "update", "evaluate")] == [2, 2, 7]
    assert (rows["update"]["optimizer_steps"], rows["update"]["skipped"], rows["update"]["groups_flat"]) == (0, True, 1)
    assert (rows["update@1"]["optimizer_steps"], rows["update@1"]["skipped"]) == (3, False)
    assert rows["rollout"]["optimizer_steps"] is None and rows["evaluate"]["peak_rss_mib"] == 512.0


def test_a_stage_measures_its_own_peak_memory_not_the_processes():
    with measured() as big:
        # Fresh pages from the kernel: a long-lived process's allocator may hand out memory that is already resident.
        block = mmap.mmap(-1, 200 * 2**20)
        for page in range(0, len(block), mmap.PAGESIZE):
            block[page] = 1  # touch every page: resident, not just reserved
        block.close()
    with measured() as small:
        pass
    assert big["seconds"] >= 0 and small["seconds"] >= 0
    assert big["peak_rss_mib"] - small["peak_rss_mib"] > 150
    assert small["peak_rss_of"] == "stage"


def test_each_optimizer_step_is_charted_at_its_global_step_and_each_stage_cost_at_its_training_step():
    log = OptimizerStepLog(informative_share(3, 1))
    state = SimpleNamespace(global_step=7)
    log.on_log(None, state, None, logs={"loss": 0.5, "kl": 0.01, "reward": 0.25, "clip_ratio/region_mean": 0.0})
    log.on_log(None, state, None, logs={"train_runtime": 3.0, "train_loss": 0.5})  # the end-of-training summary
    assert log.rows == [
        {"global_step": 7, "loss": 0.5, "kl": 0.01, "clip_ratio/region_mean": 0.0, "reward": 0.25,
         "informative_share": 0.75}
    ]  # fmt: skip
    round_stats = {"per_step": [{"optimizer_steps_log": log.rows}, {"skipped": True}]}
    assert ("train/loss", 0.5, 7) in optimizer_step_metrics(round_stats)
    assert ("train/informative_share", 0.75, 7) in optimizer_step_metrics(round_stats)
    assert stage_cost_metrics({"rollout@2": {"seconds": 1.5, "peak_rss_mib": 9.0}, "mine": {"seconds": 0.1}}) == [
        ("cost.mine.seconds", 0.1, 0), ("cost.rollout.seconds", 1.5, 2), ("cost.rollout.peak_rss_mib", 9.0, 2),
    ]  # fmt: skip
