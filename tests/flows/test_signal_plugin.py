"""A signal kind is one module: declared by an installed package, it is mined, synthesized for, reported and ablated.

The test writes one module (a toy kind, ``failed``: every trajectory of the round that scored below a threshold)
and the metadata an installed package would carry (its entry point under ``coevolve.signals``) into a folder of
its own, puts that folder on the path of one ``coevolve ablation`` command (arms ``full`` and ``no-failed``, one
seed, one round, on the tiny configuration), and reads what came out. Nothing of the project is edited: the
kind's threshold, its leave-one-out arm, its letter in the report and its ``v_pool_growth`` column all follow
from the registry (coevolve/signals/registry.py).
"""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_interrupts import SERVER_APP, Command

from storage.warehouse import Warehouse
from tests.flows.conftest import REPO, cli_env, env_with_package, install_package

pytestmark = pytest.mark.slow

TOY_KIND = '''
"""failed: every trajectory of the round that scored below ``signals.failed_below``."""

from typing import Any

import polars as pl
from pydantic import Field

from coevolve.signals import KindSettings, SignalKind


class FailedSettings(KindSettings):
    failed_below: float = Field(0.5, gt=0, le=1, description="A trajectory scoring below this is marked.")


class Failed(SignalKind[FailedSettings]):
    name = "failed"
    letter = "x"
    guidance = "Practise the task's own tools on nearby states."
    meaning = "the agent failed this task in this round"
    settings_type = FailedSettings

    def fire(self, current, history, settings):
        return current.filter(pl.col("reward") < settings.failed_below).select("trajectory_id", "task_id", "reward")

    def evidence(self, fired) -> list[dict[str, Any]]:
        return [{"reward": r} for r in fired["reward"].to_list()]

    def context(self, signal, task, used, known_tools):
        return f"scored {signal.evidence['reward']}", task.tools
'''


def install_toy_kind(folder: Path) -> Path:
    """The toy's module and the metadata of a package declaring it, as an installed package leaves them."""
    return install_package(folder, "toy_failed", TOY_KIND, "coevolve.signals", "failed = toy_failed:Failed")


@pytest.fixture(scope="module")
def plugin_ablation(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    plugin = install_toy_kind(root / "site")
    state = root / "state"
    config = tiny_config(state, rollout={"dev_eval_tasks": 2, "final_heldout_tasks": 6}, ablation_workers=1)
    # The toy kind's threshold is set in the file as a built-in kind's is; only a process that has the kind
    # accepts it (the test below).
    data = config.model_dump(mode="json")
    data["signals"]["failed_below"] = 0.5
    del data["signals"]["enabled"]  # every kind the process has, the installed one included (the default)
    config_file = root / "config.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    env = env_with_package(state, plugin)
    args = ["ablation", "--config", str(config_file)]
    args += ["--arms", "full,no-failed", "--seeds", "1", "--rounds", "1", "--official-limit", "1", "--name", "plug"]
    ablation = Command(root, "ablation", args, env)  # `coevolve ablation`; every process it starts is noted
    assert ablation.finish(timeout_s=900) == 0, ablation.text()[-6000:]
    servers = {pid: line for pid, (_, line) in ablation.started.items() if SERVER_APP in line}
    return SimpleNamespace(config=config, report=state / "reports" / "plug" / "report.md", env=env, servers=servers)


def test_the_configuration_refuses_the_kinds_setting_where_the_kind_is_not_installed(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "config", "--set", "signals.failed_below=0.5", "--set",
         f"state_dir={tmp_path}"],
        cwd=REPO, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "failed_below" in done.stderr


def test_the_installed_kind_is_mined_in_the_full_arm_and_left_out_in_its_own_arm(plugin_ablation):
    config = plugin_ablation.config
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        configs = wh.sql("SELECT run_id, config FROM runs")
        enabled = {
            run: json.loads(text)["signals"]["enabled"]
            for run, text in zip(configs["run_id"].to_list(), configs["config"].to_list(), strict=True)
        }
        mined = wh.sql("SELECT run_id, kind, any_value(evidence) AS evidence FROM signals GROUP BY ALL")
    kinds = {(run, kind) for run, kind in zip(mined["run_id"].to_list(), mined["kind"].to_list(), strict=True)}
    assert enabled == {
        "plug-full-s1": ["forgetting", "boundary", "rare", "failed"],
        "plug-no-failed-s1": ["forgetting", "boundary", "rare"],
    }
    assert ("plug-full-s1", "failed") in kinds and ("plug-no-failed-s1", "failed") not in kinds
    evidence = mined.filter(mined["kind"] == "failed")["evidence"][0]
    assert json.loads(evidence)["reward"] < 0.5


def test_synthesis_follows_the_installed_kind_and_its_tasks_reach_the_pool(plugin_ablation):
    config, env = plugin_ablation.config, plugin_ablation.env
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        made = wh.sql(
            "SELECT count(*) AS made, count(*) FILTER (WHERE accepted) AS accepted FROM candidates "
            "WHERE run_id = 'plug-full-s1' AND origin = 'failed'"
        )
    # The views are made by the process that reads them: `coevolve sql` where the kind is installed has its column.
    query = "SELECT new_failed FROM v_pool_growth WHERE run_id = 'plug-full-s1' AND round = 1"
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "sql", query, "--set", f"state_dir={config.state_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    value = lines[[i for i, line in enumerate(lines) if set(line.strip()) == {"-"}][0] + 1]
    assert made["made"][0] > 0
    # The kind's column counts the tasks of its candidates that validation accepted into pool 1.
    assert int(value) == made["accepted"][0]


def test_the_report_counts_the_installed_kind_beside_the_built_in_ones(plugin_ablation):
    text = plugin_ablation.report.read_text()
    assert "signals f/b/r/x" in text and "accepted f/b/r/x/random" in text
    full_row = next(line for line in text.splitlines() if line.startswith("| full |"))
    assert any(cell.strip().count("/") == 3 for cell in full_row.split("|"))
    assert "| no-failed |" in text


def test_the_ablation_and_its_pool_process_report_to_the_commands_one_temporary_api(plugin_ablation):
    """`coevolve ablation` starts the temporary API every command starts (flows/local_api.py: it ends with the
    command, even one killed with -9) and names it to the process that runs its arms, which so starts none of
    its own."""
    (line,) = plugin_ablation.servers.values()
    assert "-m flows.local_api" in line
