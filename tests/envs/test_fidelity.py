"""Ground-truth fidelity: replaying BFCL's reference answers through step() passes its checks."""

from __future__ import annotations

import pytest

from coevolve.records import Task, ToolCall
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.official import CATEGORIES, official_tasks


def play(env: BfclEnvironment, task: Task, reference: list[list[ToolCall]]) -> tuple[float, bool, dict]:
    env.reset(task)
    for turn in reference:
        if turn:
            env.step("[" + ", ".join(call.render() for call in turn) + "]")
        if env.step("done").done:
            break
    return env.score()


def test_every_multi_turn_base_entry_succeeds_on_its_ground_truth():
    tasks = official_tasks("multi_turn_base")
    env = BfclEnvironment()
    failures = [t.description for t in tasks if not play(env, t, t.reference)[1]]
    assert len(tasks) == 200 and failures == []


@pytest.mark.parametrize("category", CATEGORIES[1:])
def test_other_multi_turn_categories_succeed_on_their_ground_truth(category):
    tasks = official_tasks(category)
    env = BfclEnvironment()
    failures = [t.description for t in tasks if not play(env, t, t.reference)[1]]
    assert len(tasks) == 200 and failures == []


def test_official_tasks_are_tagged_and_parsed():
    task = official_tasks("multi_turn_base", limit=1)[0]
    assert task.provenance.origin == "official" and task.description == "multi_turn_base_0"
    assert task.environment == "bfcl"
    # 'sort('final_report.pdf')' in the answer file is positional; the reference names it.
    assert ToolCall("sort", {"file_name": "final_report.pdf"}) in task.reference[2]


def test_dropping_a_state_changing_call_fails_every_base_entry():
    env = BfclEnvironment()
    for task in official_tasks("multi_turn_base"):
        reference = [list(turn) for turn in task.reference]
        reference[0] = reference[0][:-1]
        assert not play(env, task, reference)[1], task.description


def test_changing_an_argument_fails_the_entry():
    task = official_tasks("multi_turn_base", limit=1)[0]  # first turn: cd, mkdir temp, mv
    reference = [list(turn) for turn in task.reference]
    reference[0][1] = ToolCall("mkdir", {"dir_name": "tmp"})
    reward, success, details = play(BfclEnvironment(), task, reference)
    assert not success and details["turn"] == 0


def test_answering_done_at_once_fails_with_an_empty_turn():
    task = official_tasks("multi_turn_base", limit=1)[0]
    env = BfclEnvironment()
    env.reset(task)
    env.step("done")
    assert env.score()[2]["error_type"] == "multi_turn:empty_turn_model_response"
