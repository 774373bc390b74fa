"""Specification of envs.bfcl.explorer: exploration, abstraction, verbalization, seed tasks, demonstrations."""

from __future__ import annotations

import random
import time

from coevolve.records import Provenance, ToolCall
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.explorer import (
    DEFAULT_CLASSES,
    Triplet,
    abstract,
    build_tasks,
    environment_states,
    explore,
    replay,
    verbalize,
)
from envs.bfcl.templates import TEMPLATES


def test_environment_states_hold_only_configs_and_classes():
    states = environment_states()
    assert len(states) > 100
    for config, classes in states:
        assert set(config) <= set(classes)
        assert "question" not in config and "ground_truth" not in config


def test_environment_states_can_be_restricted_to_classes():
    states = environment_states(["MathAPI", "TicketAPI"])
    assert states and all(set(classes) <= {"MathAPI", "TicketAPI"} for _, classes in states)


def test_exploration_is_reproducible_and_mostly_valid():
    config, classes = environment_states(list(DEFAULT_CLASSES))[0]
    first = explore(config, classes, random.Random(3), 20, run_id="r1")
    second = explore(config, classes, random.Random(3), 20, run_id="r1")
    assert first == second and len(first) == 20
    states = environment_states(list(DEFAULT_CLASSES))
    rng = random.Random(0)
    triplets = [t for i in range(60) for t in explore(*states[i % len(states)], rng, 6)]
    assert sum(t.ok for t in triplets) / len(triplets) >= 0.7


def test_focus_tools_dominate_a_focused_walk():
    config, classes = next(s for s in environment_states() if "GorillaFileSystem" in s[1])
    triplets = explore(config, classes, random.Random(1), 40, focus_tools=["mkdir", "touch"])
    assert sum(t.action.name in {"mkdir", "touch"} for t in triplets) >= 24


def test_abstract_needs_min_steps_usable_calls():
    config, classes = {}, ["MathAPI"]
    ok = Triplet(ToolCall("add", {"a": 1, "b": 2}), '{"result": 3}', "r", True, False)
    failed = Triplet(ToolCall("divide", {"a": 1, "b": 0}), '{"error": "x"}', "r", False, False)
    assert abstract([ok, failed, failed], config, classes, Provenance("seed")) is None


def test_abstract_makes_a_single_turn_task_that_replays():
    config, classes = {}, ["MathAPI"]
    triplets = [
        Triplet(ToolCall("add", {"a": 1, "b": 2}), '{"result": 3}', "r", True, False),
        Triplet(ToolCall("add", {"a": 1, "b": 2}), '{"result": 3}', "r", True, False),
        Triplet(ToolCall("multiply", {"a": 2, "b": 5}), '{"result": 10}', "r", True, False),
        Triplet(ToolCall("mean", {"numbers": [1, 3]}), '{"result": 2.0}', "r", True, False),
    ]
    task = abstract(triplets, config, classes, Provenance("seed"), min_steps=3, max_steps=5)
    assert task is not None and len(task.turns) == 1
    assert [c.name for c in task.reference[0]] == ["add", "multiply", "mean"]  # the repeated read is dropped
    assert task.description == task.turns[0]
    assert replay(task, BfclEnvironment())[0]


def test_verbalize_names_every_argument_value_verbatim():
    samples = {"str": "alpha.txt", "list": ["#a", "#b"], "int": 7}
    for name in TEMPLATES:
        call = ToolCall(name, {"x_extra": samples["int"], "first": samples["str"], "second": samples["list"]})
        text = verbalize(call)
        for value in call.arguments.values():
            assert repr(value) in text, (name, text)
    assert verbalize(ToolCall("mkdir", {"dir_name": "temp"})) == "create a directory named 'temp'"
    assert verbalize(ToolCall("cd", {"folder": "docs"})) == "go into the folder 'docs'"
    assert (
        verbalize(ToolCall("post_tweet", {"content": "hi", "tags": ["#a"]}))
        == "post a tweet saying 'hi' with tags=['#a']"
    )
    assert verbalize(ToolCall("unknown_tool", {"k": 1})) == "call unknown_tool with k=1"


def test_build_tasks_is_reproducible_and_respects_exclude():
    first = build_tasks(10, seed=5)
    assert [t.task_id for t in first] == [t.task_id for t in build_tasks(10, seed=5)]
    assert {t.task_id for t in first} != {t.task_id for t in build_tasks(10, seed=6)}
    excluded = {first[0].task_id, first[1].task_id}
    assert not excluded & {t.task_id for t in build_tasks(10, seed=5, exclude=excluded)}


def test_built_tasks_are_distinct_valid_and_fast():
    start = time.perf_counter()
    tasks = build_tasks(100, seed=0, origin="seed")
    assert time.perf_counter() - start < 10
    assert len({t.task_id for t in tasks}) == 100
    for task in tasks:
        assert 3 <= task.num_reference_calls <= 5 and len(task.turns) == 1
        assert set(task.involved_classes) <= set(DEFAULT_CLASSES)
        assert task.provenance.origin == "seed"
        ok, reason, _ = replay(task, BfclEnvironment())
        assert ok, reason


def test_build_tasks_honours_classes():
    tasks = build_tasks(5, seed=1, classes=["MathAPI"])
    assert tasks and all(t.involved_classes == ["MathAPI"] for t in tasks)


def test_replay_reports_the_failing_call():
    task = build_tasks(1, seed=2, classes=["MathAPI"])[0]
    broken = type(task)(**{**task.__dict__, "reference": [[ToolCall("divide", {"a": 1, "b": 0})] + task.reference[0]]})
    ok, reason, _ = replay(broken, BfclEnvironment())
    assert not ok and "divide" in reason


def test_demonstrations_end_each_turn_with_done_and_succeed():
    env = BfclEnvironment()
    for task in build_tasks(30, seed=3):
        messages = env.demonstration(task)
        assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert messages[2].content == "[" + ", ".join(c.render() for c in task.reference[0]) + "]"
        assert messages[-1].content == "done"
        assert env.score()[:2] == (1.0, True)


def test_multi_turn_demonstration_brings_each_user_turn(fs_task):
    messages = BfclEnvironment().demonstration(fs_task)
    roles = [m.role for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
    assert messages[5].content == fs_task.turns[1]
