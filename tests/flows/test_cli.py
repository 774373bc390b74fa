"""The command line: readable errors with exit code 2, never a traceback, for bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from agent.serve import free_port
from flows.cli import main
from flows.table import format_row, summary_row
from storage.warehouse import Warehouse


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
        {
            "round": 1,
            "pool_size": 104,
            "rollouts": 72,
            "success_rate": 0.25,
            "signals": {"forgetting": 1, "boundary": 12, "rare": 3},
            "accepted": 4,
            "rejected": 9,
            "heldout_success": 0.125,
            "optimizer_steps": 2,
        },
        61.2,
    )
    assert row.split() == ["1", "104", "72", "0.250", "2", "1/12/3", "4", "9", "0.125", "61s"]
    assert len(format_row(("round",) + ("x",) * 9)) == len(row)


def test_a_round_that_trained_nothing_shows_0_optimizer_steps_and_an_older_record_a_dash():
    summary = {"round": 0, "pool_size": 9, "rollouts": 8, "success_rate": 0.0, "signals": {}, "accepted": 0,
               "rejected": 0, "heldout_success": 0.0}  # fmt: skip
    assert summary_row({**summary, "optimizer_steps": 0}, 3).split()[4] == "0"
    assert summary_row(summary, 3).split()[4] == "-"


def test_evaluate_with_an_unknown_category_exits_2_naming_the_choices(tmp_path, capsys):
    code = main(
        ["evaluate", "--checkpoint", str(tmp_path), "--categories", "base,simple", "--set", f"state_dir={tmp_path}"]
    )
    assert code == 2 and "multi_turn_miss_func" in capsys.readouterr().err


def _warehouse(state_dir):
    Warehouse(state_dir / "warehouse").close()


def test_sql_with_a_syntax_error_prints_the_databases_message_on_one_line(tmp_path, capsys):
    _warehouse(tmp_path)
    assert main(["sql", "SELEC 1", "--set", f"state_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err == 'error: query failed: Parser Error: syntax error at or near "SELEC"\n'


def test_sql_on_an_unknown_table_names_it_on_one_line(tmp_path, capsys):
    _warehouse(tmp_path)
    assert main(["sql", "SELECT * FROM no_such_table", "--set", f"state_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "no_such_table does not exist" in err and err.count("\n") == 1


def test_sql_with_a_bad_query_exits_non_zero_without_a_traceback(tmp_path):
    _warehouse(tmp_path)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "sql", "SELEC 1", "--set", f"state_dir={tmp_path}"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and done.stdout == ""
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1 and "SELEC" in done.stderr


def test_sql_on_a_damaged_warehouse_says_how_to_recover(tmp_path, capsys):
    (tmp_path / "warehouse" / "catalog").mkdir(parents=True)
    (tmp_path / "warehouse" / "catalog" / "layout.json").write_bytes(b"\x13" * 20_000)
    assert main(["sql", "SELECT 1", "--set", f"state_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "warehouse") in err and "from a backup" in err and err.count("\n") == 1


def test_sql_on_an_unreachable_object_store_names_the_endpoint_and_the_setting_on_one_line(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = {"endpoint_url": endpoint, "config_kwargs": {"retries": {"max_attempts": 1}}}
    code = main([
        "sql", "SELECT 1", "--set", f"state_dir={tmp_path}", "--set", "warehouse.uri=s3://bucket/prefix",
        "--set", f"warehouse.storage_options={json.dumps(options)}",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"cannot reach the warehouse s3://bucket/prefix at endpoint {endpoint}" in err
    assert "warehouse.storage_options" in err and "AWS_ENDPOINT_URL" in err
