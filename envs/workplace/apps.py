"""The four apps' operations on a workplace state (envs/workplace/world.py): mail, calendar, contacts, tasks.

Each operation takes the state and checked arguments (envs/workplace/tools.py checks their types), changes the
state in place or reads it, and returns one short line of text per item, the most useful part first (results are
cut in the policy's prompt). A request that cannot be done raises `ToolError`, whose text is the call's result.
Nothing here touches anything but the state it is given.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from envs.workplace.world import DAY_END, DAY_START, clock

State = dict[str, Any]
_EMAIL = re.compile(r"^[a-z0-9._-]+@[a-z0-9.-]+\.[a-z]{2,}$")
MAX_TEXT = 300
MAX_RESULTS = 10


def copy_state(state: Any) -> Any:
    """A deep copy of JSON data (a workplace state is one), several times faster than copy.deepcopy."""
    return json.loads(json.dumps(state))


class ToolError(Exception):
    """A request the app refuses: the text says why."""


# -- checked values ------------------------------------------------------------------------------
def date_value(value: str, name: str = "date") -> str:
    try:
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise ToolError(f"{name} must be a date written YYYY-MM-DD, not {value!r}") from None


def minutes_of(value: str) -> int:
    """'HH:MM' on a quarter hour -> minutes after midnight."""
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", value)
    if match is None or int(match[1]) > 23 or int(match[2]) % 15:
        raise ToolError(f"start must be a time written HH:MM on a quarter hour, not {value!r}")
    return int(match[1]) * 60 + int(match[2])


def email_value(value: str) -> str:
    address = value.strip().lower()
    if not _EMAIL.match(address):
        raise ToolError(f"{value!r} is not an email address")
    return address


def text_value(value: str, name: str) -> str:
    if not value.strip():
        raise ToolError(f"{name} must not be empty")
    if len(value) > MAX_TEXT:
        raise ToolError(f"{name} is longer than {MAX_TEXT} characters")
    return value


def _record(state: State, app: str, table: str, key: str, what: str) -> dict[str, Any]:
    record = state[app][table].get(key)
    if record is None:
        raise ToolError(f"no {what} with id {key!r}")
    return record


def _new_id(state: State, app: str, prefix: str) -> str:
    number = state[app]["next_id"]
    state[app]["next_id"] = number + 1
    return f"{prefix}{number}"


def _by_id(state: State, app: str, table: str) -> list[tuple[str, dict[str, Any]]]:
    """A table's records in the order they were made (ids by number, whatever order the dict holds them in)."""
    return sorted(state[app][table].items(), key=lambda kv: _number(kv[0]))


def _number(key: str) -> int:
    return int(key[1:]) if key[1:].isdigit() else 0


def _lines(lines: list[str], empty: str) -> str:
    return "\n".join(lines[:MAX_RESULTS]) if lines else empty


# -- mail ----------------------------------------------------------------------------------------
def _mail_line(key: str, message: dict[str, Any]) -> str:
    unread = " (unread)" if message["unread"] else ""
    who = f"to {', '.join(message['to'])}" if message["folder"] == "sent" else f"from {message['sender']}"
    return f"{key} {who} '{message['subject']}'{unread}"


def _newest_first(state: State) -> list[tuple[str, dict[str, Any]]]:
    messages = state["Mail"]["messages"].items()
    return sorted(messages, key=lambda kv: (kv[1]["date"], _number(kv[0])), reverse=True)


def list_mail(state: State, folder: str = "inbox", unread_only: bool = False, limit: int = 5) -> str:
    if limit < 1:
        raise ToolError("limit must be at least 1")
    found = [
        _mail_line(k, m) for k, m in _newest_first(state) if m["folder"] == folder and (m["unread"] or not unread_only)
    ]
    return _lines(found[:limit], f"No messages in {folder}")


def search_mail(state: State, query: str, folder: str = "") -> str:
    needle = text_value(query, "query").lower()
    found = [
        _mail_line(k, m)
        for k, m in _newest_first(state)
        if (m["folder"] == folder if folder else m["folder"] != "trash")
        and any(needle in field.lower() for field in (m["subject"], m["body"], m["sender"], *m["to"]))
    ]
    return _lines(found, f"No messages match {query!r}")


def read_email(state: State, message_id: str) -> str:
    message = _record(state, "Mail", "messages", message_id, "message")
    message["unread"] = False
    return (
        f"{message_id} from {message['sender']} to {', '.join(message['to'])} on {message['date']} "
        f"'{message['subject']}': {message['body']}"
    )


