"""The workplace's apps (envs/workplace/): a seeded world, and what each tool of mail, calendar, contacts and tasks
does to the state and answers.

Every tool runs on plain in-memory data and answers with text; a request it refuses, a tool it does not have or an
argument of the wrong type is an ``Error: ...`` answer that leaves the state as it was, never an exception.
"""

from __future__ import annotations

import copy
import json

import pytest

from coevolve.records import ToolCall
from envs.workplace.tools import TOOLS, run_call, schemas
from envs.workplace.world import APPS, generate_world

OWNER = "sam.carter@northwind.com"
ANA = "ana.lopez@brightline.com"
BEN = "ben.hart@northwind.com"
# A small workplace written out, so the answers below can be read against it.
STATE = {
    "owner": {"name": "Sam Carter", "email": OWNER, "company": "Northwind"},
    "today": "2025-03-03",
    "Mail": {
        "messages": {
            "m1": {"folder": "inbox", "sender": ANA, "to": [OWNER], "subject": "Budget update",
                   "body": "The budget is ready for review.", "date": "2025-03-01", "unread": True, "reply_to": None},
            "m2": {"folder": "inbox", "sender": BEN, "to": [OWNER], "subject": "Launch next steps",
                   "body": "Can we meet this week?", "date": "2025-03-02", "unread": False, "reply_to": None},
        },
        "next_id": 3,
    },
    "Calendar": {
        "events": {
            "e1": {"title": "Budget sync", "date": "2025-03-04", "start": "09:00", "minutes": 60, "attendees": [ANA]},
        },
        "next_id": 2,
    },
    "Contacts": {
        "contacts": {
            "c1": {"name": "Ana Lopez", "email": ANA, "company": "Brightline", "role": "buyer", "phone": "555-1234"},
            "c2": {"name": "Ben Hart", "email": BEN, "company": "Northwind", "role": "engineer", "phone": "555-9876"},
        },
        "next_id": 3,
    },
    "Tasks": {
        "tasks": {
            "t1": {"title": "Prepare the budget", "assignee": OWNER, "status": "todo", "due": "2025-03-07",
                   "project": "Apollo"},
        },
        "next_id": 2,
    },
}  # fmt: skip


@pytest.fixture
def state():
    return copy.deepcopy(STATE)


def run(state, tool, **arguments):
    return run_call(state, list(APPS), ToolCall(tool, arguments))


def test_a_world_is_the_same_for_the_same_seed_and_plain_json():
    world = generate_world(7)
    assert world == generate_world(7) and world != generate_world(8)
    assert json.loads(json.dumps(world)) == world
    assert set(world) == {"owner", "today", *APPS}
    assert len(world["Contacts"]["contacts"]) == 8 and len(world["Mail"]["messages"]) == 8
    # Every address the world mentions is one of its people's.
    people = {c["email"] for c in world["Contacts"]["contacts"].values()} | {world["owner"]["email"]}
    assert all(m["sender"] in people and set(m["to"]) <= people for m in world["Mail"]["messages"].values())
    assert all(set(e["attendees"]) <= people for e in world["Calendar"]["events"].values())


def test_mail_lists_newest_first_searches_reads_and_marks(state):
    assert run(state, "list_mail") == (
        f"m2 from {BEN} 'Launch next steps'\nm1 from {ANA} 'Budget update' (unread)"
    )  # fmt: skip
    assert run(state, "list_mail", unread_only=True) == f"m1 from {ANA} 'Budget update' (unread)"
    assert run(state, "search_mail", query="budget") == f"m1 from {ANA} 'Budget update' (unread)"
    assert run(state, "search_mail", query="nothing like it") == "No messages match 'nothing like it'"
    assert run(state, "read_email", message_id="m1").endswith("'Budget update': The budget is ready for review.")
    assert state["Mail"]["messages"]["m1"]["unread"] is False
    assert run(state, "mark_email", message_id="m1", unread=True) == "Marked m1 unread"
    assert state["Mail"]["messages"]["m1"]["unread"] is True


def test_mail_sends_replies_and_moves(state):
    assert run(state, "send_email", to=[ANA], subject="Hello", body="See you.") == f"Sent m3 to {ANA}"
    sent = state["Mail"]["messages"]["m3"]
    assert (sent["folder"], sent["sender"], sent["date"], sent["to"]) == ("sent", OWNER, "2025-03-03", [ANA])
    assert run(state, "reply_email", message_id="m2", body="Yes.") == f"Sent m4 to {BEN}"
    reply = state["Mail"]["messages"]["m4"]
    assert (reply["subject"], reply["reply_to"]) == ("Re: Launch next steps", "m2")
    assert run(state, "move_email", message_id="m1", folder="archive") == "Moved m1 to archive"
    assert run(state, "list_mail", folder="archive") == f"m1 from {ANA} 'Budget update' (unread)"
    assert run(state, "move_email", message_id="m1", folder="archive") == "Error: m1 is already in archive"
    assert run(state, "read_email", message_id="m9") == "Error: no message with id 'm9'"
    assert run(state, "send_email", to=["not an address"], subject="a", body="b").startswith("Error:")


