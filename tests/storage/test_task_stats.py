"""Per-task statistics of a round's pool: one SQL statement over the trajectories, stored once per round."""

import pytest

from storage.warehouse import Warehouse
from tests.storage.conftest import RUN


@pytest.fixture
def played(warehouse, make_task, make_trajectory):
    """Pool 2 of three seed tasks and a boundary task: one task won 3 of 4 episodes over rounds 0 and 1, one lost
    its 2, and two were never played; a trajectory of round 2 itself (not before it) is there too."""
    tasks = [make_task(0), make_task(1), make_task(2), make_task(3, origin="boundary")]
    warehouse.write_tasks(tasks)
    warehouse.set_pool(RUN, 2, [t.task_id for t in tasks])
    won, lost = tasks[0].task_id, tasks[1].task_id
    warehouse.write_trajectories(
        [make_trajectory(won, 0, True, round=0), make_trajectory(won, 1, False, round=0)]
        + [make_trajectory(won, 0, True, round=1), make_trajectory(won, 1, True, round=1)]
        + [make_trajectory(lost, 0, False, round=1), make_trajectory(lost, 1, False, round=1)]
    )
    warehouse.write_trajectories([make_trajectory(lost, 0, True, round=2), make_trajectory(lost, 1, True, round=2)])
    return warehouse, tasks


def _rows(wh: Warehouse, history: int = 24, strength: float = 2.0) -> dict[str, dict]:
    return {r["task_id"]: r for r in wh.task_difficulty(RUN, 2, history, strength).to_pylist()}


def test_every_pool_task_has_a_row_with_its_episodes_before_the_round(played):
    wh, tasks = played
    rows = _rows(wh)
    assert set(rows) == {t.task_id for t in tasks}
    assert [(rows[t.task_id]["played"], rows[t.task_id]["recent_successes"]) for t in tasks] == [
        (4, 3), (2, 0), (0, 0), (0, 0)
    ]  # fmt: skip
    assert [rows[t.task_id]["last_round"] for t in tasks] == [1, 1, None, None]


def test_the_estimate_is_the_beta_posterior_mean_around_the_prior_of_the_tasks_kind(played):
    wh, tasks = played
    rows = _rows(wh, strength=2.0)
    # Seed tasks won 3 of 6 recent episodes; shrunk toward the pool's 3/6 with 2 pseudo-episodes: 0.5.
    seed_prior = (3 + 2 * 0.5) / (6 + 2)
    won = rows[tasks[0].task_id]
    assert won["prior_mean"] == pytest.approx(seed_prior)
    assert (won["alpha"], won["beta"]) == pytest.approx((2 * seed_prior + 3, 2 * (1 - seed_prior) + 1))
    assert won["estimate"] == pytest.approx((2 * seed_prior + 3) / 6)
    assert rows[tasks[2].task_id]["estimate"] == pytest.approx(seed_prior)  # never played: its kind's prior
    assert rows[tasks[3].task_id]["prior_mean"] == pytest.approx(0.5)  # no boundary episode: the pool's rate


def test_only_the_most_recent_episodes_count_toward_the_estimate(played):
    wh, tasks = played
    won = _rows(wh, history=2)[tasks[0].task_id]
    assert (won["played"], won["recent_played"], won["recent_successes"]) == (4, 2, 2)  # round 1's two wins


def test_a_rounds_statistics_are_stored_once_and_read_back(played, make_trajectory):
    wh, tasks = played
    first = _rows(wh)
    wh.write_trajectories([make_trajectory(tasks[2].task_id, 0, True, round=1)])  # would change round 2's rows
    assert _rows(wh) == first
    assert len(wh.files.files("task_difficulty", RUN, 2)) == 1


def test_the_view_shows_learnability_and_the_success_the_round_then_saw(played):
    wh, tasks = played
    _rows(wh)
    view = {r["task_id"]: r for r in wh.sql(f"SELECT * FROM v_task_difficulty WHERE run_id = '{RUN}'").to_dicts()}
    lost = view[tasks[1].task_id]
    assert lost["learnability"] == pytest.approx(lost["estimate"] * (1 - lost["estimate"]))
    assert (lost["episodes_in_round"], lost["success_in_round"]) == (2, 1.0)
    assert view[tasks[0].task_id]["success_in_round"] is None


def test_a_warehouse_made_before_the_table_gets_it_when_opened_for_writing(tmp_path):
    root = tmp_path / "old"
    Warehouse(root).close()
    empty = root / "tables" / "task_difficulty" / "run_id=_empty" / "round=0" / "_empty.parquet"
    empty.unlink()
    with Warehouse(root, read_only=True) as wh:  # read-only: the table reads as empty
        assert wh.sql("SELECT count(*) AS n FROM v_task_difficulty")["n"][0] == 0
    Warehouse(root).close()
    assert empty.exists()
