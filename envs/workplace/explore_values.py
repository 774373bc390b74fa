"""Argument values for exploration, read from the live workplace state or composed from the word lists.

Most values name what the state holds (an existing message, meeting, contact or task), so most exploration
calls succeed; when an earlier call of the walk singled something out (a contact found, a message read, a free
slot), a later call often uses it, which chains the apps the way a person's work does.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from typing import Any

from envs.workplace.apps import State
from envs.workplace.templates import Context
from envs.workplace.words import (
    BODY_SENTENCES,
    COMPANIES,
    EVENT_FORMS,
    FIRST_NAMES,
    LAST_NAMES,
    MEETING_MINUTES,
    PROJECTS,
    REPLIES,
    ROLES,
    STATUSES,
    SUBJECT_FORMS,
    TASK_FORMS,
    TOPICS,
    WEEKDAYS,
)
from envs.workplace.world import DAY_END, DAY_START, clock, email_of, fill

# How often a call uses what the walk singled out, where it has something.
CHAIN = 0.7
Chooser = Callable[[State, Context, random.Random], dict[str, Any]]


def day(state: State, rng: random.Random, days: int = 5) -> str:
    """One of the working days among the next ``days`` days, today included."""
    today = dt.date.fromisoformat(state["today"])
    dates = [today + dt.timedelta(days=i) for i in range(days)]
    return rng.choice([d for d in dates if d.weekday() < 5] or dates).isoformat()


def later(state: State, rng: random.Random) -> str:
    return (dt.date.fromisoformat(state["today"]) + dt.timedelta(days=rng.randint(1, 14))).isoformat()


def subject(rng: random.Random) -> str:
    return fill(rng.choice(SUBJECT_FORMS), rng.choice(TOPICS))


def body(rng: random.Random) -> str:
    return fill(rng.choice(REPLIES + BODY_SENTENCES), rng.choice(TOPICS), rng.choice(WEEKDAYS[:5]))


def ids(state: State, app: str, table: str) -> list[str]:
    """A table's ids by number: the walk's choices do not depend on the order a stored state's dicts hold them in."""
    return sorted(state[app][table], key=lambda k: (len(k), k))


def records(state: State, app: str, table: str) -> list[dict[str, Any]]:
    return [state[app][table][k] for k in ids(state, app, table)]


def _chained(value: Any, rng: random.Random) -> bool:
    return value is not None and rng.random() < CHAIN


def message_id(state: State, ctx: Context, rng: random.Random, folders: tuple[str, ...] = ("inbox",)) -> str:
    if _chained(ctx.message_id, rng) and ctx.message_id in state["Mail"]["messages"]:
        return str(ctx.message_id)
    messages = state["Mail"]["messages"]
    return rng.choice([k for k in ids(state, "Mail", "messages") if messages[k]["folder"] in folders] or ["m1"])


def person(state: State, ctx: Context, rng: random.Random) -> str:
    """An address: the one the walk singled out, a message's sender, or any contact's."""
    if _chained(ctx.person, rng):
        return str(ctx.person)
    if _chained(ctx.message, rng) and ctx.message is not None:
        return str(ctx.message["sender"])
    return str(rng.choice([c["email"] for c in records(state, "Contacts", "contacts")]))


def colleague(state: State, ctx: Context, rng: random.Random) -> str:
    if _chained(ctx.person, rng):
        return str(ctx.person)
    company = state["owner"]["company"]
    found = [c["email"] for c in records(state, "Contacts", "contacts") if c["company"] == company]
    return str(rng.choice(found or [state["owner"]["email"]]))


def event_id(state: State, ctx: Context, rng: random.Random) -> str:
    listed = [k for k in ctx.events if k in state["Calendar"]["events"]]
    if listed and rng.random() < CHAIN:
        return rng.choice(listed)
    return rng.choice(ids(state, "Calendar", "events") or ["e1"])


def task_id(state: State, ctx: Context, rng: random.Random) -> str:
    if _chained(ctx.task_id, rng) and ctx.task_id in state["Tasks"]["tasks"]:
        return str(ctx.task_id)
    return rng.choice(ids(state, "Tasks", "tasks") or ["t1"])


def _maybe(rng: random.Random, p: float, key: str, value: Any) -> dict[str, Any]:
    return {key: value} if rng.random() < p else {}


