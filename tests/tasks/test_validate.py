"""Validation: only tasks the environment confirms join the pool, each rejection with its reason."""

from dataclasses import replace

import pytest

from coevolve.config import PoolConfig, SynthesisConfig
from coevolve.records import Candidate, Provenance, ToolCall
from envs.explorer import build_tasks
from tasks.validate import action_key, next_pool, validate_candidates


@pytest.fixture(scope="module")
def tasks():
    return build_tasks(6, seed=11)


def verdicts(candidates, pool=(), heldout=frozenset()):
    judged = validate_candidates(candidates, list(pool), set(heldout), SynthesisConfig())
    return [(c.verdict.accepted, c.verdict.reason) for c in judged]


def test_a_clean_new_task_is_accepted(tasks):
    [(accepted, reason)] = verdicts([Candidate(tasks[0], "boundary:x")])
    assert accepted, reason


def test_a_task_already_in_the_pool_is_a_duplicate(tasks):
    [(accepted, reason)] = verdicts([Candidate(tasks[0], None)], pool=[tasks[0]])
    assert not accepted and reason.startswith("duplicate of")


def test_same_calls_with_other_wording_is_the_same_action_sequence(tasks):
    reworded = replace(tasks[0], turns=["something else entirely"])
    assert action_key(reworded) == action_key(tasks[0])
    [(accepted, reason)] = verdicts([Candidate(reworded, None)], pool=[tasks[0]])
    assert not accepted and reason.startswith("same action sequence")


def test_held_out_tasks_never_enter_the_pool(tasks):
    [(accepted, reason)] = verdicts([Candidate(tasks[1], None)], heldout={tasks[1].task_id})
    assert not accepted and "held-out" in reason


def test_a_reference_that_fails_on_replay_is_rejected_with_the_call(tasks):
    broken = replace(tasks[2], reference=[[ToolCall("cd", {"folder": "no_such_dir_anywhere"})] + list(tasks[2].reference[0])])
    [(accepted, reason)] = verdicts([Candidate(broken, None)])
    assert not accepted and reason.startswith("replay failed")


def test_an_unknown_tool_in_a_synthesized_task_is_rejected_not_raised(tasks):
    bogus = replace(tasks[3], reference=[[ToolCall("__import__", {"name": "os"}), ToolCall("rm_rf", {}), ToolCall("eval", {"x": "1"})]])
    [(accepted, reason)] = verdicts([Candidate(bogus, None)])
    assert not accepted and reason.startswith("replay failed")


def test_too_short_references_are_rejected(tasks):
    short = replace(tasks[4], reference=[list(tasks[4].reference[0][:1])])
    [(accepted, reason)] = verdicts([Candidate(short, None)])
    assert not accepted and reason.startswith("too short")


def test_two_identical_candidates_in_one_round_enter_once(tasks):
    result = verdicts([Candidate(tasks[5], None), Candidate(tasks[5], None)])
    assert [a for a, _ in result] == [True, False]


def test_append_policy_keeps_every_task_and_adds_the_accepted(tasks):
    judged = validate_candidates([Candidate(tasks[1], None)], [tasks[0]], set(), SynthesisConfig())
    assert [t.task_id for t in next_pool([tasks[0]], judged, PoolConfig())] == [tasks[0].task_id, tasks[1].task_id]


def test_a_pool_cap_drops_the_oldest_tasks(tasks):
    judged = validate_candidates([Candidate(tasks[2], None)], tasks[:2], set(), SynthesisConfig())
    capped = next_pool(tasks[:2], judged, PoolConfig(max_size=2))
    assert [t.task_id for t in capped] == [tasks[1].task_id, tasks[2].task_id]


def test_provenance_survives_validation(tasks):
    sourced = replace(tasks[0], provenance=Provenance("rare", 2, "run/r2/t/s0", "rare:run/r2/t/s0"))
    [judged] = validate_candidates([Candidate(sourced, "rare:run/r2/t/s0")], [], set(), SynthesisConfig())
    assert judged.task.provenance.origin == "rare" and judged.signal_id == "rare:run/r2/t/s0"
