"""Requests a person could make, written from a task's reference calls.

A value the request can name is written literally (as its Python repr, so a policy can copy it). A value an
earlier step of the same job looked up is referred to instead, the way a person asks for a chain of work:
after a contact search that found one person, ``send_email(to=[their address])`` is "email them"; after a
message was read, ``create_task(title=its subject, assignee=its sender)`` is "create a task titled after that
message's subject for the sender of that message"; after ``find_free_slot``, a meeting at that time is booked "in
that slot". Such a request can only be done by reading the earlier results, which is what makes the apps work
together. The references are found by replaying the calls on the task's initial state, so the text is a function
of the initial state and the calls, and the same calls cut into other turns are written the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coevolve.records import ToolCall
from envs.workplace.apps import State, copy_state
from envs.workplace.tools import is_ok, run_call

_FREE = re.compile(r"^Free on (\S+) at (\S+) for (\d+) minutes$")
_CONTACT = re.compile(r"^(c\d+) .* <([^>]+)>")


@dataclass
class Context:
    """What earlier steps singled out: the values a request may refer to instead of naming them."""

    person: str | None = None  # the address of the one contact a search found, or of the contact just added
    person_id: str | None = None
    message_id: str | None = None  # the message just read, or the only one a search or listing showed
    message: dict[str, Any] | None = None
    slot: tuple[str, str, int] | None = None  # the free slot just found: date, start, minutes
    events: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # the day just listed: id -> title, people
    task_id: str | None = None  # the task just created, or the only one a listing showed

    def people(self, value: Any) -> str:
        """Addresses (one or a list) as a request names them."""
        addresses = value if isinstance(value, list) else [value]
        if self.person is not None and addresses == [self.person]:
            return "them"
        if self.message is not None and addresses == [self.message["sender"]]:
            return "the sender of that message"
        titles = [t for t, people in self.events.values() if people and sorted(addresses) == people]
        if isinstance(value, list) and len(titles) == 1:
            return f"the attendees of {titles[0]!r}"
        return " and ".join(repr(a) for a in addresses) if addresses else repr(value)

    def message_ref(self, key: Any) -> str:
        return "that message" if key == self.message_id else f"the message {key!r}"

    def event_ref(self, key: Any) -> str:
        titles = [t for t, _ in self.events.values()]
        if key in self.events and titles.count(self.events[key][0]) == 1:
            return f"the meeting {self.events[key][0]!r}"
        return f"the meeting {key!r}"

    def task_ref(self, key: Any) -> str:
        return "that task" if key == self.task_id else f"the task {key!r}"

    def learn(self, call: ToolCall, result: str, state: State) -> None:
        """Keep what the call singled out (after it ran on ``state``)."""
        if not is_ok(result):
            return
        first = result.split()[0] if result.split() else ""
        # A lookup that found several things, or none, singles nothing out: what it replaces is forgotten.
        single = "\n" not in result and not result.startswith("No ")
        name = call.name
        if name in ("search_contacts", "add_contact"):
            found = _CONTACT.match(result.removeprefix("Added ")) if single else None
            self.person_id, self.person = (found[1], found[2]) if found else (None, None)
        elif name == "read_email" or name in ("search_mail", "list_mail"):
            message = state["Mail"]["messages"].get(first) if single else None
            self.message_id, self.message = (first, dict(message)) if message else (None, None)
        elif name == "find_free_slot":
            free = _FREE.match(result)
            self.slot = (free[1], free[2], int(free[3])) if free else None
        elif name == "list_events":
            listed = [line.split()[0] for line in result.splitlines() if not result.startswith("No ")]
            events = state["Calendar"]["events"]
            self.events = {k: (events[k]["title"], list(events[k]["attendees"])) for k in listed if k in events}
        elif name == "create_task":
            self.task_id = result.split()[1]
        elif name == "list_tasks":
            self.task_id = first if single else None


def _clauses(*parts: str) -> str:
    return "".join(p for p in parts if p)


def _list_mail(a: dict[str, Any], c: Context) -> str:
    limit = f"{a['limit']} " if "limit" in a else ""
    unread = "unread " if a.get("unread_only") else ""
    return f"list the {limit}newest {unread}messages in {a.get('folder', 'inbox')!r}"


def _create_event(a: dict[str, Any], c: Context) -> str:
    when = (a.get("date"), a.get("start"), a.get("minutes", 30))
    if c.slot is not None and when == c.slot:
        text = f"book {a['title']!r} in that slot"
    else:
        text = f"book {a['title']!r} on {a['date']!r} at {a['start']!r}"
        text += f" for {a['minutes']} minutes" if "minutes" in a else ""
    return text + (f" with {c.people(a['attendees'])}" if a.get("attendees") else "")


def _move_event(a: dict[str, Any], c: Context) -> str:
    to_slot = c.slot is not None and (a["date"], a["start"]) == c.slot[:2]
    return f"move {c.event_ref(a['event_id'])} " + (
        "to that slot" if to_slot else f"to {a['date']!r} at {a['start']!r}"
    )


def _search_contacts(a: dict[str, Any], c: Context) -> str:
    return "find my contacts" + _clauses(
        f" named {a['name']!r}" if a.get("name") else "",
        f" at {a['company']!r}" if a.get("company") else "",
        f" whose role is {a['role']!r}" if a.get("role") else "",
    )


def _add_contact(a: dict[str, Any], c: Context) -> str:
    return f"add {a['name']!r} with the address {a['email']!r} to my contacts" + _clauses(
        f", company {a['company']!r}" if a.get("company") else "",
        f", role {a['role']!r}" if a.get("role") else "",
        f", phone {a['phone']!r}" if a.get("phone") else "",
    )


def _update_contact(a: dict[str, Any], c: Context) -> str:
    who = "that contact" if a["contact_id"] == c.person_id else f"the contact {a['contact_id']!r}"
    changes = [f"the {k} of {who} to {a[k]!r}" for k in ("email", "company", "role", "phone") if a.get(k)]
    return "set " + " and ".join(changes) if changes else literal(ToolCall("update_contact", a))


def _create_task(a: dict[str, Any], c: Context) -> str:
    if c.message is not None and a["title"] == c.message["subject"]:
        text = "create a task titled after that message's subject"
    else:
        text = f"create a task {a['title']!r}"
    return text + _clauses(
        f" for {c.people(a['assignee'])}" if a.get("assignee") else "",
        f" due {a['due']!r}" if a.get("due") else "",
        f" in the project {a['project']!r}" if a.get("project") else "",
    )


def _list_tasks(a: dict[str, Any], c: Context) -> str:
    return "list the tasks" + _clauses(
        f" of {a['assignee']!r}" if a.get("assignee") else "",
        f" with the status {a['status']!r}" if a.get("status") else "",
        f" in the project {a['project']!r}" if a.get("project") else "",
    )


PHRASES: dict[str, Callable[[dict[str, Any], Context], str]] = {
    "list_mail": _list_mail,
    "search_mail": lambda a, c: (
        f"search my mail for {a['query']!r}" + (f" in {a['folder']!r}" if a.get("folder") else "")
    ),
    "read_email": lambda a, c: f"read {c.message_ref(a['message_id'])}",
    "send_email": lambda a, c: f"email {c.people(a['to'])} with the subject {a['subject']!r} saying {a['body']!r}",
    "reply_email": lambda a, c: f"reply to {c.message_ref(a['message_id'])} saying {a['body']!r}",
    "move_email": lambda a, c: f"move {c.message_ref(a['message_id'])} to {a['folder']!r}",
    "mark_email": lambda a, c: f"mark {c.message_ref(a['message_id'])} as {'unread' if a['unread'] else 'read'}",
    "list_events": lambda a, c: f"list my meetings on {a['date']!r}",
    "create_event": _create_event,
    "move_event": _move_event,
    "cancel_event": lambda a, c: f"cancel {c.event_ref(a['event_id'])}",
    "find_free_slot": lambda a, c: f"find a free {a.get('minutes', 30)}-minute slot on {a['date']!r}",
    "search_contacts": _search_contacts,
    "add_contact": _add_contact,
    "update_contact": _update_contact,
    "create_task": _create_task,
    "assign_task": lambda a, c: f"assign {c.task_ref(a['task_id'])} to {c.people(a['assignee'])}",
    "set_task_status": lambda a, c: f"set the status of {c.task_ref(a['task_id'])} to {a['status']!r}",
    "set_due_date": lambda a, c: f"make {c.task_ref(a['task_id'])} due {a['due']!r}",
    "list_tasks": _list_tasks,
}


def literal(call: ToolCall) -> str:
    """A call no template fits (a malformed one): its name and arguments."""
    args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    return f"call {call.name} with {args}" if args else f"call {call.name}"


def phrases(calls: list[ToolCall], initial_config: dict[str, Any], apps: list[str]) -> list[str]:
    """One request per call, in order, each referring to what the calls before it singled out."""
    state = copy_state(initial_config)
    context = Context()
    out: list[str] = []
    for call in calls:
        try:
            out.append(PHRASES[call.name](call.arguments, context))
        except (KeyError, TypeError, ValueError):
            out.append(literal(call))
        context.learn(call, run_call(state, apps, call), state)
    return out


def sentence(parts: list[str]) -> str:
    """Requests joined with ', then ', capitalized, ending with a period."""
    text = ", then ".join(parts)
    return (text[:1].upper() + text[1:] + ".") if text else ""


def verbalize_turns(chunks: list[list[ToolCall]], initial_config: dict[str, Any], apps: list[str]) -> list[str]:
    """One user message per chunk of consecutive calls, the references running across the chunks."""
    said = iter(phrases([call for chunk in chunks for call in chunk], initial_config, apps))
    return [sentence([next(said) for _ in chunk]) for chunk in chunks]
