"""The ablation flow end to end on a tiny config: every (arm, seed) is its own run, and a report comes out."""

import dataclasses
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from mlflow.tracking import MlflowClient
from prefect.task_runners import ProcessPoolTaskRunner

from agent.checkpoints import checkpoint_digest
from coevolve.errors import PipelineError
from coevolve.stages import PrepareInput
from flows.ablation import (
    ARMS,
    EXECUTOR_ATTRIBUTE,
    MESSAGE_QUEUE_ATTRIBUTE,
    arm_config,
    coevolve_ablation,
    official_scores,
    stop_seed_processes,
)
from flows.ablation_round0 import copy_round0, round0_key
from storage.pool import pool_digest
from storage.tracking import Tracker
from storage.warehouse import Warehouse
from tasks.ablation.report import FINAL_SPLIT, read_per_run_table
from tasks.prepare import prepare_stage
from tasks.splits import FINAL_HELDOUT_ROUND, build_final_heldout
from tests.conftest import live_server_processes
from tests.crash_at import CRASH_EXIT
from tests.flows.conftest import REPO, cli_env, kill_group, run_on_terminal, screen_lines, write_config_file

pytestmark = pytest.mark.slow

# After Ctrl-C: seconds the command may take to end (its seeds' processes get SIGTERM, then 2 s before SIGKILL),
# and seconds after its end within which nothing it started may be left.
STOPPED_WITHIN_S = 60.0
GONE_WITHIN_S = 5.0


def test_arms_share_checkpoint_zero_but_not_their_runs(tiny_config, tmp_path):
    base = tiny_config(tmp_path)
    static, full = arm_config(base, "static", 2, "abl"), arm_config(base, "full", 2, "abl")
    assert static.run_id == "abl-static-s2" and full.run_id == "abl-full-s2"
    assert static.start_seed == full.start_seed == base.start_seed
    assert static.synthesis.mode == "off" and full.synthesis.mode == "signal"
    assert arm_config(base, "no-rare", 1, "abl").signals.enabled == ["forgetting", "boundary"]
    assert set(ARMS) >= {"static", "random", "full", "no-forgetting", "no-boundary", "no-rare"}


@pytest.fixture(scope="module")
def ablation_run(prefect_api, tiny_config, tmp_path_factory):
    # Two workers: the seeds' chains run at the same time, each in its own process.
    config = tiny_config(
        tmp_path_factory.mktemp("ablation"), rollout={"dev_eval_tasks": 2, "final_heldout_tasks": 6}, ablation_workers=2
    )
    out = coevolve_ablation(
        arms=["static", "random"],
        seeds=[1, 2],
        rounds=1,
        official_limit=2,
        name="t",
        config=config.model_dump(mode="json"),
    )
    return config, out


def test_an_ablation_runs_every_arm_and_seed_and_writes_a_report(ablation_run):
    config, out = ablation_run
    assert set(out["arms"]) == {"static", "random"}
    assert out["tests"] == {}  # no "full" arm to compare against
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        runs = wh.sql("SELECT DISTINCT run_id FROM rounds ORDER BY run_id")["run_id"].to_list()
        static_pool = wh.sql("SELECT count(*) AS n FROM pool_membership WHERE run_id = 't-static-s1' AND round = 1")[
            "n"
        ][0]
        seed_pool = wh.sql("SELECT count(*) AS n FROM pool_membership WHERE run_id = 't-static-s1' AND round = 0")["n"][
            0
        ]
    assert runs == ["t-random-s1", "t-random-s2", "t-static-s1", "t-static-s2"]
    assert static_pool == seed_pool
    assert "| static |" in Path(out["report"]).read_text()


def test_each_runs_registry_aliases_point_at_its_own_versions(ablation_run):
    config, _ = ablation_run
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    for run_id in ("t-static-s1", "t-static-s2", "t-random-s1", "t-random-s2"):
        name = config.with_overrides({"run_id": run_id}).registered_model_name
        for alias in ("current", "best"):
            version = client.get_model_version_by_alias(name, alias)
            assert version.tags["coevolve.run_id"] == run_id


