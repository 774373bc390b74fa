"""The workplace's tools: their documentation (function schemas), argument checking, and running one call.

A call runs only when its name is one of the task's apps' tools and every argument has the documented type;
anything else is an error result, never an exception. Positional arguments (``__pos0``...) take the
parameters in their documented order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from coevolve.records import ToolCall
from envs.calls import POSITIONAL_PREFIX
from envs.workplace import apps
from envs.workplace.apps import State, ToolError, copy_state
from envs.workplace.words import FOLDERS, STATUSES

ERROR_PREFIX = "Error: "
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "boolean": (bool,), "array": (list,)}


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # string, integer, boolean or array (of strings)
    description: str
    default: Any = None
    required: bool = False
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tool:
    name: str
    app: str
    description: str
    params: tuple[Param, ...]
    run: Callable[..., str]
    # Whether the tool only reads the state (a lookup whose result a task may ask for).
    reads: bool = False


def _p(name: str, type_: str, description: str, **options: Any) -> Param:
    return Param(name, type_, description, required="default" not in options, **options)


_ID = "string"
TOOLS: tuple[Tool, ...] = (
    # Mail
    Tool("list_mail", "Mail", "List the newest messages of a mail folder.", (
        _p("folder", "string", "inbox, sent, archive or trash.", default="inbox", enum=FOLDERS),
        _p("unread_only", "boolean", "Only unread messages.", default=False),
        _p("limit", "integer", "How many messages at most.", default=5),
    ), apps.list_mail, reads=True),
    Tool("search_mail", "Mail", "Find messages whose subject, body or addresses contain a text.", (
        _p("query", "string", "The text to look for."),
        _p("folder", "string", "Only this folder; empty: every folder but trash.", default="",
           enum=("", *FOLDERS)),
    ), apps.search_mail, reads=True),
    Tool("read_email", "Mail", "Show a whole message and mark it read.", (
        _p("message_id", _ID, "The message's id, e.g. 'm3'."),
    ), apps.read_email),
    Tool("send_email", "Mail", "Send a new message.", (
        _p("to", "array", "Recipients' email addresses."),
        _p("subject", "string", "Subject line."),
        _p("body", "string", "Message text."),
    ), apps.send_email),
    Tool("reply_email", "Mail", "Reply to a message's sender (subject 'Re: ...').", (
        _p("message_id", _ID, "The message answered."),
        _p("body", "string", "Reply text."),
    ), apps.reply_email),
    Tool("move_email", "Mail", "Move a message to another folder.", (
        _p("message_id", _ID, "The message's id."),
        _p("folder", "string", "inbox, archive or trash.", enum=("inbox", "archive", "trash")),
    ), apps.move_email),
    Tool("mark_email", "Mail", "Mark a message read or unread.", (
        _p("message_id", _ID, "The message's id."),
        _p("unread", "boolean", "True: unread; False: read."),
    ), apps.mark_email),
    # Calendar
    Tool("list_events", "Calendar", "List the meetings of one day.", (
        _p("date", "string", "The day, YYYY-MM-DD."),
    ), apps.list_events, reads=True),
    Tool("create_event", "Calendar", "Book a meeting; refused when it overlaps another.", (
        _p("title", "string", "The meeting's title."),
        _p("date", "string", "The day, YYYY-MM-DD."),
        _p("start", "string", "Start time HH:MM on a quarter hour."),
        _p("minutes", "integer", "Length in minutes (15 to 240).", default=30),
        _p("attendees", "array", "Attendees' email addresses.", default=[]),
    ), apps.create_event),
    Tool("move_event", "Calendar", "Move a meeting to another day or time.", (
        _p("event_id", _ID, "The meeting's id, e.g. 'e2'."),
        _p("date", "string", "The new day, YYYY-MM-DD."),
        _p("start", "string", "The new start time HH:MM."),
    ), apps.move_event),
    Tool("cancel_event", "Calendar", "Cancel a meeting.", (
        _p("event_id", _ID, "The meeting's id."),
    ), apps.cancel_event),
    Tool("find_free_slot", "Calendar", "The earliest free time of a day between 09:00 and 17:00.", (
        _p("date", "string", "The day, YYYY-MM-DD."),
        _p("minutes", "integer", "Length needed in minutes.", default=30),
    ), apps.find_free_slot, reads=True),
    # Contacts
    Tool("search_contacts", "Contacts", "Find contacts by name, company or role (parts of words match).", (
        _p("name", "string", "Part of the name.", default=""),
        _p("company", "string", "Part of the company.", default=""),
        _p("role", "string", "Part of the role.", default=""),
    ), apps.search_contacts, reads=True),
    Tool("add_contact", "Contacts", "Add a contact.", (
        _p("name", "string", "Full name."),
        _p("email", "string", "Email address."),
        _p("company", "string", "Company.", default=""),
        _p("role", "string", "Role.", default=""),
        _p("phone", "string", "Phone number.", default=""),
    ), apps.add_contact),
    Tool("update_contact", "Contacts", "Change a contact's details.", (
        _p("contact_id", _ID, "The contact's id, e.g. 'c4'."),
        _p("email", "string", "New email address.", default=None),
        _p("company", "string", "New company.", default=None),
        _p("role", "string", "New role.", default=None),
        _p("phone", "string", "New phone number.", default=None),
    ), apps.update_contact),
    # Tasks
    Tool("create_task", "Tasks", "Create a task in the tracker (status todo).", (
        _p("title", "string", "What is to be done."),
        _p("assignee", "string", "Email address of who does it; empty: me.", default=""),
        _p("due", "string", "Due date YYYY-MM-DD; empty: none.", default=""),
        _p("project", "string", "Project name.", default=""),
    ), apps.create_task),
    Tool("assign_task", "Tasks", "Give a task to someone.", (
        _p("task_id", _ID, "The task's id, e.g. 't2'."),
        _p("assignee", "string", "Their email address."),
    ), apps.assign_task),
    Tool("set_task_status", "Tasks", "Change a task's status.", (
        _p("task_id", _ID, "The task's id."),
        _p("status", "string", "todo, in_progress or done.", enum=STATUSES),
    ), apps.set_task_status),
    Tool("set_due_date", "Tasks", "Change a task's due date.", (
        _p("task_id", _ID, "The task's id."),
        _p("due", "string", "The new due date, YYYY-MM-DD."),
    ), apps.set_due_date),
    Tool("list_tasks", "Tasks", "List tasks, optionally only one assignee's, status's or project's.", (
        _p("assignee", "string", "Email address.", default=""),
        _p("status", "string", "todo, in_progress or done.", default="", enum=("", *STATUSES)),
        _p("project", "string", "Project name.", default=""),
    ), apps.list_tasks, reads=True),
)  # fmt: skip
BY_NAME: dict[str, Tool] = {tool.name: tool for tool in TOOLS}


def tools_of(app_names: list[str]) -> list[Tool]:
    """The tools of the given apps, in the documented order."""
    return [tool for tool in TOOLS if tool.app in app_names]


@cache
def schema(name: str) -> dict[str, Any]:
    """One tool's function schema: name, description, and JSON-schema parameters with required and defaults."""
    tool = BY_NAME[name]
    properties: dict[str, Any] = {}
    for param in tool.params:
        spec: dict[str, Any] = {"type": param.type, "description": param.description}
        if param.type == "array":
            spec["items"] = {"type": "string"}
        if param.enum:
            spec["enum"] = list(param.enum)
        if not param.required:
            spec["default"] = param.default
        properties[param.name] = spec
    required = [p.name for p in tool.params if p.required]
    description = f"{tool.app}: {tool.description}"
    return {"name": name, "description": description, "parameters": {"type": "dict", "properties": properties,
                                                                        "required": required}}  # fmt: skip


