"""flows/evolve.py: the evolution `coevolve evolve` runs prints where it starts and the per-round table.

The table of rounds that run: tests/flows/test_evolve_console.py and tests/flows/test_rounds_target.py.
"""

from coevolve.console import shown
from flows.evolve import coevolve_evolve


def test_a_target_already_reached_is_one_line_naming_the_run_and_the_state_folder(
    prefect_api, tiny_config, tmp_path, capsys
):
    config = tiny_config(tmp_path / "state")
    assert coevolve_evolve(rounds=0, config=config.model_dump(mode="json"), print_table=True) == []
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"run {config.run_id!r}: no round is finished (target: 0 rounds), nothing to run; "
        f"state in {shown(config.state_dir)}"
    ]


def test_a_deployment_run_prints_nothing(prefect_api, tiny_config, tmp_path, capsys):
    config = tiny_config(tmp_path / "state")
    assert coevolve_evolve(rounds=0, config=config.model_dump(mode="json")) == []
    assert capsys.readouterr().out == ""
