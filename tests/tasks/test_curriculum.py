"""A step's curriculum: the sampler's draws and the gates' admissions, as the rollout stage plays them.

The draws below were made by the rollout stage's own loop before the curriculum was a class of its own
(tasks/rollout.py at d6ea044): the same settings still draw the same batches and replacements, in the same
order, and train on the same groups.
"""

import pytest

from coevolve.config import load_config
from coevolve.records import Task
from envs.bfcl.explorer import build_tasks
from tasks.curriculum import Gate, StepCurriculum, episode_budget
from tasks.samplers import TaskEstimate

GROUP, BATCH, SEED, ROUND, STEP = 2, 6, 3, 2, 1

# sampler -> (the step's draws in order, the groups it trains on); dynamic sampling with max_rollout_factor 2 and 3
# for learnability and band, none for uniform.
PINNED = {
    "uniform": (
        [
            [
                "t-6a4979352f228130",
                "t-93b238ed3ba09364",
                "t-15c19450645c3a12",
                "t-72ecc5d8331a38e8",
                "t-3b7347315244ab2e",
                "t-de64bed802dc20b2",
            ],
        ],
        None,
    ),
    "learnability": (
        [
            [
                "t-288afef8fcf275b1",
                "t-9721476dd70eabab",
                "t-93b238ed3ba09364",
                "t-639fde4dc9081737",
                "t-9e00774048e30c1f",
                "t-20f7a92c24f2f04d",
            ],
            [
                "t-5c1786f39005000b",
                "t-98d1ad75a813f4ef",
                "t-6a4979352f228130",
                "t-b95f0bed61ba888a",
                "t-96bd854feaf07ae9",
            ],
            ["t-767cb37194fcbcf6"],
        ],
        ["t-93b238ed3ba09364", "t-5c1786f39005000b", "t-b95f0bed61ba888a"],
    ),
    "band": (
        [
            [
                "t-288afef8fcf275b1",
                "t-9721476dd70eabab",
                "t-93b238ed3ba09364",
                "t-639fde4dc9081737",
                "t-9e00774048e30c1f",
                "t-5c1786f39005000b",
            ],
            ["t-20f7a92c24f2f04d", "t-b95f0bed61ba888a", "t-98d1ad75a813f4ef", "t-6a4979352f228130"],
            ["t-79497f43f9579890", "t-ecf2fd9428b7bc99", "t-767cb37194fcbcf6"],
            ["t-f643945c942270ff", "t-96bd854feaf07ae9"],
            ["t-015ad3d517c14eef"],
            ["t-69dddd65c946681f"],
            ["t-3b7347315244ab2e"],
        ],
        [
            "t-93b238ed3ba09364",
            "t-5c1786f39005000b",
            "t-b95f0bed61ba888a",
            "t-79497f43f9579890",
            "t-f643945c942270ff",
            "t-3b7347315244ab2e",
        ],
    ),
}
SETTINGS = {"uniform": (False, 1.0), "learnability": (True, 2.0), "band": (True, 3.0)}


@pytest.fixture(scope="module")
def pool() -> list[Task]:
    return build_tasks(30, seed=21)


def play(curriculum: StepCurriculum, pool: list[Task], rewards) -> tuple[list[list[str]], list[str] | None]:
    """The rollout stage's loop without an engine: each drawn task's group gets the rewards ``rewards`` gives it."""
    outcomes: dict[str, list] = {"task_id": [], "sample": [], "reward": []}
    index = {t.task_id: i for i, t in enumerate(pool)}
    draws = []
    batch = curriculum.first_draw(pool)
    while batch:
        draws.append([t.task_id for t in batch])
        for task in batch:
            for sample, reward in zip(curriculum.samples, rewards(index[task.task_id]), strict=True):
                outcomes["task_id"].append(task.task_id)
                outcomes["sample"].append(sample)
                outcomes["reward"].append(reward)
        batch = curriculum.next_draw(pool, outcomes)
    return draws, curriculum.train_tasks(outcomes)


def curriculum_for(tmp_path, pool, sampler: str, gates: list[str] | None = None) -> StepCurriculum:
    dynamic, factor = SETTINGS[sampler]
    config = load_config(
        overrides=[f"state_dir={tmp_path}", f"seed={SEED}", f"pool.sampler={sampler}",
                   f"rollout.tasks_per_batch={BATCH}", f"rollout.group_size={GROUP}",
                   f"rollout.dynamic_sampling={str(dynamic).lower()}", f"rollout.max_rollout_factor={factor}"],
        environ={},
    )  # fmt: skip
    estimates = {t.task_id: TaskEstimate(estimate=(i % 7) / 7, recent_played=i % 3) for i, t in enumerate(pool)}
    return StepCurriculum.for_step(config, estimates, ROUND, STEP)


@pytest.mark.parametrize("sampler", list(PINNED))
def test_the_same_settings_draw_and_train_what_the_rollout_stage_always_did(tmp_path, pool, sampler):
    every_third_mixed = lambda i: [1.0, 0.0] if i % 3 == 0 else [0.0, 0.0]  # noqa: E731
    assert play(curriculum_for(tmp_path, pool, sampler), pool, every_third_mixed) == PINNED[sampler]


def test_without_gates_the_batch_is_all_and_the_update_takes_every_group(tmp_path, pool):
    curriculum = curriculum_for(tmp_path, pool, "uniform")
    assert curriculum.gates == () and episode_budget(load_config(environ={}).rollout, ()) == 8 * 6
    draws, train = play(curriculum, pool, lambda i: [0.0, 0.0])
    assert len(draws) == 1 and train is None


def test_a_gate_decides_which_groups_count_and_replacements_fill_the_rest(tmp_path, pool):
    class EvenRows(Gate):
        name = "even"

        def admit(self, task: Task, rewards: list[float]) -> bool:
            return int(task.task_id[-1], 16) % 2 == 0

    curriculum = curriculum_for(tmp_path, pool, "band")
    curriculum.gates = (EvenRows(),)
    draws, train = play(curriculum, pool, lambda i: [0.0, 0.0])
    played = [t for draw in draws for t in draw]
    assert train == [t for t in played if int(t[-1], 16) % 2 == 0][:BATCH]
    assert len(played) * GROUP <= curriculum.budget and len(draws) > 1
