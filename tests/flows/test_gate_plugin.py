"""A gate is one module: declared by an installed package and named in rollout.gates, it decides a real round's
training groups.

The toy gate admits the groups of tasks whose id ends in an even hex digit. Written as the one module of a
package that declares it under the entry-point group ``coevolve.gates``, it runs a round through the real CLI:
the step draws replacements for the groups it refuses while the episode budget lasts, and the update is handed
the admitted groups only. Nothing of the project is edited.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coevolve.config import load_config
from coevolve.config.rollout import BUILT_IN_GATES
from coevolve.errors import ConfigError
from storage.warehouse import Warehouse
from tasks.curriculum import BUILT_IN_GATES as GATE_CLASSES
from tests.flows.conftest import REPO, env_with_package, install_package

EVEN_GATE = '''
"""even: admits the groups of tasks whose id ends in an even hex digit."""

from tasks.curriculum import Gate


class EvenGate(Gate):
    name = "even"

    def admit(self, task, rewards):
        return int(task.task_id[-1], 16) % 2 == 0
'''

BATCH, GROUP, FACTOR = 4, 2, 2.0


def install_even_gate(folder: Path) -> Path:
    """The toy's module and the metadata of a package declaring it, as an installed package leaves them."""
    return install_package(folder, "even_gate", EVEN_GATE, "coevolve.gates", "even = even_gate:EvenGate")


def even(task_id: str) -> bool:
    return int(task_id[-1], 16) % 2 == 0


def test_the_configuration_and_the_curriculum_name_the_same_built_in_gates():
    assert list(GATE_CLASSES) == list(BUILT_IN_GATES)


def test_a_gate_nobody_declares_is_refused_with_the_names_that_exist(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[f"state_dir={tmp_path}", "rollout.gates=[even]"], environ={})
    assert "even" in str(refused.value) and "informative" in str(refused.value)


@pytest.mark.slow
def test_an_installed_gate_decides_the_groups_a_round_trains_on(tiny_config, tmp_path):
    plugin = install_even_gate(tmp_path / "site")
    config = tiny_config(
        tmp_path / "state", rollout={"tasks_per_batch": BATCH, "group_size": GROUP, "max_rollout_factor": FACTOR}
    )
    data = config.model_dump(mode="json")
    data["rollout"]["gates"] = ["even"]  # only a process with the package installed accepts it
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    env = env_with_package(config.state_dir, plugin)
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "evolve", "--config", str(config_file), "--rounds", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        rollout = wh.stage_output("e2e", 0, "rollout")
        update = wh.stage_output("e2e", 0, "update")
        played = wh.sql("SELECT task_id, min(sample) AS first FROM trajectories WHERE run_id = 'e2e' GROUP BY task_id")
    tasks = played["task_id"].to_list()
    assert rollout["groups_played"] == len(tasks) <= BATCH * FACTOR
    assert rollout["train_tasks"] == [t for t in rollout["train_tasks"] if even(t)]
    assert len(rollout["train_tasks"]) == min(BATCH, sum(even(t) for t in tasks))
    if sum(even(t) for t in tasks) < BATCH:  # too few admitted: the step spent its budget on replacements
        assert rollout["draws"] > 1 and len(tasks) == BATCH * FACTOR
    assert update["trained_on"]["count"] <= len(rollout["train_tasks"]) * GROUP
