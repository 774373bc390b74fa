"""Ablation arms are distinct runs whatever the environment says, and an ablation that would compare a run with
itself refuses to start."""

import pytest

from coevolve.config import load_config
from coevolve.errors import ConfigError
from flows.ablation import ARMS, arm_config, arm_configs


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


def test_a_curriculum_arm_is_its_base_arm_with_the_learnability_sampler_and_dynamic_sampling(tmp_path):
    base = load_config(overrides=[f"state_dir={tmp_path}", "rollout.tasks_per_batch=24"], environ={})
    cfg = arm_config(base, "random+learnability", 2, "abl")
    assert cfg.synthesis.mode == "random" and cfg.pool.sampler == "learnability"
    assert cfg.rollout.dynamic_sampling and cfg.rollout.max_rollout_factor == 2.0
    assert cfg.run_id == "abl-random_learnability-s2"
    assert arm_config(base, "random", 2, "abl").pool.sampler == "uniform"


@pytest.mark.parametrize("tasks_per_batch", [24, 25])
def test_a_curriculum_arm_plays_at_most_the_episodes_its_base_arm_plays_per_step(tmp_path, tasks_per_batch):
    base = load_config(overrides=[f"state_dir={tmp_path}", f"rollout.tasks_per_batch={tasks_per_batch}"], environ={})
    plain, curriculum = (arm_config(base, arm, 1, "abl").rollout for arm in ("full", "full+learnability"))
    most = curriculum.tasks_per_batch * curriculum.group_size * curriculum.max_rollout_factor
    assert most <= plain.tasks_per_batch * plain.group_size  # 25: a batch of 12, never 12.5
    if tasks_per_batch == 24:  # configs/ablation_20steps.yaml: 12 x 6 x 2 = 24 x 6
        assert curriculum.tasks_per_batch == 12 and most == plain.tasks_per_batch * plain.group_size
