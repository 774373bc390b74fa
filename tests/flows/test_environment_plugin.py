"""An environment is one module: declared by an installed package, a whole round plays in it.

The toy environment of tests/envs/test_environment_registry.py (named counters, the tools ``add`` and ``read``),
written as the one module of a package that declares it under ``coevolve.environments``, is picked by
``environment.name`` and runs a round through the real CLI: checkpoint 0 is fine-tuned on its demonstrations,
the seed pool and the splits are its tasks, the policy plays them, synthesis explores it and validation replays
its candidates, with nothing of the project edited.
"""

import subprocess
import sys

import pytest
import yaml

from storage.warehouse import Warehouse
from tests.envs.test_environment_registry import install_counter
from tests.flows.conftest import REPO, env_with_package

pytestmark = pytest.mark.slow


def test_an_installed_environment_plays_a_round_through_the_cli(tiny_config, tmp_path):
    plugin = install_counter(tmp_path / "site")
    # Checkpoint 0 fine-tuned long enough to call the toy's tools, so its rollouts give signals to synthesize from.
    config = tiny_config(tmp_path / "state", policy={"sft_steps": 300})
    data = config.model_dump(mode="json")
    data["environment"]["name"] = "counter"  # only a process with the package installed accepts it
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "evolve", "--config", str(config_file), "--rounds", "1"],
        cwd=REPO, env=env_with_package(config.state_dir, plugin), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with Warehouse(config.warehouse_path, read_only=True) as wh:
        environments = wh.sql("SELECT DISTINCT environment FROM tasks")["environment"].to_list()
        played = wh.sql("SELECT count(*) AS n FROM trajectories WHERE run_id = 'e2e'")["n"][0]
        made = wh.sql("SELECT count(*) AS n, count(*) FILTER (WHERE accepted) AS kept FROM candidates")
        grown = len(wh.pool("e2e", 1)) - len(wh.pool("e2e", 0))
        finished = wh.round_status("e2e", 0)
    assert finished == "finished"
    assert environments == ["counter"]
    # Synthesis explored the toy and validation replayed what it made; the accepted tasks joined pool 1.
    assert played > 0 and made["n"][0] > 0 and grown == made["kept"][0]
