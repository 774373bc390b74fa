"""LLM synthesis: model replies become contexts, executed calls and queries, or rejections with reasons.

The replies are literal strings as a chat endpoint returns them; the calls run in a real BFCL environment.
"""

import json

import pytest

from coevolve.config import SynthesisConfig
from coevolve.records import Candidate, Provenance
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.explorer import abstract, build_tasks
from tasks.synthesis.llm_replies import (
    CONTEXT_KEYS,
    extract_json_object,
    parse_abstraction,
    parse_context,
    parse_next_call,
)
from tasks.synthesis.llm_synthesis import run_step, write_query
from tasks.synthesize import make_synthesizer
from tasks.validate import validate_candidates

TOOLS = ["ls", "mkdir", "cd", "touch", "mv"]


def context_reply(**overrides):
    body = {
        "summary": "half of the samples failed",
        "failure_cause": "the agent forgot to enter the folder",
        "instability_pattern": "cd before mkdir",
        "focus_patterns": ["mkdir", "cd"],
        "exploration_objectives": ["create nested folders", "move files between them"],
        "do_not_repeat": ["mkdir(dir_name='temp')"],
    }
    body.update(overrides)
    return "Here is the plan:\n```json\n" + json.dumps(body) + "\n```"


@pytest.fixture(scope="module")
def fs_task():
    return build_tasks(1, seed=3, classes=["GorillaFileSystem"])[0]


def test_json_is_found_in_fences_prose_or_bare():
    assert extract_json_object('{"a": 1}') == ({"a": 1}, None)
    assert extract_json_object('Sure! {"a": 1} hope it helps')[0] == {"a": 1}
    assert extract_json_object('```json\n{"a": [1, 2]}\n```')[0] == {"a": [1, 2]}


def test_a_reply_without_json_is_rejected_with_a_reason():
    for garbage in ["", "mkdir mkdir mkdir", "{not json at all", "[1, 2, 3]"]:
        obj, reason = extract_json_object(garbage)
        assert obj is None and reason


def test_a_complete_context_keeps_only_available_focus_tools():
    context, reason = parse_context(context_reply(focus_patterns=["mkdir", "rm_rf", "cd>mv"]), TOOLS)
    assert reason is None
    assert set(context) == set(CONTEXT_KEYS)
    assert context["focus_patterns"] == ["mkdir", "cd", "mv"]
    assert context["exploration_objectives"] == ["create nested folders", "move files between them"]


def test_a_context_with_missing_keys_is_rejected():
    reply = json.dumps({"summary": "x", "focus_patterns": ["ls"]})
    context, reason = parse_context(reply, TOOLS)
    assert context is None and reason.startswith("context: missing keys")


def test_a_context_that_invents_every_tool_is_rejected():
    context, reason = parse_context(context_reply(focus_patterns=["teleport", "hack_mainframe"]), TOOLS)
    assert context is None and "no available tool" in reason


def test_an_exploration_reply_yields_one_whitelisted_call():
    call, done, reason = parse_next_call("[mkdir(dir_name='drafts'), cd(folder='drafts')]", TOOLS)
    assert (call.name, call.arguments, done, reason) == ("mkdir", {"dir_name": "drafts"}, False, None)
    assert parse_next_call("DONE.", TOOLS) == (None, True, None)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("[teleport(to='mars')]", "unknown tool: teleport"),
        ("[__import__('os').system('rm -rf /')]", "unknown tool: system"),
        ("[mkdir(dir_name=open('/etc/passwd').read())]", "unparseable tool call"),
        ("I think we should make a folder", "no tool call in the reply"),
    ],
)
def test_invented_tools_code_and_prose_are_rejected_without_running(reply, expected, fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    before = env.state()
    triplet, done, reason = run_step(env, reply, TOOLS, "run#0")
    assert triplet is None and not done and expected in reason
    assert env.state() == before


def test_a_proposed_call_runs_in_the_environment_and_is_recorded(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    triplet, done, reason = run_step(env, "[mkdir(dir_name='llm_probe')]", env.tool_names(), "run#0")
    assert reason is None and not done
    assert triplet.ok and triplet.state_changed and triplet.run_id == "run#0"


def test_a_call_that_fails_in_the_environment_is_kept_with_its_error(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    triplet, _, reason = run_step(env, "[cd(folder='no_such_folder_here')]", env.tool_names(), "run#0")
    assert triplet is not None and not triplet.ok
    assert reason.startswith("cd(folder='no_such_folder_here') failed")


def test_abstraction_needs_a_description_and_a_query():
    assert parse_abstraction('{"description": "d", "query": "  make   a folder "}') == (
        {"description": "d", "query": "make a folder"},
        None,
    )
    assert parse_abstraction('{"description": "d"}')[1] == "query: 'query' is missing or not a non-empty string"
    assert parse_abstraction("the query is: make a folder")[1] == "query: no JSON object in the reply"


def test_replies_become_a_task_the_validator_accepts(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    replies = ["[mkdir(dir_name='alpha')]", "[cd(folder='alpha')]", "[touch(file_name='notes.txt')]", "[teleport()]"]
    triplets = [t for t, _, _ in (run_step(env, r, env.tool_names(), "run#0") for r in replies) if t is not None]
    provenance = Provenance("boundary", 1, "run/r1/t/s0", "boundary:run/r1/t/s0")
    minimal = abstract(triplets, fs_task.initial_config, fs_task.involved_classes, provenance)
    task, reason = write_query(
        minimal, '{"description": "Set up alpha", "query": "Create alpha, enter it and add notes.txt."}'
    )
    assert reason is None and task.turns == ["Create alpha, enter it and add notes.txt."]
    assert [c.name for c in task.reference[0]] == ["mkdir", "cd", "touch"]
    [judged] = validate_candidates([Candidate(task, provenance.signal_id)], [], set(), SynthesisConfig())
    assert judged.verdict.accepted, judged.verdict.reason


@pytest.mark.parametrize("split, reason", [("heldout", "same as a held-out task"), ("dev", "same as a dev task")])
def test_a_sealed_task_the_model_rewords_is_refused(split, reason):
    [sealed] = build_tasks(1, seed=29, origin=split, classes=["GorillaFileSystem"])
    env = BfclEnvironment()
    env.reset(sealed)
    replies = [f"[{call.render()}]" for call in sealed.reference[0]]
    triplets = [t for t, _, _ in (run_step(env, r, env.tool_names(), "run#0") for r in replies)]
    provenance = Provenance("rare", 2, "run/r2/t/s0", "rare:run/r2/t/s0")
    minimal = abstract(triplets, sealed.initial_config, sealed.involved_classes, provenance)
    task, _ = write_query(
        minimal, '{"description": "Tidy the workspace", "query": "Could you tidy up my workspace as follows?"}'
    )
    assert task.reference == sealed.reference and task.turns != sealed.turns
    heldout, dev = ([sealed], []) if split == "heldout" else ([], [sealed])
    [judged] = validate_candidates([Candidate(task, provenance.signal_id)], [], heldout, SynthesisConfig(), dev=dev)
    assert (judged.verdict.accepted, judged.verdict.reason) == (False, reason)


def test_the_configuration_picks_the_synthesizer():
    assert make_synthesizer(SynthesisConfig()).name == "programmatic"
    assert make_synthesizer(SynthesisConfig(synthesizer="llm", llm_model="m")).name == "llm"
