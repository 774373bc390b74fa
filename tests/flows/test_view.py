"""`coevolve view` as a person uses it: the real command on a finished round's warehouse, its pages in a real
headless Chromium (the system's, through its own chromedriver: `make browser`), what the pages show, and that
the view writes nothing and stops on Ctrl-C. Untrusted text (model output, task text) holding ``<script>`` renders
as text and never runs.

The round is the session's (`crash_round` in tests/flows/conftest.py, which other modules compare with too), so
this module adds no round of its own.
"""

from __future__ import annotations

import dataclasses
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from coevolve.records import Candidate, Provenance, Signal, Step, Task, ToolCall, Trajectory, Verdict
from flows.cli import main
from flows.view.charts import line_chart
from storage.warehouse import Warehouse
from tests.flows.conftest import REPO, cli_env

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# What keeps a headless Chromium off the network and out of the user's profile.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,1600",
)  # fmt: skip
URL = re.compile(r"at (?P<url>http://127\.0\.0\.1:\d+/) ")
INJECTED = "<script>window.injected = 1</script>"


def start_view(args: list[str], home: Path, timeout_s: float = 60) -> tuple[subprocess.Popen, str]:
    """``coevolve view --port 0 ARGS`` in its own process; returns it and the URL its first line names."""
    env = cli_env(home, home / "prefect", migrated=False)  # the view starts no Prefect: nothing is made there
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "view", "--port", "0", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 1.0)[0]:
            line = process.stdout.readline()
            match = URL.search(line)
            assert match, f"unexpected first line {line!r}; stderr: {process.stderr.read() if process.poll() else ''}"
            return process, match["url"]
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
    process.kill()
    raise AssertionError(f"coevolve view printed no URL within {timeout_s:.0f} s")


def stop(process: subprocess.Popen) -> int:
    """Ctrl-C, as a person stops it; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(
            f"{CHROMIUM} and {CHROMEDRIVER} are needed: `make browser` installs them (chromium, chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    # The system's driver, named: selenium never looks for or downloads one.
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def view(crash_round, tmp_path_factory):
    """The session's finished round served by `coevolve view`, with the state folder's files before it started."""
    config = crash_round.wait()
    before = files_of(config.state_dir)
    home = tmp_path_factory.mktemp("view-home")
    process, url = start_view(["--config", str(crash_round.folder / "config.yaml")], home)
    yield SimpleNamespace(config=config, url=url, process=process, before=before)
    stop(process)


def cells(row) -> list[str]:
    return [c.text for c in row.find_elements(By.CSS_SELECTOR, "td")]


def test_the_front_page_lists_the_round_with_its_optimizer_steps_and_draws_the_curves(view, browser):
    browser.get(view.url)
    assert browser.find_element(By.TAG_NAME, "h1").text == "Runs"
    rows = [cells(r) for r in browser.find_elements(By.CSS_SELECTOR, "table#rounds tr")[1:]]
    assert [r[:3] for r in rows] == [["e2e", "0", "finished"]]
    assert rows[0][6].isdigit()  # opt-steps
    curves = [f.text for f in browser.find_elements(By.TAG_NAME, "figcaption")]
    assert "held-out success by checkpoint" in curves and "pool size by round" in curves


def test_a_round_page_shows_every_stage_with_its_cost_and_its_groups(view, browser):
    browser.get(view.url)
    browser.find_element(By.LINK_TEXT, "0").click()
    assert browser.find_element(By.TAG_NAME, "h1").text == "Round 0 of run e2e"
    stages = {cells(r)[0]: cells(r) for r in browser.find_elements(By.CSS_SELECTOR, "table#stages tr")[1:]}
    expected = {"prepare", "rollout", "update", "rollout@1", "update@1", "mine", "synthesize", "validate", "evaluate"}
    assert expected <= set(stages), stages.keys()
    assert all(float(stages[s][1]) >= 0 for s in expected)  # seconds, measured
    assert int(stages["rollout"][2]) > 0 and int(stages["rollout"][4]) > 0  # tokens generated, episodes
    counts = browser.find_element(By.ID, "group-counts").text
    informative, flat = (int(n) for n in re.findall(r"(\d+) (?:informative|flat)", counts))
    assert informative + flat == len(browser.find_elements(By.CSS_SELECTOR, "table#groups tr")) - 1


def test_an_episode_shows_the_conversation_and_every_tool_call_with_its_result(view, browser):
    browser.get(f"{view.url}episodes?run=e2e&round=0")
    rows = browser.find_elements(By.CSS_SELECTOR, "table#episodes tr")[1:]
    with_calls = next(r for r in rows if cells(r)[-1])
    tools = cells(with_calls)[-1].split(", ")
    with_calls.find_element(By.TAG_NAME, "a").click()
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Episode e2e/r0/")
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".tool-name")] == tools
    assert len(browser.find_elements(By.CSS_SELECTOR, ".observation")) >= len(tools)
    assert browser.find_elements(By.CSS_SELECTOR, ".user")  # the task's user messages
    assert re.search(r"verdict (success|failure)", browser.find_element(By.ID, "outcome").text)


def test_a_synthesized_task_shows_the_signal_and_episode_it_came_from(view, browser):
    browser.get(f"{view.url}tasks?run=e2e&verdict=accepted")
    row = browser.find_elements(By.CSS_SELECTOR, "table#candidates tr")[1]
    kind = cells(row)[3]
    row.find_element(By.TAG_NAME, "a").click()
    assert browser.find_element(By.CSS_SELECTOR, ".signal-kind").text == kind
    assert browser.find_element(By.CSS_SELECTOR, ".verdict").text == "accepted"
    browser.find_element(By.PARTIAL_LINK_TEXT, "e2e/r0/").click()  # the episode it was mined from
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Episode e2e/r0/")


def test_every_stage_of_the_round_has_a_cost_row_and_mlflow_charts_the_optimizer_steps(view):
    with Warehouse.for_queries(view.config.warehouse_path) as wh:
        costs = wh.sql("SELECT * FROM v_stage_cost WHERE run_id = 'e2e'").to_dicts()
        steps = wh.sql("SELECT global_step, optimizer_steps FROM v_training_steps WHERE run_id = 'e2e'").to_dicts()
    stages = [c["stage"] for c in costs]
    assert len(set(stages)) == len(stages) == 10  # prepare, 2 x (rollout, update), mine, ..., version
    assert all(c["seconds"] > 0 and c["peak_rss_mib"] > 0 for c in costs)
    assert all(c["tokens_generated"] > 0 and c["tokens_per_s"] > 0 for c in costs if c["kind"] == "rollout")
    client = MlflowClient(view.config.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(view.config.tracking.experiment).experiment_id
    (run,) = client.search_runs([experiment], "tags.`coevolve.run_name` = 'e2e-round-000'")
    trained = sorted(s["global_step"] for s in steps if s["optimizer_steps"])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))[-len(trained) :] == trained
    for cost in ("cost.rollout.seconds", "cost.rollout.tokens_generated", "cost.update.optimizer_steps"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, cost)) == [0, 1], cost


def test_the_view_wrote_nothing_in_the_state_folder_and_ctrl_c_stops_it(view, browser):
    browser.get(view.url)  # after every page above
    assert stop(view.process) == 0
    assert files_of(view.config.state_dir) == view.before


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A warehouse whose episode, task and signal hold ``<script>`` tags, served by `coevolve view`."""
    folder = tmp_path_factory.mktemp("hostile")
    task = Task(
        environment="bfcl", initial_config={}, involved_classes=[], turns=[f"list files {INJECTED}"],
        reference=[[ToolCall("ls", {})]], provenance=Provenance(origin="boundary", round=0),
    )  # fmt: skip
    step = Step(
        turn=0, index=0, model_text=f"[ls(path='{INJECTED}')]", calls=[ToolCall("ls", {"path": INJECTED})],
        observations=[f"Error: no such file {INJECTED}"], error=INJECTED,
    )  # fmt: skip
    episode = Trajectory(
        run_id="x", round=0, task_id=task.task_id, sample=0, steps=[step], prompt_ids=[1], completion_ids=[2],
        completion_mask=[1], logprobs=[-0.1], reward=0.0, success=False, finish_reason="done",
    )  # fmt: skip
    signal_ = Signal("x", 0, "boundary", episode.trajectory_id, task.task_id, {"why": INJECTED})
    with Warehouse(folder / "warehouse") as wh:
        wh.ensure_run("x", {"rollout": {"group_size": 1}})
        wh.write_tasks([task])
        wh.write_trajectories([episode])
        wh.write_signals([signal_])
        wh.write_candidates("x", 0, [Candidate(task, signal_.signal_id, Verdict(False, f"refused {INJECTED}"))])
    process, url = start_view(["--database", str(folder / "warehouse")], folder)
    yield SimpleNamespace(url=url, episode=episode, task=task.task_id, warehouse=folder / "warehouse")
    stop(process)


