"""The command line: readable errors with exit code 2, never a traceback, for bad input."""

import yaml

from coevolve.cli import format_row, main, summary_row


def test_config_show_prints_the_effective_values(capsys):
    assert main(["config", "--show", "--set", "rollout.group_size=5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["group_size"] == 5


def test_a_malformed_config_file_exits_2_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    assert main(["config", "--show", "--config", str(bad)]) == 2
    assert "must hold a mapping" in capsys.readouterr().err


def test_an_invalid_override_exits_2_naming_the_field(capsys):
    assert main(["config", "--show", "--set", "training.beta=-1"]) == 2
    assert "training.beta" in capsys.readouterr().err


def test_sql_without_a_warehouse_says_how_to_make_one(tmp_path, capsys):
    assert main(["sql", "SELECT 1", "--set", f"state_dir={tmp_path}"]) == 2
    assert "run `coevolve evolve` first" in capsys.readouterr().err


def test_the_round_table_has_one_column_per_figure():
    row = summary_row(
        {"round": 1, "pool_size": 104, "rollouts": 72, "success_rate": 0.25, "signals": {"forgetting": 1, "boundary": 12, "rare": 3},
         "accepted": 4, "rejected": 9, "heldout_success": 0.125},
        61.2,
    )
    assert row.split() == ["1", "104", "72", "0.250", "1/12/3", "4", "9", "0.125", "61s"]
    assert len(format_row(("round",) + ("x",) * 8)) == len(row)


def test_evaluate_with_an_unknown_category_exits_2_naming_the_choices(tmp_path, capsys):
    code = main(["evaluate", "--checkpoint", str(tmp_path), "--categories", "base,simple", "--set", f"state_dir={tmp_path}"])
    assert code == 2 and "multi_turn_miss_func" in capsys.readouterr().err
