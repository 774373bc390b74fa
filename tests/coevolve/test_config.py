"""The typed configuration: defaults, sources in order, and errors that say how to fix them."""

from pathlib import Path

import pytest

from coevolve.config import PipelineConfig, load_config, parse_overrides
from coevolve.errors import ConfigError


def test_defaults_validate_and_keep_the_papers_clip_and_kl():
    config = load_config(environ={})
    assert config.training.epsilon_low == 0.20
    assert config.training.epsilon_high == 0.28
    assert config.training.beta == 1e-3
    assert config.signals.rare_theta == 5.0


def test_cli_overrides_beat_environment_which_beats_file(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("rollout:\n  group_size: 3\n  tasks_per_batch: 5\n")
    config = load_config(file, ["rollout.group_size=7"], environ={"COEVOLVE_ROLLOUT__TASKS_PER_BATCH": "9"})
    assert config.rollout.group_size == 7
    assert config.rollout.tasks_per_batch == 9


def test_api_key_variables_are_not_read_as_configuration():
    environ = {"COEVOLVE_OPENAI_API_KEY": "sk-secret", "COEVOLVE_RUN_ID": "nightly"}
    config = load_config(environ=environ)
    assert config.run_id == "nightly"
    assert "sk-secret" not in config.model_dump_json()


def test_a_misspelt_section_variable_fails_loudly():
    with pytest.raises(ConfigError, match="rolout"):
        load_config(environ={"COEVOLVE_ROLOUT__GROUP_SIZE": "4"})


def test_unknown_field_names_the_field():
    with pytest.raises(ConfigError, match="rollout.group_sise: unknown field"):
        load_config(overrides=["rollout.group_sise=4"], environ={})


def test_out_of_range_value_says_what_was_given():
    with pytest.raises(ConfigError, match=r"rollout.group_size: .*greater than or equal to 2.*got 1"):
        load_config(overrides=["rollout.group_size=1"], environ={})


def test_malformed_yaml_file_is_a_config_error(tmp_path):
    file = tmp_path / "bad.yaml"
    file.write_text("rollout: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(file, environ={})


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_override_without_equals_explains_the_form():
    with pytest.raises(ConfigError, match="section.field=value"):
        parse_overrides(["rollout.group_size"])


def test_inconsistent_task_lengths_are_rejected_with_a_fix():
    with pytest.raises(ConfigError, match="raise max_task_steps"):
        load_config(overrides=["synthesis.min_task_steps=6", "synthesis.max_task_steps=4"], environ={})


def test_state_paths_follow_state_dir(tmp_path):
    config = PipelineConfig(state_dir=tmp_path, run_id="r1")
    assert config.warehouse_path == tmp_path / "warehouse"
    assert config.pool_path(2).parent == tmp_path / "runs" / "r1" / "pools"
    assert config.mlflow_tracking_uri.startswith("sqlite:///")


def test_the_papers_preset_validates():
    config = load_config(Path(__file__).parents[2] / "configs" / "paper.yaml", environ={})
    assert (config.rollout.group_size, config.rollout.tasks_per_batch, config.training.learning_rate) == (8, 32, 1e-6)
    assert (config.environment.prompt_style, config.environment.bfcl_handler) == ("bfcl", "qwen_fc")


def test_the_papers_preset_is_the_papers_schedule():
    config = load_config(Path(__file__).parents[2] / "configs" / "paper.yaml", environ={})
    # 12 rounds x F=10 steps = 120 on-policy steps of 32 tasks x 8 rollouts, one optimizer across the run.
    schedule = (config.rounds, config.training.batches_per_round, config.rollout.tasks_per_batch)
    assert schedule + (config.rollout.group_size,) == (12, 10, 32, 8)
    assert (config.training.updates_per_batch, config.training.carry_optimizer) == (1, True)


def test_the_papers_method_keeps_the_uniform_pool_and_the_curriculum_preset_differs_only_by_the_curriculum():
    configs = Path(__file__).parents[2] / "configs"
    paper = load_config(configs / "paper.yaml", environ={}).model_dump(mode="json")
    curriculum = load_config(configs / "curriculum.yaml", environ={}).model_dump(mode="json")
    assert (paper["pool"]["sampler"], paper["rollout"]["dynamic_sampling"]) == ("uniform", False)
    assert (curriculum["pool"]["sampler"], curriculum["rollout"]["dynamic_sampling"]) == ("learnability", True)
    differ = {
        (section, key)
        for section, values in paper.items()
        if isinstance(values, dict)
        for key, value in values.items()
        if curriculum[section][key] != value
    }
    assert differ == {("pool", "sampler"), ("rollout", "dynamic_sampling")}  # max_rollout_factor: the default 2
    assert {k for k, v in paper.items() if not isinstance(v, dict) and curriculum[k] != v} == {"run_id"}


@pytest.mark.parametrize(
    ("setting", "named"),
    [("training.steps_per_round=4", "training.batches_per_round"), ("rollout.tasks_per_round=8", "tasks_per_batch")],
)
def test_a_renamed_setting_is_refused_with_what_replaced_it(setting, named):
    with pytest.raises(ConfigError, match=named):
        load_config(overrides=[setting], environ={})


def test_off_and_on_stay_strings_in_every_source(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("synthesis:\n  mode: off\nvalidation:\n  llm_judge: false\n")
    assert load_config(file, environ={}).synthesis.mode == "off"
    assert load_config(overrides=["synthesis.mode=off"], environ={}).synthesis.mode == "off"
    assert load_config(environ={"COEVOLVE_SYNTHESIS__MODE": "off"}).synthesis.mode == "off"
    assert load_config(overrides=["validation.embedding_dedupe=true"], environ={}).validation.embedding_dedupe is True


def test_overrides_given_in_code_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("COEVOLVE_RUN_ID", "from-env")
    monkeypatch.setenv("COEVOLVE_SYNTHESIS__MODE", "off")
    base = load_config()
    assert (base.run_id, base.synthesis.mode) == ("from-env", "off")
    arm = base.with_overrides({"run_id": "arm-a", "synthesis": {"mode": "random"}})
    assert (arm.run_id, arm.synthesis.mode) == ("arm-a", "random")


def test_list_values_come_from_json_in_the_environment():
    config = load_config(environ={"COEVOLVE_SIGNALS__ENABLED": '["boundary", "rare"]'})
    assert config.signals.enabled == ["boundary", "rare"]


def test_a_misspelt_field_variable_names_the_field():
    with pytest.raises(ConfigError, match="rollout.group_siz: unknown field"):
        load_config(environ={"COEVOLVE_ROLLOUT__GROUP_SIZ": "4"})


def test_state_dir_is_absolute_once_loaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(overrides=["state_dir=state"], environ={})
    assert config.state_dir == tmp_path / "state"
    assert config.checkpoint_dir(1).is_absolute()


def test_registering_checkpoints_by_uri_through_a_tracking_server_is_refused_saying_what_works():
    with pytest.raises(ConfigError, match="register_checkpoints='uri' cannot be used with the MLflow tracking server"):
        load_config(
            overrides=["tracking.mlflow_uri=http://127.0.0.1:5000", "tracking.register_checkpoints=uri"], environ={}
        )


def test_the_prompt_style_defaults_to_compact_with_no_bfcl_handler():
    config = PipelineConfig()
    assert config.environment.prompt_style == "compact" and config.environment.bfcl_handler is None


def test_the_bfcl_handler_is_derived_where_the_model_name_says_which():
    llama = load_config(overrides=["environment.prompt_style=bfcl", "policy.model=meta-llama/Llama-3.1-8B-Instruct"])
    qwen_fc = load_config(overrides=["environment.prompt_style=bfcl", "policy.model=/models/Qwen3-4B-FC"])
    assert llama.environment.bfcl_handler == "llama_3_1" and qwen_fc.environment.bfcl_handler == "qwen_fc"


def test_an_ambiguous_model_name_asks_for_the_bfcl_handler():
    with pytest.raises(ConfigError, match="set environment.bfcl_handler to qwen_fc"):
        load_config(overrides=["environment.prompt_style=bfcl", "policy.model=Qwen/Qwen3-4B"])
    config = load_config(
        overrides=["environment.prompt_style=bfcl", "environment.bfcl_handler=qwen", "policy.model=Qwen/Qwen3-4B"]
    )
    assert config.environment.bfcl_handler == "qwen"


def test_the_builtin_tiny_model_keeps_the_compact_prompt():
    with pytest.raises(ConfigError, match="builtin:tiny is fine-tuned on demonstrations in the compact prompt"):
        load_config(overrides=["environment.prompt_style=bfcl", "environment.bfcl_handler=chat"])


def test_the_rollout_section_stays_flat_across_the_modules_that_declare_its_fields(tmp_path):
    """Engine, server, sampling and evaluation fields are one ``rollout`` section to every source."""
    file = tmp_path / "c.yaml"
    file.write_text("rollout:\n  engine: openai\n  heldout_tasks: 7\n")
    environ = {"COEVOLVE_ROLLOUT__MANAGED_SERVERS": "1"}
    config = load_config(file, ["rollout.group_size=3"], environ=environ)
    assert (config.rollout.engine, config.rollout.managed_servers) == ("openai", 1)
    assert (config.rollout.group_size, config.rollout.heldout_tasks) == (3, 7)
    dumped = config.model_dump()["rollout"]
    assert list(dumped)[:2] == ["engine", "base_url"] and list(dumped)[-1] == "generate_batch"
    assert all(not isinstance(value, dict) for value in dumped.values())


def test_a_rollout_check_across_field_modules_names_the_fix():
    with pytest.raises(ConfigError, match="set rollout.engine=openai or rollout.managed_servers=0"):
        load_config(environ={}, overrides=["rollout.managed_servers=1"])


@pytest.mark.parametrize("value", ["inf", "-inf", ".inf", "nan", ".nan", "1e400"])
def test_non_finite_learning_rates_are_refused(value):
    with pytest.raises(ConfigError, match=r"training.learning_rate: .*finite number"):
        load_config(overrides=[f"training.learning_rate={value}"], environ={})


@pytest.mark.parametrize(
    ("override", "bound"),
    [
        ("rollout.max_new_tokens=1000000000000", "less than or equal to 131072"),
        ("training.learning_rate=0.5", "less than or equal to 0.1"),
        ("training.batches_per_round=1000000", "less than or equal to 1000"),
        ("rollout.concurrency=100000", "less than or equal to 1024"),
    ],
)
def test_absurd_sizes_are_refused_naming_the_setting_and_its_bound(override, bound):
    setting = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{setting}: .*{bound}") as refused:
        load_config(overrides=[override], environ={})
    assert "\n" not in str(refused.value)


def test_every_float_setting_refuses_infinity_from_a_file_too(tmp_path):
    file = tmp_path / "inf.yaml"
    file.write_text("placement:\n  stage_timeout_s: .inf\n")
    with pytest.raises(ConfigError, match=r"placement.stage_timeout_s: .*finite"):
        load_config(file, environ={})


def test_a_config_file_that_is_not_utf8_is_one_line_saying_to_save_it_as_utf8(tmp_path):
    file = tmp_path / "latin1.yaml"
    file.write_bytes("run_id: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text .*save it as UTF-8") as refused:
        load_config(file, environ={})
    assert "\n" not in str(refused.value)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    file = tmp_path / "bomb.yaml"
    file.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="aliases"):
        load_config(file, environ={})
    with pytest.raises(ConfigError, match="aliases"):
        parse_overrides(["synthesis.llm_model=" + "{" + ", ".join(lines) + "}"])


def test_values_nested_past_the_parser_are_one_line(tmp_path):
    file = tmp_path / "deep.yaml"
    file.write_text("rollout: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nests its values too deeply"):
        load_config(file, environ={})


def test_a_device_or_folder_given_as_config_is_not_read(tmp_path):
    with pytest.raises(ConfigError, match="/dev/zero is not a regular file"):
        load_config("/dev/zero", environ={})
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_config(tmp_path, environ={})


def test_an_oversized_config_file_is_refused_before_parsing(tmp_path):
    file = tmp_path / "huge.yaml"
    file.write_text("# " + "x" * (2 * 1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_config(file, environ={})


@pytest.mark.parametrize("name", ["ablation.yaml", "ablation_20steps.yaml", "ablation_quick.yaml"])
def test_the_ablations_configs_train_each_seed_on_one_thread_of_the_two_cores(name):
    config = load_config(Path(__file__).parents[2] / "configs" / name, environ={})
    # ablation_workers seeds at once, each with its own update: together no more threads than the 2 cores.
    assert config.ablation_workers * config.training.torch_threads == 2
    assert config.policy.torch_threads == 1