def test_the_report_shows_the_mechanism_per_arm_and_round_and_each_arm_against_checkpoint_0(ablation_run):
    _, out = ablation_run
    text = Path(out["report"]).read_text()
    assert "### Family 2: each arm against checkpoint 0 (2 comparisons, Holm)" in text
    assert set(out["ckpt0_tests"]) == {"static", "random"}
    assert all(
        t["seeds"] == 2 and t["tasks"] == 6 and "p_holm" in t for t in out["ckpt0_tests"].values()
    )  # two seeds x the final split
    assert "| static | 0 |" in text and "| random | 0 |" in text
    assert {Path(f).name for f in out["figures"]} >= {"mechanism.png", "acceptance_by_kind.png"}
    rows = out["mechanism"]["static"]
    assert 0.0 <= rows[0]["informative"] <= 1.0 and 0.0 <= rows[0]["coverage"] <= 1.0 and 0.0 <= rows[0]["dev"] <= 1.0
    assert rows[0]["accepted"] == {
        "forgetting": 0,
        "boundary": 0,
        "rare": 0,
        "random": 0,
    }  # the static arm synthesizes nothing


def test_the_final_held_out_split_is_frozen_at_round_0_and_checkpoint_0_is_scored_on_it_once(ablation_run):
    config, out = ablation_run
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rows = wh.sql(
            "SELECT run_id, round, count(*) AS n FROM evaluations WHERE split = 'final-heldout' "
            "GROUP BY ALL ORDER BY ALL"
        ).rows()
        stored = wh.pool("t-static-s1", FINAL_HELDOUT_ROUND)
        prepared = wh.stage_output("t-random-s2", 0, "prepare")
    expected = build_final_heldout(
        config.with_overrides({"run_id": "t-static-s1", "pool": {"seed": config.start_seed}})
    )
    assert [t.task_id for t in stored] == [t.task_id for t in expected] and len(stored) == 6
    assert prepared["final_heldout_digest"] == pool_digest(stored) == out["heldout_split"]["digest"]
    # Checkpoint 0 once for the whole ablation, every run's final checkpoint once.
    assert rows == [
        ("t-checkpoint-0", -1, 6),
        *((run_id, 0, 6) for run_id in ("t-random-s1", "t-random-s2", "t-static-s1", "t-static-s2")),
    ]
    text = Path(out["report"]).read_text()
    assert (
        f"final held-out split: 6 tasks, pool digest `{pool_digest(stored)}`" in text
        and "detects with 80% power" in text
    )


def test_checkpoint_0_is_scored_by_the_first_run_and_its_rows_copied_by_the_others(ablation_run):
    config, _ = ablation_run
    runs = ("t-static-s1", "t-random-s1", "t-static-s2", "t-random-s2")
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        scored_by = [wh.stage_output(run_id, 0, "prepare")["checkpoint0_scored_by"] for run_id in runs]
        rows = [sorted(wh.evaluation_rows(run_id, -1, split)) for run_id in runs for split in ("heldout", "dev")]
    assert scored_by == ["t-static-s1"] * 4
    assert rows[0::2] == [rows[0]] * 4 and rows[1::2] == [rows[1]] * 4 and len(rows[0]) == 4 and len(rows[1]) == 2


def test_dev_tasks_are_scored_for_checkpoint_0_and_every_round(ablation_run):
    config, _ = ablation_run
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        dev = wh.sql(
            "SELECT round, count(*) AS n FROM evaluations WHERE run_id = 't-random-s1' AND split = 'dev' "
            "GROUP BY round ORDER BY round"
        )
        prepared = wh.stage_output("t-random-s1", 0, "prepare")
        summary = wh.rounds("t-random-s1")[0]
    assert dev.rows() == [(-1, 2), (0, 2)]
    assert 0.0 <= prepared["baseline_dev_success"] <= 1.0 and 0.0 <= summary.dev_success <= 1.0


