"""A person's workplace generated from a seed: their mailbox, calendar, contacts and project tasks.

The state is plain JSON data (it is a task's ``initial_config``), the same for the same seed on every machine:

    {"owner": {"name", "email", "company"}, "today": "YYYY-MM-DD",
     "Mail": {"messages": {"m1": {...}}, "next_id": 9},  "Calendar": {"events": {...}, "next_id": ...},
     "Contacts": {"contacts": {...}, "next_id": ...},    "Tasks": {"tasks": {...}, "next_id": ...}}

Records are keyed by id (``m``, ``e``, ``c``, ``t`` and a number), so two states compare equal with ``==``
whatever order their records were made in; new ids come from each app's ``next_id``.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from envs.workplace.words import (
    BODY_SENTENCES,
    COMPANIES,
    EVENT_FORMS,
    FIRST_NAMES,
    LAST_NAMES,
    MEETING_MINUTES,
    PROJECTS,
    ROLES,
    STATUSES,
    SUBJECT_FORMS,
    TASK_FORMS,
    TOPICS,
    WEEKDAYS,
)

# The apps, in the order their tools are listed: a task's involved_classes names some of them.
APPS: tuple[str, ...] = ("Mail", "Calendar", "Contacts", "Tasks")
# Seeds of the worlds the seed pool and the splits are built in: tasks share worlds, as BFCL's share official states.
WORLD_COUNT = 48
FIRST_MONDAY = dt.date(2025, 1, 6)
DAY_START, DAY_END = 9 * 60, 17 * 60


def domain(company: str) -> str:
    return company.lower().replace(" ", "") + ".com"


def email_of(first: str, last: str, company: str) -> str:
    return f"{first.lower()}.{last.lower()}@{domain(company)}"


def fill(form: str, topic: str, day: str = "Friday") -> str:
    """A form with its {topic}, {Topic} and {day} filled in."""
    return form.format(topic=topic, Topic=topic[:1].upper() + topic[1:], day=day)


def clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def weekday(date: str) -> str:
    return WEEKDAYS[dt.date.fromisoformat(date).weekday()]


def generate_world(seed: int) -> dict[str, Any]:
    """The workplace of world ``seed``: an owner, 8 contacts (3 colleagues, 5 at other companies), 8 messages,
    5 meetings this week and 5 project tasks."""
    rng = random.Random(f"workplace-world-{seed}")
    today = FIRST_MONDAY + dt.timedelta(weeks=rng.randrange(40))
    company = rng.choice(COMPANIES)
    others = rng.sample([c for c in COMPANIES if c != company], 5)
    lasts = rng.sample(LAST_NAMES, 9)
    firsts = [rng.choice(FIRST_NAMES) for _ in lasts]
    owner = {"name": f"{firsts[0]} {lasts[0]}", "email": email_of(firsts[0], lasts[0], company), "company": company}
    contacts: dict[str, dict[str, Any]] = {}
    for i, (first, last) in enumerate(zip(firsts[1:], lasts[1:], strict=True)):
        works_at = company if i < 3 else others[i - 3]
        contacts[f"c{i + 1}"] = {
            "name": f"{first} {last}",
            "email": email_of(first, last, works_at),
            "company": works_at,
            "role": rng.choice(ROLES),
            "phone": f"555-{rng.randint(1000, 9999)}",
        }
    people = [c["email"] for c in contacts.values()]
    colleagues = people[:3]
    messages: dict[str, dict[str, Any]] = {}
    for i in range(8):
        topic = rng.choice(TOPICS)
        day = (today - dt.timedelta(days=rng.randint(0, 6))).isoformat()
        other = rng.choice(people)
        sent = i >= 6
        body = " ".join(fill(s, topic, rng.choice(WEEKDAYS[:5])) for s in rng.sample(BODY_SENTENCES, 2))
        messages[f"m{i + 1}"] = {
            "folder": "sent" if sent else "inbox",
            "sender": owner["email"] if sent else other,
            "to": [other] if sent else [owner["email"]],
            "subject": fill(rng.choice(SUBJECT_FORMS), topic),
            "body": body,
            "date": day,
            "unread": not sent and rng.random() < 0.5,
            "reply_to": None,
        }
    events: dict[str, dict[str, Any]] = {}
    booked: set[tuple[str, int]] = set()
    while len(events) < 5:
        date = (today + dt.timedelta(days=rng.randrange(5))).isoformat()
        start = DAY_START + 60 * rng.randrange(8)
        if (date, start) in booked:
            continue
        booked.add((date, start))
        events[f"e{len(events) + 1}"] = {
            "title": fill(rng.choice(EVENT_FORMS), rng.choice(TOPICS)),
            "date": date,
            "start": clock(start),
            "minutes": rng.choice(MEETING_MINUTES),
            "attendees": sorted(rng.sample(people, rng.randint(1, 2))),
        }
    tasks: dict[str, dict[str, Any]] = {}
    for i in range(5):
        tasks[f"t{i + 1}"] = {
            "title": fill(rng.choice(TASK_FORMS), rng.choice(TOPICS)),
            "assignee": rng.choice([owner["email"], *colleagues]),
            "status": rng.choice(STATUSES),
            "due": (today + dt.timedelta(days=rng.randint(1, 14))).isoformat(),
            "project": rng.choice(PROJECTS),
        }
    return {
        "owner": owner,
        "today": today.isoformat(),
        "Mail": {"messages": messages, "next_id": len(messages) + 1},
        "Calendar": {"events": events, "next_id": len(events) + 1},
        "Contacts": {"contacts": contacts, "next_id": len(contacts) + 1},
        "Tasks": {"tasks": tasks, "next_id": len(tasks) + 1},
    }
