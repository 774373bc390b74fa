"""The workplace environment (envs/workplace/environment.py) behind the contract of envs/base.py.

An episode is judged turn by turn, as BFCL's are: when a turn ends, the state the model's calls left must equal the
state the reference's calls leave on a second copy, and every lookup the reference made must have been answered to
the model too. Its tasks come from exploration of seeded worlds and include jobs that need several apps together,
asked for the way a person asks ("email them", "book it in that slot"), so a policy has to read earlier results.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from coevolve.config import EnvironmentConfig, load_config
from coevolve.errors import ConfigError
from coevolve.records import Provenance, ToolCall
from envs.calls import parse_tool_calls
from envs.registry import environment_for, make_environment
from envs.workplace.environment import WorkplaceEnvironment
from envs.workplace.explorer import make_task
from envs.workplace.tools import BY_NAME
from envs.workplace.world import APPS
from tasks.splits import build_dev_split, build_initial_pools, sft_demonstrations
from tests.envs.test_workplace_apps import ANA, BEN, STATE

MEET_ANA = [
    ToolCall("search_contacts", {"company": "Brightline"}),
    ToolCall("send_email", {"to": [ANA], "subject": "Launch", "body": "Could we meet?"}),
    ToolCall("find_free_slot", {"date": "2025-03-04", "minutes": 30}),
    ToolCall("create_event", {"title": "Launch sync", "date": "2025-03-04", "start": "10:00", "attendees": [ANA]}),
]
MAIL_TO_TASK = [
    ToolCall("read_email", {"message_id": "m2"}),
    ToolCall("create_task", {"title": "Launch next steps", "assignee": BEN, "due": "2025-03-07"}),
]


@pytest.fixture
def env():
    return WorkplaceEnvironment(tool_list="names")


@pytest.fixture
def meet_ana():
    """Find the contact at Brightline, mail her, and book a meeting with her in the first free slot: two turns."""
    task = make_task(MEET_ANA, STATE, list(APPS), Provenance(origin="seed"))
    return WorkplaceEnvironment().in_turns(task, 2)


def play(env, task, replies):
    """Reset on ``task`` and send the replies until the episode ends; the score."""
    env.reset(task)
    for reply in replies:
        if env.step(reply).done:
            break
    return env.score()


def test_a_multi_app_task_asks_the_way_a_person_does_and_its_reference_scores_one(env, meet_ana):
    assert meet_ana.turns == [
        "Find my contacts at 'Brightline', then email them with the subject 'Launch' saying 'Could we meet?'.",
        "Find a free 30-minute slot on '2025-03-04', then book 'Launch sync' in that slot with them.",
    ]
    assert {BY_NAME[call.name].app for turn in meet_ana.reference for call in turn} == {"Contacts", "Mail", "Calendar"}
    calls = ["[" + ", ".join(c.render() for c in turn) + "]" for turn in meet_ana.reference]
    assert play(env, meet_ana, [calls[0], "done", calls[1], "done"]) == (1.0, True, {"turns": 2})


def test_reading_an_email_and_making_a_task_of_it_for_its_sender(env):
    task = make_task(MAIL_TO_TASK, STATE, list(APPS), Provenance(origin="seed"))
    assert task.turns == [
        "Read the message 'm2', then create a task titled after that message's subject for the sender of that "
        "message due '2025-03-07'."
    ]
    env.demonstration(task)
    assert env.score()[:2] == (1.0, True)
    assert env.state()["Tasks"]["tasks"]["t2"]["assignee"] == BEN


def test_a_wrong_or_partial_solution_scores_zero_with_the_first_failing_turn(env, meet_ana):
    search, _, slot, book = (c.render() for c in MEET_ANA)
    wrong = f"[{search}, send_email(to=['{BEN}'], subject='Launch', body='Could we meet?')]"
    reward, success, details = play(env, meet_ana, [wrong, "done"])
    assert (reward, success, details["turn"], details["error_type"]) == (0.0, False, 0, "state_mismatch")
    assert "Mail.m3" in details["differences"]
    # The first turn done, the second left without a call.
    first = "[" + ", ".join(c.render() for c in MEET_ANA[:2]) + "]"
    reward, _, details = play(env, meet_ana, [first, "done", "done"])
    assert (reward, details["turn"], details["error_type"]) == (0.0, 1, "empty_turn")
    # The right meeting booked without looking for the free slot the request asked for.
    reward, _, details = play(env, meet_ana, [first, "done", f"[{book}]", "done"])
    assert (reward, details["error_type"]) == (0.0, "missing_lookup")
    assert details["missing"] == ["Free on 2025-03-04 at 10:00 for 30 minutes"]
    # A meeting in another slot, after looking.
    late = book.replace("'10:00'", "'11:00'")
    assert play(env, meet_ana, [first, "done", f"[{slot}, {late}]", "done"])[:2] == (0.0, False)
    # The episode stopped after the first step: unfinished.
    assert play(env, meet_ana, [first])[2]["error_type"] == "unfinished"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "I will send the email now.",
        "[send_email(to=",
        "{'tool_calls': 3}",
        "x" * 30_000,
        "[f(**{'a': 1})]",
        "```python\n[search_contacts(company=open('/etc/passwd').read())]\n```",
    ],
)
def test_garbage_ends_the_turn_as_a_recorded_failure_and_never_raises(env, meet_ana, garbage):
    env.reset(meet_ana)
    outcome = env.step(garbage)
    assert outcome.turn_ended and not outcome.calls and outcome.done
    reward, success, details = env.score()
    assert (reward, success, details["error_type"]) == (0.0, False, "empty_turn")
    assert env.state() == STATE
    # Past the end, a step is answered, not raised.
    assert env.step("[list_mail()]").done


def test_an_unknown_tool_or_a_bad_argument_is_an_error_observation_and_the_turn_fails(env, meet_ana):
    env.reset(meet_ana)
    outcome = env.step("[launch_rocket(target='moon'), send_email(to='ana', subject=1, body='b')]")
    assert outcome.observations == [
        "Error: unknown tool 'launch_rocket'",
        "Error: to must be of type array, not str",
    ]
    assert outcome.messages[0].content.startswith("launch_rocket -> Error: unknown tool") and not outcome.turn_ended
    # Code is never run: a method call on anything reads as a call of that name, an unknown tool.
    assert env.step("[__import__('os').system('echo hi')]").observations == ["Error: unknown tool 'system'"]
    assert env.step("done").done and env.state() == STATE
    assert env.score()[:2] == (0.0, False) and env.score()[2]["error_type"] == "state_mismatch"


def test_the_prompt_names_the_person_today_and_the_tools_of_the_task_s_apps(env, meet_ana):
    system, user = env.reset(meet_ana)
    assert system.content.startswith(
        "You manage the work apps of Sam Carter <sam.carter@northwind.com>; today is Monday 2025-03-03."
    )
    assert user.content == meet_ana.turns[0] and env.turn == 0 and len(env.tool_names()) == 20
    calendar_only = WorkplaceEnvironment(tool_list="signatures")
    system, _ = calendar_only.reset(replace(meet_ana, involved_classes=["Calendar"]))
    assert calendar_only.tool_names() == ["cancel_event", "create_event", "find_free_slot", "list_events", "move_event"]
    assert "\nlist_events(date: string)\n" in system.content and "send_email" not in system.content
    described = WorkplaceEnvironment(tool_list="described")
    assert (
        "find_free_slot(date: string, minutes: integer = 30) - The earliest free"
        in described.reset(meet_ana)[0].content
    )
    assert env.tool_signatures(meet_ana)[3] == "send_email(to: array, subject: string, body: string)"
    assert env.conversation(meet_ana, render_chat=str) is None and env.official_categories == ()


def test_replay_accepts_a_task_whose_reference_runs_and_changes_state_and_refuses_others(env, meet_ana):
    assert env.replay(meet_ana) == (True, "all reference calls succeeded", True)
    broken = replace(meet_ana, reference=[[ToolCall("cancel_event", {"event_id": "e7"})]])
    ok, reason, _ = env.replay(broken)
    assert not ok and "cancel_event(event_id='e7') failed: Error: no event with id 'e7'" in reason
    reads_only = replace(meet_ana, reference=[[ToolCall("list_mail", {})]])
    assert env.replay(reads_only) == (True, "all reference calls succeeded", False)
    no_mail = replace(meet_ana, initial_config={k: v for k, v in STATE.items() if k != "Mail"})
    ok, reason, _ = env.replay(no_mail)
    assert not ok and reason.startswith("cannot build the environment: the Mail state needs")
    assert env.replay(replace(meet_ana, involved_classes=["Payroll"]))[0] is False


def test_explore_and_abstract_make_candidates_that_replay_cleanly(env, meet_ana):
    made = []
    for seed in range(6):
        triplets = env.explore(meet_ana, random.Random(seed), 8, focus_tools=["create_event"], run_id=f"r{seed}")
        assert len(triplets) == 8 and all(t.run_id == f"r{seed}" for t in triplets)
        task = env.abstract(triplets, meet_ana, Provenance(origin="boundary"), calls_per_turn=2)
        if task is not None:
            made.append(task)
    assert len(made) >= 3
    for task in made:
        assert task.environment == "workplace" and task.initial_config == STATE and 3 <= task.num_reference_calls <= 5
        assert type(environment_for(task)) is WorkplaceEnvironment
        assert environment_for(task).replay(task)[0]
    # One call at a time on the episode's state, as the LLM synthesizer explores.
    env.reset(meet_ana)
    step = env.explore_call(ToolCall("cancel_event", {"event_id": "e1"}), "s")
    assert step.ok and step.state_changed and step.observation.startswith("Cancelled e1")
    assert not env.explore_call(ToolCall("cancel_event", {"event_id": "e1"}), "s").ok


def reversed_order(value):
    """The same data with every dict's keys in reverse order, as a store might hand a state back."""
    if isinstance(value, dict):
        return {k: reversed_order(value[k]) for k in reversed(list(value))}
    return value