def _list_mail(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    return {**_maybe(r, 0.3, "folder", r.choice(("inbox", "sent", "archive"))),
            **_maybe(r, 0.3, "unread_only", True), **_maybe(r, 0.3, "limit", r.randint(1, 5))}  # fmt: skip


def _search_mail(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    message = s["Mail"]["messages"][message_id(s, Context(), r, ("inbox", "sent", "archive"))]
    words = [w for w in message["subject"].replace("Question about the ", "").split() if len(w) > 3]
    query = r.choice([message["subject"], *words]) if r.random() < 0.8 else message["sender"].split("@")[0]
    return {"query": query}


def _send_email(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    listed = [people for _, people in c.events.values() if people]
    to = r.choice(listed) if listed and r.random() < 0.5 else [person(s, c, r)]
    return {"to": list(to), "subject": subject(r), "body": body(r)}


def _move_email(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    key = message_id(s, c, r, ("inbox", "archive"))
    folder = s["Mail"]["messages"].get(key, {}).get("folder")
    return {"message_id": key, "folder": r.choice([f for f in ("inbox", "archive", "trash") if f != folder])}


def _mark_email(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    key = message_id(s, c, r, ("inbox", "archive"))
    return {"message_id": key, "unread": not s["Mail"]["messages"].get(key, {}).get("unread", False)}


def _slot(s: State, c: Context, r: random.Random) -> tuple[str, str, int]:
    if _chained(c.slot, r) and c.slot is not None:
        return c.slot
    return day(s, r, 10), clock(r.randrange(DAY_START, DAY_END - 60, 30)), r.choice(MEETING_MINUTES)


def _create_event(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    date, start, minutes = _slot(s, c, r)
    args: dict[str, Any] = {"title": fill(r.choice(EVENT_FORMS), r.choice(TOPICS)), "date": date, "start": start}
    if minutes != 30 or r.random() < 0.3:
        args["minutes"] = minutes
    return args | _maybe(r, 0.7, "attendees", [person(s, c, r)])


def _move_event(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    date, start, _ = _slot(s, c, r)
    return {"event_id": event_id(s, c, r), "date": date, "start": start}


def _search_contacts(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    contact = r.choice(records(s, "Contacts", "contacts"))
    field = r.choice(("name", "name", "company", "role"))
    value = r.choice(contact["name"].split()) if field == "name" else contact[field]
    return {field: value}


def _add_contact(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    first, last, company = r.choice(FIRST_NAMES), r.choice(LAST_NAMES), r.choice(COMPANIES)
    phone = f"555-{r.randint(1000, 9999)}"
    new = {"name": f"{first} {last}", "email": email_of(first, last, company), "company": company}
    return new | _maybe(r, 0.5, "role", r.choice(ROLES)) | _maybe(r, 0.3, "phone", phone)


def _update_contact(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    key = c.person_id if _chained(c.person_id, r) else r.choice(ids(s, "Contacts", "contacts"))
    field = r.choice(("role", "company", "phone"))
    values = {"role": r.choice(ROLES), "company": r.choice(COMPANIES), "phone": f"555-{r.randint(1000, 9999)}"}
    return {"contact_id": key, field: values[field]}


def _create_task(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    from_mail = _chained(c.message, r) and c.message is not None
    title = c.message["subject"] if from_mail and c.message else fill(r.choice(TASK_FORMS), r.choice(TOPICS))
    args: dict[str, Any] = {"title": title}
    if r.random() < 0.7:
        args["assignee"] = person(s, c, r) if from_mail or c.person else colleague(s, c, r)
    return args | _maybe(r, 0.6, "due", later(s, r)) | _maybe(r, 0.3, "project", r.choice(PROJECTS))


def _set_task_status(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    key = task_id(s, c, r)
    status = s["Tasks"]["tasks"].get(key, {}).get("status")
    return {"task_id": key, "status": r.choice([x for x in STATUSES if x != status])}


def _list_events(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    busy = [e["date"] for e in records(s, "Calendar", "events")]
    return {"date": r.choice(busy) if busy and r.random() < 0.8 else day(s, r, 7)}


def _list_tasks(s: State, c: Context, r: random.Random) -> dict[str, Any]:
    field = r.choice(("assignee", "status", "project", ""))
    values = {"assignee": colleague(s, c, r), "status": r.choice(STATUSES), "project": r.choice(PROJECTS)}
    return {field: values[field]} if field else {}


CHOOSERS: dict[str, Chooser] = {
    "list_mail": _list_mail,
    "search_mail": _search_mail,
    "read_email": lambda s, c, r: {"message_id": message_id(s, c, r, ("inbox", "archive"))},
    "send_email": _send_email,
    "reply_email": lambda s, c, r: {"message_id": message_id(s, c, r), "body": body(r)},
    "move_email": _move_email,
    "mark_email": _mark_email,
    "list_events": _list_events,
    "create_event": _create_event,
    "move_event": _move_event,
    "cancel_event": lambda s, c, r: {"event_id": event_id(s, c, r)},
    "find_free_slot": lambda s, c, r: {"date": day(s, r, 10)} | _maybe(r, 0.6, "minutes", r.choice(MEETING_MINUTES)),
    "search_contacts": _search_contacts,
    "add_contact": _add_contact,
    "update_contact": _update_contact,
    "create_task": _create_task,
    "assign_task": lambda s, c, r: {"task_id": task_id(s, c, r), "assignee": colleague(s, c, r)},
    "set_task_status": _set_task_status,
    "set_due_date": lambda s, c, r: {"task_id": task_id(s, c, r), "due": later(s, r)},
    "list_tasks": _list_tasks,
}
