"""The small word lists a workplace is composed from: people, companies, roles, topics and phrases.

Written for this package (no data set): a world draws its people, mail, meetings and tasks from these lists
with a seeded generator, and exploration draws new values (subjects, bodies, titles) from the same lists.
"""

from __future__ import annotations

FIRST_NAMES: tuple[str, ...] = (
    "Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Leo", "Maya",
    "Nils", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Yara", "Zoe",
)  # fmt: skip
LAST_NAMES: tuple[str, ...] = (
    "Adler", "Brooks", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Hart", "Ibsen", "Jensen", "Kowal", "Lopez",
    "Moreau", "Novak", "Olsen", "Patel", "Quist", "Reyes", "Silva", "Tanaka", "Ueda", "Vogel", "Weber", "Young",
)  # fmt: skip
# Invented company names; the mail domain is the name in lower case without spaces, then ".com".
COMPANIES: tuple[str, ...] = (
    "Northwind", "Brightline", "Cobalt Labs", "Driftwood", "Evergreen", "Foxglove", "Granite Works", "Harbor Point",
    "Ironbark", "Juniper", "Kestrel", "Lumen", "Meridian", "Nimbus",
)  # fmt: skip
ROLES: tuple[str, ...] = (
    "sales manager", "engineer", "designer", "accountant", "product manager", "recruiter", "lawyer", "analyst",
    "support lead", "buyer",
)  # fmt: skip
TOPICS: tuple[str, ...] = (
    "budget", "roadmap", "contract", "hiring plan", "launch", "invoice", "offsite", "security review",
    "quarterly report", "design review", "pricing", "onboarding",
)  # fmt: skip
# New colleagues a workflow adds (names no generated world uses).
NEW_FIRST_NAMES: tuple[str, ...] = ("Alex", "Robin", "Sasha", "Jamie")
NEW_LAST_NAMES: tuple[str, ...] = ("Moss", "Lind", "Kerr", "Rowe")
PROJECTS: tuple[str, ...] = ("Apollo", "Atlas", "Beacon", "Comet", "Delta")
WEEKDAYS: tuple[str, ...] = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# Subjects, meeting titles and task titles: a form with one {topic}.
SUBJECT_FORMS: tuple[str, ...] = (
    "{Topic} update", "Question about the {topic}", "{Topic} next steps", "Draft {topic}", "{Topic} numbers",
)  # fmt: skip
EVENT_FORMS: tuple[str, ...] = ("{Topic} sync", "{Topic} review", "{Topic} kickoff", "{Topic} planning")
TASK_FORMS: tuple[str, ...] = (
    "Prepare the {topic}", "Review the {topic}", "Send the {topic}", "Update the {topic}", "Check the {topic}",
)  # fmt: skip
# Sentences of mail bodies: a form with an optional {topic} and {day}.
BODY_SENTENCES: tuple[str, ...] = (
    "Could you look at the {topic} before {day}?",
    "The {topic} is ready for review.",
    "Can we meet this week to discuss the {topic}?",
    "I have attached the latest {topic}.",
    "Please send me your comments on the {topic}.",
    "The {topic} moved to {day}.",
    "Let me know if you have questions.",
    "Thanks for the quick reply.",
)
# Short bodies for mail and replies written during exploration.
REPLIES: tuple[str, ...] = (
    "Thanks, I will take a look.",
    "Sounds good to me.",
    "I added this to my tasks.",
    "Let us discuss it on {day}.",
    "Done, see the update.",
    "Can you send more details?",
)
STATUSES: tuple[str, ...] = ("todo", "in_progress", "done")
FOLDERS: tuple[str, ...] = ("inbox", "sent", "archive", "trash")
MEETING_MINUTES: tuple[int, ...] = (15, 30, 45, 60)
