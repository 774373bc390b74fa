"""Specification of envs.bfcl.state: BFCL states compared as bfcl-eval's checker does, ending on a directory that
bfcl-eval's ``cp`` copied into itself (``cp(source='docs', destination='docs')`` makes ``docs/docs`` hold itself)."""

from __future__ import annotations

import copy
import itertools

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker

import envs.bfcl.api as bfcl_api
from coevolve.records import ToolCall
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.explorer import BfclWorld, environment_states
from envs.bfcl.state import contains_itself, same_state, state_check
from tests.envs.conftest import FS_CONFIG  # the shared tasks' state: alex/ holds notes.txt and an empty docs/

SELF_COPY = ToolCall("cp", {"source": "docs", "destination": "docs"})


def _file_system(*calls: ToolCall) -> dict:
    """A file system of the shared test state after ``calls``, by class name as the checker takes it."""
    instances = bfcl_api.new_instances(FS_CONFIG, ["GorillaFileSystem"])
    table = bfcl_api.method_table(instances)
    tools = bfcl_api.class_of_tool(["GorillaFileSystem"])
    for call in calls:
        assert "error" not in bfcl_api.run_call(table, tools, call)
    return instances


def test_a_directory_copied_onto_its_own_name_holds_itself():
    assert not contains_itself(_file_system()["GorillaFileSystem"])
    copied = _file_system(SELF_COPY)["GorillaFileSystem"]
    assert contains_itself(copied)
    docs = copied.root.contents["docs"]
    assert docs.contents["docs"].contents["docs"] is docs.contents["docs"]


def test_two_states_with_the_same_self_copy_are_the_same_and_a_change_inside_it_is_a_difference():
    first, second = _file_system(SELF_COPY), _file_system(SELF_COPY)
    assert same_state(first["GorillaFileSystem"].root, second["GorillaFileSystem"].root)
    assert state_check(first, second) == {"valid": True}
    touched = _file_system(
        SELF_COPY,
        ToolCall("cd", {"folder": "docs"}),
        ToolCall("cd", {"folder": "docs"}),
        ToolCall("touch", {"file_name": "x"}),
    )
    assert not same_state(touched["GorillaFileSystem"].root, first["GorillaFileSystem"].root)
    result = state_check(touched, first)
    assert result["error_type"] == "multi_turn:instance_state_mismatch"
    assert set(result["details"]["differences"]) == {"root"}


def test_same_state_is_equality_on_the_official_initial_states():
    """Where no directory holds itself, same_state says what == says, and state_check what bfcl-eval says."""
    states = [bfcl_api.snapshot(bfcl_api.new_instances(config, classes)) for config, classes in environment_states()]
    assert len(states) > 10
    for first, second in itertools.combinations(states[:40], 2):
        assert same_state(first, second) == (first == second)
    for config, classes in environment_states()[:20]:
        model, truth = bfcl_api.new_instances(config, classes), bfcl_api.new_instances(config, classes)
        assert state_check(model, truth) == state_checker(model, truth) == {"valid": True}


def test_the_expert_play_of_a_self_copy_succeeds_and_a_play_without_it_fails_the_turn(make_task):
    task = make_task(["Copy 'docs' to 'docs'."], [[SELF_COPY]])
    env = BfclEnvironment()
    messages = env.demonstration(task)
    assert messages[-1].content == "done" and env.score()[:2] == (1.0, True)
    env.reset(task)
    env.step("[mkdir(dir_name='other')]")
    assert env.step("done").done
    reward, success, details = env.score()
    assert (reward, success, details["error_type"]) == (0.0, False, "multi_turn:instance_state_mismatch")


def test_walks_and_replays_go_on_after_a_self_copy(make_task):
    world = BfclWorld(FS_CONFIG, ["GorillaFileSystem"])
    assert world.run(SELF_COPY, "r").state_changed
    assert not world.run(ToolCall("ls", {}), "r").state_changed
    assert world.run(ToolCall("mkdir", {"dir_name": "new"}), "r").state_changed
    task = make_task(["Copy 'docs' to 'docs', then list the files."], [[SELF_COPY, ToolCall("ls", {})]])
    assert BfclEnvironment().replay(task) == (True, "all reference calls succeeded", True)


def test_a_state_copy_equals_a_deep_copy_and_shares_nothing_changeable_with_its_source():
    instances = _file_system(ToolCall("touch", {"file_name": "todo.txt"}))
    source = {
        "nested": {"a": [1, 2.5, "x", None, True, {"b": [[], {}]}]},
        "file_system": instances["GorillaFileSystem"].root,
        "pair": (1, [2]),
    }
    copied = bfcl_api.copy_value(source)
    assert copied == copy.deepcopy(source)
    copied["nested"]["a"][5]["b"][0].append("changed")
    copied["pair"][1].append(3)
    assert copied["file_system"] is not source["file_system"]
    assert source["nested"]["a"][5]["b"] == [[], {}] and source["pair"] == (1, [2])