def _deliver(state: State, to: list[str], subject: str, body: str, reply_to: str | None) -> str:
    key = _new_id(state, "Mail", "m")
    state["Mail"]["messages"][key] = {
        "folder": "sent",
        "sender": state["owner"]["email"],
        "to": to,
        "subject": subject,
        "body": body,
        "date": state["today"],
        "unread": False,
        "reply_to": reply_to,
    }
    return f"Sent {key} to {', '.join(to)}"


def send_email(state: State, to: list[str], subject: str, body: str) -> str:
    if not to:
        raise ToolError("to must name at least one address")
    return _deliver(state, [email_value(a) for a in to], text_value(subject, "subject"), text_value(body, "body"), None)


def reply_email(state: State, message_id: str, body: str) -> str:
    message = _record(state, "Mail", "messages", message_id, "message")
    to = message["to"] if message["folder"] == "sent" else [message["sender"]]
    subject = message["subject"] if message["subject"].startswith("Re: ") else f"Re: {message['subject']}"
    return _deliver(state, list(to), subject, text_value(body, "body"), message_id)


def move_email(state: State, message_id: str, folder: str) -> str:
    message = _record(state, "Mail", "messages", message_id, "message")
    if folder == "sent":
        raise ToolError("messages cannot be moved to sent")
    if message["folder"] == "sent" and folder != "trash":
        raise ToolError("sent messages can only be moved to trash")
    if message["folder"] == folder:
        raise ToolError(f"{message_id} is already in {folder}")
    message["folder"] = folder
    return f"Moved {message_id} to {folder}"


def mark_email(state: State, message_id: str, unread: bool) -> str:
    message = _record(state, "Mail", "messages", message_id, "message")
    message["unread"] = unread
    return f"Marked {message_id} {'unread' if unread else 'read'}"


# -- calendar ------------------------------------------------------------------------------------
def _span(event: dict[str, Any]) -> tuple[int, int]:
    start = minutes_of(event["start"])
    return start, start + event["minutes"]


def _event_line(key: str, event: dict[str, Any]) -> str:
    start, end = _span(event)
    attendees = f" with {', '.join(event['attendees'])}" if event["attendees"] else ""
    return f"{key} {clock(start)}-{clock(end)} '{event['title']}'{attendees}"


def _check_slot(state: State, date: str, start: int, minutes: int, ignore: str | None = None) -> None:
    if minutes < 15 or minutes > 240 or minutes % 15:
        raise ToolError("minutes must be a multiple of 15 between 15 and 240")
    if start < 8 * 60 or start + minutes > 18 * 60:
        raise ToolError("meetings must lie between 08:00 and 18:00")
    if date < state["today"]:
        raise ToolError(f"{date} is in the past (today is {state['today']})")
    for key, event in _by_id(state, "Calendar", "events"):
        other_start, other_end = _span(event)
        if key != ignore and event["date"] == date and start < other_end and other_start < start + minutes:
            raise ToolError(f"conflicts with {_event_line(key, event)}")


def list_events(state: State, date: str) -> str:
    day = date_value(date)
    found = sorted((e["start"], _event_line(k, e)) for k, e in _by_id(state, "Calendar", "events") if e["date"] == day)
    return _lines([line for _, line in found], f"No events on {day}")


def create_event(
    state: State, title: str, date: str, start: str, minutes: int = 30, attendees: list[str] | None = None
) -> str:
    day, begin = date_value(date), minutes_of(start)
    _check_slot(state, day, begin, minutes)
    key = _new_id(state, "Calendar", "e")
    state["Calendar"]["events"][key] = {
        "title": text_value(title, "title"),
        "date": day,
        "start": clock(begin),
        "minutes": minutes,
        "attendees": sorted({email_value(a) for a in attendees or []}),
    }
    return f"Created {_event_line(key, state['Calendar']['events'][key])} on {day}"


def move_event(state: State, event_id: str, date: str, start: str) -> str:
    event = _record(state, "Calendar", "events", event_id, "event")
    day, begin = date_value(date), minutes_of(start)
    if (day, clock(begin)) == (event["date"], event["start"]):
        raise ToolError(f"{event_id} is already at {day} {clock(begin)}")
    _check_slot(state, day, begin, event["minutes"], ignore=event_id)
    event["date"], event["start"] = day, clock(begin)
    return f"Moved {_event_line(event_id, event)} to {day}"


def cancel_event(state: State, event_id: str) -> str:
    event = _record(state, "Calendar", "events", event_id, "event")
    del state["Calendar"]["events"][event_id]
    return f"Cancelled {event_id} '{event['title']}' on {event['date']}"