def test_the_calendar_books_refuses_overlaps_finds_free_time_moves_and_cancels(state):
    assert run(state, "list_events", date="2025-03-04") == f"e1 09:00-10:00 'Budget sync' with {ANA}"
    assert run(state, "list_events", date="2025-03-05") == "No events on 2025-03-05"
    refused = run(state, "create_event", title="Clash", date="2025-03-04", start="09:30")
    assert refused == f"Error: conflicts with e1 09:00-10:00 'Budget sync' with {ANA}"
    assert run(state, "find_free_slot", date="2025-03-04", minutes=45) == "Free on 2025-03-04 at 10:00 for 45 minutes"
    booked = run(state, "create_event", title="Launch review", date="2025-03-04", start="10:00", attendees=[BEN])
    assert booked == f"Created e2 10:00-10:30 'Launch review' with {BEN} on 2025-03-04"
    assert run(state, "move_event", event_id="e1", date="2025-03-05", start="14:00").startswith("Moved e1 14:00-15:00")
    assert run(state, "cancel_event", event_id="e2") == "Cancelled e2 'Launch review' on 2025-03-04"
    assert set(state["Calendar"]["events"]) == {"e1"} and state["Calendar"]["events"]["e1"]["date"] == "2025-03-05"
    assert run(state, "create_event", title="Late", date="2025-03-02", start="10:00").startswith("Error: 2025-03-02 is")
    assert run(state, "create_event", title="Odd", date="2025-03-06", start="10:10").startswith("Error: start must")


def test_contacts_are_found_by_name_company_or_role_added_and_updated(state):
    assert run(state, "search_contacts", company="bright") == f"c1 Ana Lopez <{ANA}> buyer at Brightline"
    assert run(state, "search_contacts", role="engineer").startswith("c2 Ben Hart")
    assert run(state, "search_contacts", name="Lopez", company="Northwind") == "No contacts match"
    assert run(state, "search_contacts") == "Error: give a name, company or role to search for"
    added = run(state, "add_contact", name="Cleo Ross", email="Cleo.Ross@kestrel.com", company="Kestrel")
    assert added == "Added c3 Cleo Ross <cleo.ross@kestrel.com> at Kestrel"
    assert run(state, "add_contact", name="Again", email=ANA) == f"Error: a contact with the address {ANA} exists"
    assert run(state, "update_contact", contact_id="c1", role="sales manager").endswith("sales manager at Brightline")
    assert state["Contacts"]["contacts"]["c1"]["role"] == "sales manager"


def test_the_task_tracker_creates_assigns_sets_status_and_due_dates_and_lists(state):
    assert run(state, "create_task", title="Send the contract") == f"Created t2 'Send the contract' todo for {OWNER}"
    assert run(state, "assign_task", task_id="t2", assignee=BEN).startswith("Assigned t2")
    assert run(state, "set_task_status", task_id="t2", status="in_progress").startswith("Set t2")
    assert run(state, "set_due_date", task_id="t2", due="2025-03-10").startswith("Set t2")
    assert state["Tasks"]["tasks"]["t2"] == {
        "title": "Send the contract", "assignee": BEN, "status": "in_progress", "due": "2025-03-10", "project": "",
    }  # fmt: skip
    assert run(state, "list_tasks", assignee=BEN) == f"t2 'Send the contract' in_progress due 2025-03-10 for {BEN}"
    assert run(state, "list_tasks", project="apollo").startswith("t1 'Prepare the budget' todo")
    assert run(state, "set_task_status", task_id="t2", status="finished").startswith("Error: status must be one of")
    assert run(state, "set_due_date", task_id="t1", due="next week") == (
        "Error: due must be a date written YYYY-MM-DD, not 'next week'"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (ToolCall("launch_rocket", {}), "Error: unknown tool 'launch_rocket'"),
        (ToolCall("send_email", {"to": ANA, "subject": "a", "body": "b"}), "Error: to must be of type array, not str"),
        (ToolCall("list_mail", {"limit": True}), "Error: limit must be of type integer, not bool"),
        (ToolCall("mark_email", {"message_id": "m1", "unread": "yes"}), "Error: unread must be of type boolean"),
        (ToolCall("cancel_event", {}), "Error: cancel_event() needs 'event_id'"),
        (ToolCall("cancel_event", {"event_id": "e1", "force": True}), "Error: cancel_event() has no parameter 'force'"),
        (ToolCall("cancel_event", {"__pos0": "e1", "__pos1": "x"}), "Error: cancel_event() got too many positional"),
        (ToolCall("create_event", {"title": "x" * 400, "date": "2025-03-05", "start": "10:00"}), "Error: title is"),
    ],
)
def test_unknown_tools_and_bad_arguments_are_error_answers_that_change_nothing(state, call, error):
    before = copy.deepcopy(state)
    assert run_call(state, list(APPS), call).startswith(error)
    assert state == before


def test_positional_arguments_take_the_documented_order_and_a_tool_outside_the_task_s_apps_is_unknown(state):
    assert run_call(state, list(APPS), ToolCall("read_email", {"__pos0": "m2"})).startswith("m2 from")
    assert run_call(state, ["Mail"], ToolCall("list_tasks", {})) == "Error: unknown tool 'list_tasks'"


def test_every_tool_is_documented_with_a_function_schema():
    documented = schemas(list(APPS))
    assert [s["name"] for s in documented] == [t.name for t in TOOLS] and len(documented) == 20
    for schema in documented:
        parameters = schema["parameters"]
        assert schema["description"] and parameters["type"] == "dict"
        assert set(parameters["required"]) <= set(parameters["properties"])
        assert all(
            spec["type"] in ("string", "integer", "boolean", "array") for spec in parameters["properties"].values()
        )
    assert [s["name"] for s in schemas(["Calendar"])] == [
        "list_events", "create_event", "move_event", "cancel_event", "find_free_slot",
    ]  # fmt: skip