def test_each_round_logs_its_mechanism_and_the_report_its_checkpoint_0_tests_to_mlflow(ablation_run):
    config, out = ablation_run
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(config.tracking.experiment)
    (round_run,) = client.search_runs([experiment.experiment_id], "tags.`coevolve.run_name` = 't-random-s1-round-000'")
    assert {
        "mechanism.informative_groups",
        "mechanism.heldout_coverage",
        "mechanism.episodes_played",
        "mechanism.optimizer_steps",
        "accepted.random",
        "accepted.boundary",
        "dev_success",
    } <= set(round_run.data.metrics)
    report = client.get_run(out["mlflow_run_id"])
    assert report.data.params["heldout_split.size"] == "6" and len(report.data.params["heldout_split.digest"]) == 64
    artifacts = {a.path for a in client.list_artifacts(out["mlflow_run_id"], "report")}
    assert {"report/mechanism.png", "report/acceptance_by_kind.png", "report/curriculum.png"} <= artifacts


def test_accepted_candidates_by_kind_add_up_to_the_accepted_count(ablation_run):
    config, _ = ablation_run
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        summaries = [s for run_id in ("t-random-s1", "t-random-s2") for s in wh.rounds(run_id)]
    assert all(
        sum(s.accepted_by_kind.values()) == s.accepted and set(s.accepted_by_kind) <= {"random"} for s in summaries
    )


def test_a_finished_runs_official_scores_are_read_back_and_not_played_again(ablation_run):
    """What a resumed ablation asks of each finished run: its final checkpoint's official scores, read from the rows
    the first attempt stored, with no new MLflow evaluation run."""
    config, _ = ablation_run
    run = config.with_overrides({"run_id": "t-random-s2"})
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        (last,) = wh.rounds("t-random-s2")
        stored = wh.evaluation_outcomes("t-random-s2", last.round, "multi_turn_base")
    client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(config.tracking.experiment).experiment_id
    logged = len(client.search_runs([experiment]))
    assert official_scores(run, last.checkpoint, 2) == {"multi_turn_base": sum(stored.values()) / 2}
    assert len(stored) == 2 and len(client.search_runs([experiment])) == logged


def test_later_arms_of_a_seed_copy_round_0s_rollout_update_and_evaluation_from_the_first(ablation_run):

    config, _ = ablation_run
    for first, later in (("t-static-s1", "t-random-s1"), ("t-static-s2", "t-random-s2")):
        with Warehouse(config.warehouse_path, read_only=True) as wh:
            # What an analyst's query sees: every round-0 stage record, and the run it was copied from.
            query = (
                "SELECT run_id, stage, output->>'copied_from' AS copied_from FROM stage_runs "
                "WHERE round = 0 AND run_id = '{}'"
            )
            copied = dict(wh.sql(query.format(later)).select("stage", "copied_from").rows())
            own = wh.sql(query.format(first))["copied_from"].to_list()
            episodes = [wh.trajectories(run_id, 0) for run_id in (first, later)]
            scores = [sorted((t, s, r, i.removeprefix(run_id)) for t, s, r, i in wh.evaluation_rows(run_id, 0, split))
                      for split in ("heldout", "dev") for run_id in (first, later)]  # fmt: skip
            versions = [wh.stage_output(run_id, 0, "version") for run_id in (first, later)]
            prepared = [wh.stage_output(run_id, 0, "prepare") for run_id in (first, later)]
        # Mining, synthesis and validation read the settings the arms change, so the later arm runs them itself.
        assert copied == {"prepare": None, "rollout": first, "mine": None, "synthesize": None, "validate": None,
                          "update": first, "evaluate": first, "version": None} and own == [None] * 8  # fmt: skip
        assert [dataclasses.replace(t, run_id=later) for t in episodes[0]] == episodes[1] and len(episodes[1]) == 8
        assert scores[0] == scores[1] and scores[2] == scores[3] and len(scores[1]) == 4 and len(scores[3]) == 2
        assert prepared[0]["pool_digest"] == prepared[1]["pool_digest"]
        assert versions[1]["checkpoint"] != versions[0]["checkpoint"]  # the later run's own copy of checkpoint 1
        assert (
            versions[0]["checkpoint_digest"]
            == versions[1]["checkpoint_digest"]
            == checkpoint_digest(versions[1]["checkpoint"])
        )
        assert versions[0]["heldout_success"] == versions[1]["heldout_success"]