def find_free_slot(state: State, date: str, minutes: int = 30) -> str:
    day = date_value(date)
    for start in range(DAY_START, DAY_END - minutes + 1, 15):
        try:
            _check_slot(state, day, start, minutes)
        except ToolError as refused:
            if "conflicts" not in str(refused):
                raise
            continue
        return f"Free on {day} at {clock(start)} for {minutes} minutes"
    return f"No free slot of {minutes} minutes on {day}"


# -- contacts ------------------------------------------------------------------------------------
def _contact_line(key: str, contact: dict[str, Any]) -> str:
    work = " ".join(filter(None, [contact["role"], f"at {contact['company']}" if contact["company"] else ""]))
    return f"{key} {contact['name']} <{contact['email']}> {work}".rstrip()


def search_contacts(state: State, name: str = "", company: str = "", role: str = "") -> str:
    wanted = {"name": name.lower().strip(), "company": company.lower().strip(), "role": role.lower().strip()}
    if not any(wanted.values()):
        raise ToolError("give a name, company or role to search for")
    found = [
        _contact_line(k, c)
        for k, c in _by_id(state, "Contacts", "contacts")
        if all(v in c[field].lower() for field, v in wanted.items() if v)
    ]
    return _lines(found, "No contacts match")


def add_contact(state: State, name: str, email: str, company: str = "", role: str = "", phone: str = "") -> str:
    address = email_value(email)
    if any(c["email"] == address for c in state["Contacts"]["contacts"].values()):
        raise ToolError(f"a contact with the address {address} exists")
    key = _new_id(state, "Contacts", "c")
    contact = {"name": text_value(name, "name"), "email": address, "company": company, "role": role, "phone": phone}
    state["Contacts"]["contacts"][key] = contact
    return f"Added {_contact_line(key, contact)}"


def update_contact(
    state: State,
    contact_id: str,
    email: str | None = None,
    company: str | None = None,
    role: str | None = None,
    phone: str | None = None,
) -> str:
    contact = _record(state, "Contacts", "contacts", contact_id, "contact")
    changes = {k: v for k, v in {"email": email, "company": company, "role": role, "phone": phone}.items() if v}
    if not changes:
        raise ToolError("give at least one of email, company, role or phone")
    if "email" in changes:
        changes["email"] = email_value(changes["email"])
    if all(contact[k] == v for k, v in changes.items()):
        raise ToolError(f"{contact_id} already has these details")
    contact.update(changes)
    return f"Updated {_contact_line(contact_id, contact)}"


# -- tasks ---------------------------------------------------------------------------------------
def _task_line(key: str, task: dict[str, Any]) -> str:
    due = f" due {task['due']}" if task["due"] else ""
    project = f" [{task['project']}]" if task["project"] else ""
    return f"{key} '{task['title']}' {task['status']}{due} for {task['assignee']}{project}"


def _task(state: State, task_id: str) -> dict[str, Any]:
    return _record(state, "Tasks", "tasks", task_id, "task")


def create_task(state: State, title: str, assignee: str = "", due: str = "", project: str = "") -> str:
    key = _new_id(state, "Tasks", "t")
    task = {
        "title": text_value(title, "title"),
        "assignee": email_value(assignee) if assignee else state["owner"]["email"],
        "status": "todo",
        "due": date_value(due, "due") if due else "",
        "project": project,
    }
    state["Tasks"]["tasks"][key] = task
    return f"Created {_task_line(key, task)}"


def assign_task(state: State, task_id: str, assignee: str) -> str:
    task, address = _task(state, task_id), email_value(assignee)
    if task["assignee"] == address:
        raise ToolError(f"{task_id} is already assigned to {address}")
    task["assignee"] = address
    return f"Assigned {_task_line(task_id, task)}"


def set_task_status(state: State, task_id: str, status: str) -> str:
    task = _task(state, task_id)
    if task["status"] == status:
        raise ToolError(f"{task_id} is already {status}")
    task["status"] = status
    return f"Set {_task_line(task_id, task)}"


def set_due_date(state: State, task_id: str, due: str) -> str:
    task, day = _task(state, task_id), date_value(due, "due")
    if task["due"] == day:
        raise ToolError(f"{task_id} is already due {day}")
    task["due"] = day
    return f"Set {_task_line(task_id, task)}"


def list_tasks(state: State, assignee: str = "", status: str = "", project: str = "") -> str:
    found = [
        _task_line(k, t)
        for k, t in _by_id(state, "Tasks", "tasks")
        if (not assignee or t["assignee"] == assignee.strip().lower())
        and (not status or t["status"] == status)
        and (not project or t["project"].lower() == project.strip().lower())
    ]
    return _lines(found, "No tasks match")