def schemas(app_names: list[str]) -> list[dict[str, Any]]:
    return [copy.deepcopy(schema(tool.name)) for tool in tools_of(app_names)]


def tool_line(name: str, style: str) -> str:
    """One tool of the system prompt: the bare name, its signature, or its signature and description."""
    tool = BY_NAME[name]
    if style == "names":
        return name
    params = [f"{p.name}: {p.type}" + ("" if p.required else f" = {p.default!r}") for p in tool.params]
    line = f"{name}({', '.join(params)})"
    return line if style == "signatures" else f"{line} - {tool.description.rstrip('.')}"


def _has_type(value: Any, type_: str) -> bool:
    """JSON-schema typing: a bool is no integer, and an integer is no bool."""
    return isinstance(value, _JSON_TYPES[type_]) and (type_ == "boolean" or not isinstance(value, bool))


def checked_arguments(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, each of its documented type; ToolError says what is wrong."""
    params = {p.name: p for p in tool.params}
    order = [p.name for p in tool.params]
    named: dict[str, Any] = {}
    for key, value in arguments.items():
        if key.startswith(POSITIONAL_PREFIX):
            index = int(key[len(POSITIONAL_PREFIX) :]) if key[len(POSITIONAL_PREFIX) :].isdigit() else len(order)
            if index >= len(order):
                raise ToolError(f"{tool.name}() got too many positional arguments")
            key = order[index]
        if key not in params:
            raise ToolError(f"{tool.name}() has no parameter {key!r}")
        if key in named:
            raise ToolError(f"{tool.name}() got {key!r} twice")
        named[key] = value
    for param in tool.params:
        if param.name not in named:
            if param.required:
                raise ToolError(f"{tool.name}() needs {param.name!r}")
            continue
        value = named[param.name]
        if value is None and not param.required and param.default is None:
            continue
        if not _has_type(value, param.type):
            raise ToolError(f"{param.name} must be of type {param.type}, not {type(value).__name__}")
        if param.type == "array" and not all(isinstance(v, str) for v in value):
            raise ToolError(f"{param.name} must be a list of strings")
        if param.type == "array" and len(value) > 10:
            raise ToolError(f"{param.name} holds more than 10 items")
        if param.enum and value not in param.enum:
            raise ToolError(f"{param.name} must be one of {', '.join(repr(e) for e in param.enum if e)}")
        if param.type == "integer" and not -1000 <= value <= 1000:
            raise ToolError(f"{param.name} is out of range")
    return named


def run_call(state: State, app_names: list[str], call: ToolCall) -> str:
    """Run one call on ``state`` with the tools of ``app_names``; every failure is an ``Error: ...`` result."""
    tool = BY_NAME.get(call.name)
    if tool is None or tool.app not in app_names:
        return f"{ERROR_PREFIX}unknown tool '{call.name}'"
    # A refused call leaves the state as it found it, even where the app had begun to change it (a tool changes
    # only its own app's part; lookups change nothing).
    keeps = not tool.reads and tool.app in state
    before = copy_state(state[tool.app]) if keeps else None
    try:
        return tool.run(state, **copy_state(checked_arguments(tool, call.arguments)))
    except ToolError as refused:
        message = str(refused)
    except Exception as exc:  # noqa: BLE001 - a malformed synthesized state must not end a rollout: the call fails
        message = f"{call.name} failed: {type(exc).__name__}"
    if keeps:
        state[tool.app] = before
    return f"{ERROR_PREFIX}{message}"


def is_ok(observation: str) -> bool:
    return not observation.startswith(ERROR_PREFIX)
