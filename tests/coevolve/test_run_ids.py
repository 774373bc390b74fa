"""Run ids name folders, Hive partitions and catalog records: one that would land elsewhere, or be hidden, is refused.

``_empty`` is the warehouse's placeholder partition (every view leaves it out, so such a run would be
invisible to `status` and `sql`), and ``.`` / ``..`` would put the run's files in other folders.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.config import PipelineConfig, load_config
from coevolve.errors import ConfigError
from storage.tables import PLACEHOLDER_RUN

REPO = Path(__file__).resolve().parents[2]
REFUSED = [PLACEHOLDER_RUN, ".", "..", "_nightly", ".hidden", "a/b", "a b", "run=1", "", "x" * 101]
ACCEPTED = ["default", "e2e", "run-a", "t-full-s1", "qwen3-4b", "exp.2", "A_b-3", "0", "2024", "x" * 100]


@pytest.mark.parametrize("run_id", REFUSED)
def test_a_run_id_that_would_be_hidden_or_land_elsewhere_is_refused_on_one_line_saying_the_rule(run_id):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=[f"run_id={run_id}"], environ={})
    message = str(caught.value)
    assert "\n" not in message and "run_id: Run ids are" in message and f"(got {run_id!r})" in message
    assert "starting with a letter or digit" in message and "'_empty'" in message


@pytest.mark.parametrize("run_id", ACCEPTED)
def test_run_ids_of_letters_digits_and_inner_dots_dashes_underscores_are_accepted(run_id, tmp_path):
    config = load_config(overrides=[f"run_id={run_id}", f"state_dir={tmp_path}"], environ={})
    assert config.run_dir() == tmp_path / "runs" / run_id


def test_a_derived_run_id_is_checked_too():
    # Ablation arms and `coevolve lineage` make run ids with with_overrides.
    with pytest.raises(ConfigError, match="starting with a letter or digit"):
        PipelineConfig().with_overrides({"run_id": ".."})


def test_the_rule_is_in_the_settings_description():
    description = PipelineConfig.model_fields["run_id"].description or ""
    assert "starting with a letter or digit" in description and "'_empty'" in description


def test_evolve_with_the_placeholder_run_id_exits_2_with_one_line_before_any_work(tmp_path):
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect")}
    command = ["evolve", "--set", f"run_id={PLACEHOLDER_RUN}", "--set", f"state_dir={state}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *command],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # a run that started: the refusal did not happen
        out, err = process.communicate()
    assert process.returncode == 2, err
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ") and "'_empty'" in err
    assert not state.exists() and not (tmp_path / "prefect").exists(), "nothing was started or written"