def test_a_copied_round_0_carries_the_task_statistics_its_rollout_drew_from(ablation_run):
    config, _ = ablation_run
    query = "SELECT * EXCLUDE (run_id) FROM task_difficulty WHERE run_id = '{}' AND round = 0 ORDER BY task_id"
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        first, later = (wh.sql(query.format(run_id)).rows() for run_id in ("t-static-s1", "t-random-s1"))
        pool = wh.pool("t-random-s1", 0)
    assert later == first and len(later) == len(pool)


def test_a_copied_round_0_names_its_source_in_checkpoint_1s_lineage(ablation_run):
    config, _ = ablation_run
    tracker = Tracker(config.mlflow_tracking_uri, config.tracking.experiment, config.artifacts_dir)
    (copied,) = tracker.lineage(config.with_overrides({"run_id": "t-random-s1"}).registered_model_name, "1")
    (own,) = tracker.lineage(config.with_overrides({"run_id": "t-static-s1"}).registered_model_name, "1")
    assert copied["trajectories.copied_from"] == "t-static-s1" and copied["trajectories.run_id"] == "t-random-s1"
    assert own["trajectories.copied_from"] == ""


def test_a_round_0_copy_killed_midway_is_finished_by_the_next_attempt(ablation_run, tmp_path):
    """The copy dies (os._exit) just before the update stage's record; the next attempt finishes it, no row twice."""

    config, _ = ablation_run
    state = tmp_path / "state"
    shutil.copytree(config.state_dir, state, ignore=shutil.ignore_patterns("prefect", "*.lock"))
    base = config.with_overrides({"state_dir": str(state)})
    source = arm_config(base, "static", 1, "t")
    target = arm_config(base, "full", 1, "t", checkpoint0_scores_from="t-static-s1")
    prepare_stage(target, PrepareInput(round_=0))
    script = (
        "import sys; from tests.crash_at import arm; arm(sys.argv[1]); "
        "from coevolve.config import PipelineConfig as C; from flows.ablation_round0 import copy_round0; "
        "copy_round0(C.model_validate_json(sys.argv[2]), C.model_validate_json(sys.argv[3]))"
    )
    point = "before:stage_runs/run_id=t-full-s1/round=0/update.json"
    died = subprocess.run([sys.executable, "-c", script, point, source.model_dump_json(), target.model_dump_json()],
                          cwd=REPO, env=cli_env(state), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert died.returncode == CRASH_EXIT, died.stderr[-2000:]
    with Warehouse(target.warehouse_path, read_only=True) as wh:
        assert wh.stage_output("t-full-s1", 0, "rollout")["copied_from"] == "t-static-s1"
        assert wh.stage_output("t-full-s1", 0, "update") is None

    assert copy_round0(source, target) == "t-static-s1"
    with Warehouse(target.warehouse_path, read_only=True) as wh:
        stages = [wh.stage_output("t-full-s1", 0, stage) for stage in ("rollout", "update", "evaluate")]
        stored = wh.sql("SELECT count(*) AS n FROM trajectories WHERE run_id = 't-full-s1' AND round = 0")["n"][0]
        expected = wh.stage_output("t-static-s1", 0, "version")["checkpoint_digest"]
    assert [s["copied_from"] for s in stages] == ["t-static-s1"] * 3 and stored == 8
    assert checkpoint_digest(stages[1]["checkpoint"]) == expected and not list(
        target.checkpoint_dir(1).parent.glob("*.partial")
    )


def test_round_0_is_shared_only_by_runs_whose_round_0_settings_and_inputs_match(ablation_run):
    config, _ = ablation_run
    static, random = arm_config(config, "static", 1, "t"), arm_config(config, "random", 1, "t")
    assert round0_key(static) == round0_key(random) is not None  # the arms differ in synthesis only
    assert round0_key(random.with_overrides({"rollout": {"temperature": 0.5}})) != round0_key(static)
    assert round0_key(random.with_overrides({"seed": 2})) != round0_key(static)
    assert round0_key(arm_config(config, "static", 9, "t")) is None  # no prepared round 0 to compare


def _ablation_args(config_file: Path) -> list[str]:
    """`coevolve ablation` as the sequential run's user types it."""
    args = ["--arms", "static,random", "--seeds", "1,2", "--official-limit", "2", "--name", "t"]
    return [sys.executable, "-m", "flows.cli", "ablation", "--config", str(config_file), *args]


def _ablation_command(config_file: Path, state_dir: Path, log: Path) -> subprocess.Popen:
    """`_ablation_args` in its own process group, its console in ``log``."""
    with log.open("a") as out:
        return subprocess.Popen(
            _ablation_args(config_file), cwd=REPO, env=cli_env(state_dir), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


@pytest.fixture(scope="module")
def interrupted_then_resumed(tiny_config, tmp_path_factory):
    """The ablation of `ablation_run` one seed at a time, through the command: Ctrl-C (SIGINT to the command's
    process group, as a terminal sends it) once the first run's round 0 is finished, then the same command again,
    on a terminal. The rounds come from the configuration this time (ablation_rounds), as the command without
    --rounds takes them."""
    folder = tmp_path_factory.mktemp("ablation-interrupted")
    config = tiny_config(
        folder / "state", rollout={"dev_eval_tasks": 2, "final_heldout_tasks": 6}, ablation_workers=1, ablation_rounds=1
    )
    config_file = write_config_file(config, folder / "config.yaml")
    first_log = folder / "first.log"
    first = _ablation_command(config_file, config.state_dir, first_log)
    try:
        deadline = time.monotonic() + 600
        while first.poll() is None and time.monotonic() < deadline:
            try:
                with Warehouse(config.warehouse_path, read_only=True) as wh:
                    if wh.round_status("t-static-s1", 0) == "finished":
                        break
            except PipelineError:
                pass  # the warehouse is not made yet
            time.sleep(0.2)
        assert first.poll() is None, first_log.read_text()[-3000:]
        os.killpg(first.pid, signal.SIGINT)
        signalled = time.monotonic()
        first_code = first.wait(timeout=120)
        seconds_to_stop = time.monotonic() - signalled
        time.sleep(GONE_WITHIN_S)
        left = live_server_processes([first.pid], str(folder))  # its group, and any vLLM server it started
    finally:
        kill_group(first)
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        queued_seed = wh.round_status("t-static-s2", 0)  # its chain was queued behind seed 1's when Ctrl-C came
    second_code, second_screen = run_on_terminal(_ablation_args(config_file), cli_env(config.state_dir))
    return SimpleNamespace(
        config=config, first_code=first_code, seconds_to_stop=seconds_to_stop, left=left, queued_seed=queued_seed,
        first_console=first_log.read_text(), second_code=second_code, second_screen=second_screen,
        second_console="\n".join(screen_lines(second_screen)).rstrip("\n"),
    )  # fmt: skip


def test_the_process_pool_still_holds_the_log_queue_an_interrupted_ablation_releases():
    """`stop_seed_processes` releases the queue Prefect's pool forwards its seeds' logs by, which Prefect keeps in a
    private attribute: a Prefect that renames it would bring the hang at exit back without any error."""
    with ProcessPoolTaskRunner(max_workers=1) as runner:
        queue = getattr(runner, MESSAGE_QUEUE_ATTRIBUTE)
        assert callable(queue.cancel_join_thread)


def process_ended(pid: int) -> bool:
    """Whether the process ``pid`` has ended (reaped, or a zombie waiting to be). Asked of the OS: the pool's own
    thread may reap a seed it sees die, and `Process.is_alive` of the seed then answers True until that thread has
    recorded the exit code."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stopping_the_seeds_ends_the_pools_processes_and_no_other_child():
    other = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    other.start()
    try:
        with ProcessPoolTaskRunner(max_workers=1) as runner:
            pool = getattr(runner, EXECUTOR_ATTRIBUTE)  # fails here if Prefect renames it
            pool.submit(time.sleep, 60)  # a seed's process, busy as a playing seed is
            seed = next(iter(pool._processes.values()))
            stop_seed_processes(runner)
            assert process_ended(seed.pid)
            assert other.is_alive()
    finally:
        other.kill()


def test_ctrl_c_stops_the_ablation_and_its_seeds_processes_in_one_line(interrupted_then_resumed):
    run = interrupted_then_resumed
    assert run.first_code == 128 + signal.SIGINT, run.first_console[-3000:]
    assert run.seconds_to_stop < STOPPED_WITHIN_S and run.left == []
    assert run.queued_seed != "finished"  # the seed the pool had queued was not played to its end first
    assert run.first_console.splitlines()[-1] == "interrupted in ablation 't'; run the same command to resume"
    assert len(run.first_console.splitlines()) == 2 and run.first_console.startswith("log: ")


def test_the_same_command_resumes_the_interrupted_ablation_and_prints_its_report(interrupted_then_resumed):
    run = interrupted_then_resumed
    assert run.second_code == 0, run.second_console[-3000:]
    lines = run.second_console.splitlines()
    assert lines[0].startswith("log: ") and lines[1] == "# Ablation `t`" and lines[-1].startswith("report: ")
    # The round finished before Ctrl-C is read back, not asked of a round flow again (its log would say so).
    second_log = sorted((run.config.state_dir / "logs").glob("ablation-*.log"))[-1]
    assert "round 0 of run 't-static-s1' was already finished" not in second_log.read_text()


def test_on_a_terminal_the_command_draws_a_bar_of_the_rounds_its_seeds_processes_finish(interrupted_then_resumed):
    """Two arms x two seeds x one round: four rounds, the first finished before Ctrl-C. The bar clears itself: the
    screen keeps the log line and the report only (the test above)."""
    screen = interrupted_then_resumed.second_screen
    assert re.search(r"ablation 't': +\d+%\|[^|]*\| [1-4]/4 \[", screen), screen[-3000:]
    assert "%|" not in interrupted_then_resumed.second_console


def test_the_reports_numbers_do_not_depend_on_how_many_seeds_run_at_once(ablation_run, interrupted_then_resumed):
    (config, parallel), sequential = ablation_run, interrupted_then_resumed
    reports = [Path(parallel["report"]), sequential.config.state_dir / "reports" / "t" / "report.md"]
    tables = [read_per_run_table(report.read_text()) for report in reports]
    outcomes = []
    for cfg in (config, sequential.config):
        with Warehouse(cfg.warehouse_path, read_only=True) as wh:
            rows = wh.sql(
                f"SELECT run_id, round, task_id, success FROM evaluations WHERE split = '{FINAL_SPLIT}' ORDER BY ALL"
            ).rows()
        outcomes.append(rows)
    assert tables[0] == tables[1] and len(tables[0]) == 4
    assert outcomes[0] == outcomes[1] and len(outcomes[0]) == 5 * 6  # checkpoint 0 and four final checkpoints