def test_exploration_does_not_depend_on_the_order_a_stored_state_holds_its_records_in(env, meet_ana):
    stored = replace(meet_ana, initial_config=reversed_order(STATE))
    for seed in range(4):
        walks = [env.explore(task, random.Random(seed), 10) for task in (meet_ana, stored)]
        assert walks[0] == walks[1]


def test_tasks_are_reproducible_from_the_seed_and_many_need_several_apps(env):
    tasks = env.build_tasks(40, seed=11, calls_per_turn=2)
    assert [t.task_id for t in tasks] == [
        t.task_id for t in WorkplaceEnvironment().build_tasks(40, 11, calls_per_turn=2)
    ]
    assert len({t.task_id for t in tasks}) == 40
    assert all(3 <= t.num_reference_calls <= 5 and all(len(turn) <= 2 for turn in t.reference) for t in tasks)
    assert all(len(t.turns) == len(t.reference) for t in tasks)
    multi_app = [t for t in tasks if len({BY_NAME[c.name].app for turn in t.reference for c in turn}) >= 2]
    referring = [t for t in tasks if any(w in " ".join(t.turns) for w in (" them", "that slot", "that message"))]
    assert len(multi_app) >= 30 and len(referring) >= 10
    others = env.build_tasks(10, seed=12, calls_per_turn=2, exclude={t.task_id for t in tasks})
    assert not {t.task_id for t in others} & {t.task_id for t in tasks}


