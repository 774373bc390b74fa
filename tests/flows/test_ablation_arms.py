"""Ablation arms are distinct runs whatever the environment says, and an ablation that would compare a run with
itself refuses to start."""

import pytest

from coevolve.config import load_config
from coevolve.errors import ConfigError
from flows.ablation import ARMS, arm_configs


def test_environment_variables_do_not_collapse_the_arms(monkeypatch, tmp_path):
    monkeypatch.setenv("COEVOLVE_RUN_ID", "x")
    monkeypatch.setenv("COEVOLVE_SYNTHESIS__MODE", "off")
    base = load_config(overrides=[f"state_dir={tmp_path}"])
    runs = arm_configs(base, list(ARMS), [1, 2], "abl")
    assert len({cfg.run_id for _, _, cfg in runs}) == len(runs) == 2 * len(ARMS)
    modes = {arm: cfg.synthesis.mode for arm, seed, cfg in runs if seed == 1}
    assert modes["static"] == "off" and modes["random"] == "random" and modes["full"] == "signal"


def test_arms_with_the_same_settings_refuse_to_start_naming_them(tmp_path):
    base = load_config(overrides=[f"state_dir={tmp_path}", "signals.enabled=[boundary, rare]"], environ={})
    with pytest.raises(ConfigError, match=r"full, no-forgetting resolve to the same settings for seed 1"):
        arm_configs(base, ["full", "no-forgetting"], [1], "abl")


def test_two_seeds_given_twice_refuse_to_share_a_run_id(tmp_path):
    base = load_config(overrides=[f"state_dir={tmp_path}"], environ={})
    with pytest.raises(
        ConfigError, match=r"static \(seed 3\), static \(seed 3\) all resolve to run id 'abl-static-s3'"
    ):
        arm_configs(base, ["static"], [3, 3], "abl")