def test_script_tags_in_model_output_and_task_text_render_as_text_and_never_run(hostile, browser):
    for page in (f"episodes/{hostile.episode.trajectory_id}", f"tasks/{hostile.task}"):
        browser.get(hostile.url + page)
        assert INJECTED in browser.find_element(By.TAG_NAME, "main").text
        assert browser.execute_script("return window.injected === undefined")
    assert browser.find_element(By.CSS_SELECTOR, ".reason").text == f"refused {INJECTED}"


def test_the_runs_of_an_ablation_arm_are_drawn_as_their_mean_within_a_band_over_seeds():
    chart = line_chart(
        "held-out", {"abl-full-s1": {0: 0.1, 1: 0.3}, "abl-full-s2": {0: 0.3, 1: 0.5}, "default": {0: 0.2}}, y_max=1.0
    )
    assert chart is not None
    full, default = chart.lines
    assert (full.label, default.label, default.band) == ("abl-full (2 seeds)", "default", None)
    means = [y for _, y in full.dots]
    band = [float(point.split(",")[1]) for point in full.band.split()]
    assert all(min(band) <= y <= max(band) for y in means) and len(band) == 4  # upper and lower edge, two rounds


def test_without_a_warehouse_the_view_says_how_to_make_one_and_creates_nothing(tmp_path, capsys):
    state = tmp_path / "state"
    assert main(["view", "--set", f"state_dir={state}"]) == 2
    assert "No warehouse at" in capsys.readouterr().err and not state.exists()


def test_a_round_written_while_the_view_runs_shows_on_the_next_page_load(hostile, browser):
    """The view holds nothing between requests: episodes a round writes beside it are on the next page it serves."""
    browser.get(f"{hostile.url}episodes?run=x")
    before = len(browser.find_elements(By.CSS_SELECTOR, "table#episodes tr")) - 1
    later = dataclasses.replace(hostile.episode, round=1, sample=5)
    with Warehouse(hostile.warehouse) as wh:  # a writer beside the view, as a running round is
        wh.write_trajectories([later])
    browser.get(f"{hostile.url}episodes?run=x")
    assert len(browser.find_elements(By.CSS_SELECTOR, "table#episodes tr")) - 1 == before + 1
    browser.find_element(By.LINK_TEXT, later.trajectory_id).click()
    assert browser.find_element(By.TAG_NAME, "h1").text == f"Episode {later.trajectory_id}"