def test_demonstrations_play_the_reference_turn_by_turn_and_parse_back_into_it(env):
    waited = 0
    for task in env.build_tasks(15, seed=4, calls_per_turn=2):
        messages = env.demonstration(task)
        assert env.score()[:2] == (1.0, True)
        assert [m.content for m in messages if m.role == "user"] == task.turns and messages[-1].content == "done"
        # Each turn's messages, up to its "done", say the turn's reference calls in order.
        turns = [[]]
        for message in messages[2:]:
            if message.role == "user":
                turns.append([])
            elif message.role == "assistant" and message.content != "done":
                turns[-1].append(parse_tool_calls(message.content)[0])
        assert [[call for said in turn for call in said] for turn in turns] == task.reference
        waited += sum(len(turn) > 1 for turn in turns)
    assert waited >= 3


def test_a_demonstration_waits_for_the_lookup_a_call_needs_and_joins_calls_that_need_none(env, meet_ana):
    # meet_ana asks to find the contact at a company and email "them": the address is the search's result; then to
    # book a meeting "in that slot", the one find_free_slot returns.
    messages = env.demonstration(meet_ana)
    said = [m.content for m in messages if m.role == "assistant"]
    assert said[0] == "[search_contacts(company='Brightline')]" and said[1].startswith("[send_email(")
    assert messages[3].role == "tool" and "ana" in messages[3].content
    literal = WorkplaceEnvironment().in_turns(
        make_task(meet_ana.reference[0][1:2] + [ToolCall("list_tasks", {})], meet_ana.initial_config,
                  meet_ana.involved_classes, Provenance(origin="seed")), 2)  # fmt: skip
    assert len([m for m in env.demonstration(literal) if m.role == "assistant"]) == 2  # one message, then done


