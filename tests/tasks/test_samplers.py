"""Pool samplers: the uniform draw the pipeline always made, and weights that favour learnable tasks."""

import random
import typing

import pytest

from coevolve.config import PoolConfig
from envs.bfcl.explorer import build_tasks
from tasks.samplers import MOST_LEARNABLE, SAMPLERS, TaskEstimate, draw_key, pool_sampler


@pytest.fixture(scope="module")
def tasks():
    return build_tasks(6, seed=21)


def test_every_sampler_setting_names_a_registered_rule():
    assert set(typing.get_args(PoolConfig.model_fields["sampler"].annotation)) == set(SAMPLERS)


def test_uniform_draws_what_the_pipeline_always_drew(tasks):
    uniform = pool_sampler(PoolConfig())
    key = draw_key(seed=1, round_=0, step=0, draw=0)
    assert key == "1:0:batch"
    assert uniform.draw(tasks, {}, 3, key) == random.Random("1:0:batch").sample(tasks, 3)
    assert uniform.draw(tasks, {}, 10, key) == tasks


def test_every_step_and_draw_has_its_own_seed():
    keys = {draw_key(1, 0, step, draw) for step in range(3) for draw in range(3)}
    assert len(keys) == 9


def test_a_draw_is_the_same_in_every_call_and_has_no_repeats(tasks):
    sampler = pool_sampler(PoolConfig(sampler="learnability"))
    estimates = {t.task_id: TaskEstimate(0.1 * (i + 1), 6) for i, t in enumerate(tasks)}
    first = sampler.draw(tasks, estimates, 4, "k")
    assert first == sampler.draw(tasks, estimates, 4, "k")
    assert len({t.task_id for t in first}) == 4


def test_learnability_weighs_p_times_one_minus_p_with_a_floor():
    sampler = pool_sampler(PoolConfig(sampler="learnability", weight_floor=0.02))
    assert sampler.weight(TaskEstimate(0.5, 6)) == pytest.approx(0.25)
    assert sampler.weight(TaskEstimate(0.2, 6)) == pytest.approx(0.16)
    assert sampler.weight(TaskEstimate(0.0, 12)) == pytest.approx(0.02)


def test_a_task_never_played_gets_the_largest_weight_when_exploring_first_else_its_priors():
    unplayed = TaskEstimate(0.05, 0)
    assert pool_sampler(PoolConfig(sampler="learnability", explore_unplayed=True)).weight(unplayed) == MOST_LEARNABLE
    assert pool_sampler(PoolConfig(sampler="learnability")).weight(unplayed) == pytest.approx(0.05 * 0.95)


def test_learnability_draws_mixed_tasks_far_more_often_than_always_failed_ones(tasks):
    sampler = pool_sampler(PoolConfig(sampler="learnability", weight_floor=0.02, sharpness=1.0))
    mixed, failed = tasks[0], tasks[1]
    estimates = {mixed.task_id: TaskEstimate(0.5, 6), failed.task_id: TaskEstimate(0.0, 6)}
    drawn = [sampler.draw([mixed, failed], estimates, 1, f"key{i}")[0] for i in range(400)]
    # Weights 0.25 and 0.02: the mixed task is drawn with probability 0.93.
    assert 0.85 < drawn.count(mixed) / 400 < 0.99
    assert failed in drawn  # the floor keeps it drawable


def test_band_keeps_estimates_inside_it_at_full_weight():
    sampler = pool_sampler(PoolConfig(sampler="band", band_low=0.2, band_high=0.8, weight_floor=0.01))
    assert sampler.weight(TaskEstimate(0.5, 6)) == MOST_LEARNABLE
    assert sampler.weight(TaskEstimate(0.9, 6)) == pytest.approx(0.01)


def test_a_band_upside_down_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="set band_low <= band_high"):
        PoolConfig(band_low=0.8, band_high=0.2)


def test_sharpness_concentrates_the_draws_on_the_most_learnable_tasks(tasks):
    mixed, failed = tasks[0], tasks[1]
    estimates = {mixed.task_id: TaskEstimate(0.5, 6), failed.task_id: TaskEstimate(0.1, 6)}

    def share_of_mixed(sharpness: float) -> float:
        sampler = pool_sampler(PoolConfig(sampler="learnability", sharpness=sharpness))
        return [sampler.draw([mixed, failed], estimates, 1, f"key{i}")[0] for i in range(400)].count(mixed) / 400

    # Weights 0.25 and 0.09: drawn with probability 0.74 as they are, 0.996 raised to the 4th power.
    assert share_of_mixed(1.0) < 0.85 < 0.97 < share_of_mixed(4.0)


def test_a_floor_of_zero_with_no_task_inside_the_band_draws_every_task_alike(tasks):
    sampler = pool_sampler(PoolConfig(sampler="band", weight_floor=0.0))
    estimates = {t.task_id: TaskEstimate(0.0, 6) for t in tasks}
    drawn = [sampler.draw(tasks[:2], estimates, 1, f"key{i}")[0] for i in range(200)]
    assert 0.35 < drawn.count(tasks[0]) / 200 < 0.65
