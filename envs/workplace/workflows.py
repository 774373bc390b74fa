"""Jobs that need several apps together, played step by step on a session's live state.

Each workflow reads what it needs from the state, runs its calls one after another (a later call uses what an
earlier one returned: the free slot found, the contact's address) and returns the steps, or an empty list when
the world has nothing it fits. Their requests refer back to what the earlier steps found (envs/workplace/
templates.py), so a policy must read the results to do them.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from coevolve.records import ToolCall
from envs.base import Triplet
from envs.workplace.explore_values import body, day, ids, later, records
from envs.workplace.session import Session
from envs.workplace.tools import BY_NAME
from envs.workplace.words import EVENT_FORMS, MEETING_MINUTES, NEW_FIRST_NAMES, NEW_LAST_NAMES, ROLES, TOPICS
from envs.workplace.world import email_of, fill

Workflow = Callable[[Session, random.Random, str], list[Triplet]]


def _steps(session: Session, calls: list[ToolCall], run_id: str) -> list[Triplet]:
    return [session.run(call, run_id) for call in calls]


def meet_contact(session: Session, rng: random.Random, run_id: str) -> list[Triplet]:
    """Find the contact at a company, email them, find a free slot and book a meeting with them there."""
    contacts = records(session.state, "Contacts", "contacts")
    companies = [c["company"] for c in contacts]
    single = [c for c in contacts if c["company"] and companies.count(c["company"]) == 1]
    if not single:
        return []
    contact = rng.choice(single)
    topic = rng.choice(TOPICS)
    steps = _steps(session, [
        ToolCall("search_contacts", {"company": contact["company"]}),
        ToolCall("send_email", {"to": [contact["email"]], "subject": fill("{Topic} meeting", topic),
                                "body": "Could we meet this week?"}),
    ], run_id)  # fmt: skip
    date, minutes = day(session.state, rng), rng.choice(MEETING_MINUTES)
    steps.append(session.run(ToolCall("find_free_slot", {"date": date, "minutes": minutes}), run_id))
    if session.context.slot is None:
        return steps
    date, start, minutes = session.context.slot
    title = fill(rng.choice(EVENT_FORMS), topic)
    event = {"title": title, "date": date, "start": start, "minutes": minutes, "attendees": [contact["email"]]}
    return [*steps, session.run(ToolCall("create_event", event), run_id)]


def mail_to_task(session: Session, rng: random.Random, run_id: str) -> list[Triplet]:
    """Find a message by its subject, read it, make a task of it for its sender, and tell them."""
    messages = session.state["Mail"]["messages"]
    subjects = [m["subject"] for m in messages.values()]
    inbox = [
        k for k in ids(session.state, "Mail", "messages")
        if messages[k]["folder"] == "inbox" and subjects.count(messages[k]["subject"]) == 1
    ]  # fmt: skip
    if not inbox:
        return []
    key = rng.choice(inbox)
    message = messages[key]
    task = {"title": message["subject"], "assignee": message["sender"], "due": later(session.state, rng)}
    return _steps(session, [
        ToolCall("search_mail", {"query": message["subject"]}),
        ToolCall("read_email", {"message_id": key}),
        ToolCall("create_task", task),
        ToolCall("reply_email", {"message_id": key, "body": "I added this to my tasks."}),
    ], run_id)  # fmt: skip


def follow_up(session: Session, rng: random.Random, run_id: str) -> list[Triplet]:
    """List a day's meetings, email the attendees of one of them and make a follow-up task for one attendee."""
    events = [e for e in records(session.state, "Calendar", "events") if e["attendees"]]
    if not events:
        return []
    event = rng.choice(events)
    return _steps(session, [
        ToolCall("list_events", {"date": event["date"]}),
        ToolCall("send_email", {"to": list(event["attendees"]), "subject": f"Notes from {event['title']}",
                                "body": body(rng)}),
        ToolCall("create_task", {"title": f"Follow up on {event['title']}", "assignee": event["attendees"][0],
                                 "due": later(session.state, rng)}),
    ], run_id)  # fmt: skip


def reschedule(session: Session, rng: random.Random, run_id: str) -> list[Triplet]:
    """Move a meeting to the first free slot of another day and tell its attendees."""
    events = session.state["Calendar"]["events"]
    if not events:
        return []
    key = rng.choice(ids(session.state, "Calendar", "events"))
    event = events[key]
    steps = _steps(session, [
        ToolCall("list_events", {"date": event["date"]}),
        ToolCall("find_free_slot", {"date": day(session.state, rng, 10), "minutes": event["minutes"]}),
    ], run_id)  # fmt: skip
    if session.context.slot is None:
        return steps
    date, start, _ = session.context.slot
    steps.append(session.run(ToolCall("move_event", {"event_id": key, "date": date, "start": start}), run_id))
    if event["attendees"] and steps[-1].ok:
        note = {"to": list(event["attendees"]), "subject": f"Moved: {event['title']}", "body": f"Now {date} {start}."}
        steps.append(session.run(ToolCall("send_email", note), run_id))
    return steps


def welcome(session: Session, rng: random.Random, run_id: str) -> list[Triplet]:
    """Add a new colleague to the contacts, give them a first task and welcome them by mail."""
    company = session.state["owner"]["company"]
    first, last = rng.choice(NEW_FIRST_NAMES), rng.choice(NEW_LAST_NAMES)
    address = email_of(first, last, company)
    title = fill("Read the {topic}", rng.choice(TOPICS))
    return _steps(session, [
        ToolCall("add_contact", {"name": f"{first} {last}", "email": address, "company": company,
                                 "role": rng.choice(ROLES)}),
        ToolCall("create_task", {"title": title, "assignee": address,
                                 "due": later(session.state, rng)}),
        ToolCall("send_email", {"to": [address], "subject": "Welcome", "body": f"Your first task: {title}."}),
    ], run_id)  # fmt: skip


# Each workflow with the tools it calls: exploration focused on some tools starts with a workflow that calls them.
WORKFLOWS: dict[str, tuple[Workflow, frozenset[str]]] = {
    "meet_contact": (meet_contact, frozenset({"search_contacts", "send_email", "find_free_slot", "create_event"})),
    "mail_to_task": (mail_to_task, frozenset({"search_mail", "read_email", "create_task", "reply_email"})),
    "follow_up": (follow_up, frozenset({"list_events", "send_email", "create_task"})),
    "reschedule": (reschedule, frozenset({"list_events", "find_free_slot", "move_event", "send_email"})),
    "welcome": (welcome, frozenset({"add_contact", "create_task", "send_email"})),
}


def fitting(apps: list[str], focus: list[str] | None = None) -> list[str]:
    """The workflows whose tools all belong to ``apps``; with ``focus``, those calling one of its tools."""
    names = [n for n, (_, tools) in WORKFLOWS.items() if all(BY_NAME[t].app in apps for t in tools)]
    return [n for n in names if WORKFLOWS[n][1] & set(focus)] if focus else names