def test_the_splits_are_disjoint_and_the_demonstrations_are_of_other_tasks(tmp_path):
    config = load_config(
        data={
            "state_dir": str(tmp_path),
            "environment": {"name": "workplace"},
            "pool": {"seed_size": 20},
            "rollout": {"heldout_tasks": 10},
            "policy": {"sft_tasks": 30},
        },
        environ={},
    )
    seed_pool, heldout = build_initial_pools(config)
    dev = build_dev_split(config, size=10)
    ids, conversations = sft_demonstrations(config, seed_pool, heldout)
    splits = [seed_pool, heldout, dev]
    assert [len(s) for s in splits] == [20, 10, 10] and len(ids) == len(conversations) == 30
    every = [t.task_id for s in splits for t in s] + ids
    assert len(set(every)) == len(every)
    assert len({t.identity for s in splits for t in s}) == 40
    assert all(t.environment == "workplace" for s in splits for t in s)
    # Checkpoint 0's demonstrations are short jobs, mostly one call per request.
    assert all(m.role != "assistant" or m.content == "done" or len(parse_tool_calls(m.content)[0]) <= 2
               for conversation in conversations for m in conversation)  # fmt: skip


def test_the_registry_builds_it_by_name_with_the_environment_section_s_settings(tmp_path):
    env = make_environment(EnvironmentConfig(name="workplace", max_steps_per_turn=3, tool_list="described"))
    assert isinstance(env, WorkplaceEnvironment) and (env.max_steps_per_turn, env.tool_list) == (3, "described")
    config = load_config(overrides=[f"state_dir={tmp_path}", "environment.name=workplace"], environ={})
    assert type(make_environment(config.environment)) is WorkplaceEnvironment
    # BFCL's prompts are BFCL's settings: the configuration refuses them for the workplace, naming whose they are.
    with pytest.raises(ConfigError, match="environment.prompt_style is a setting of environment 'bfcl' and applies to"):
        load_config(
            overrides=[f"state_dir={tmp_path}", "environment.name=workplace", "environment.prompt_style=bfcl",
                       "policy.model=Qwen/Qwen2.5-7B-Instruct", "environment.bfcl_handler=qwen"],
            environ={},
        )  # fmt: skip
    # At their defaults (as every configuration recorded before BFCL declared them holds them) they say nothing.
    fixed = load_config(
        overrides=[f"state_dir={tmp_path}", "environment.name=workplace", "environment.prompt_style=compact",
                   "policy.model=Qwen/Qwen2.5-7B-Instruct", "environment.bfcl_handler=null"],
        environ={},
    )  # fmt: skip
    assert "prompt_style" not in fixed.environment.model_dump()
    assert type(make_environment(fixed.environment)) is WorkplaceEnvironment
