"""flows/evolve.py: the evolution `coevolve evolve` runs prints where it starts and the per-round table."""

from coevolve.console import shown
from flows.evolve import coevolve_evolve
from flows.table import COLUMNS, format_row


def test_the_table_names_the_run_its_rounds_and_the_state_folder(prefect_api, tiny_config, tmp_path, capsys):
    config = tiny_config(tmp_path / "state")
    assert coevolve_evolve(rounds=0, config=config.model_dump(mode="json"), print_table=True) == []
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"run {config.run_id!r}: rounds 0..-1, state in {shown(config.state_dir)}"
    assert lines[1] == format_row(COLUMNS)
    assert lines[2].startswith("done in ") and lines[2].endswith(
        'query with: coevolve sql "SELECT * FROM v_success_by_round"'
    )
    assert len(lines) == 3


def test_a_deployment_run_prints_nothing(prefect_api, tiny_config, tmp_path, capsys):
    config = tiny_config(tmp_path / "state")
    assert coevolve_evolve(rounds=0, config=config.model_dump(mode="json")) == []
    assert capsys.readouterr().out == ""
