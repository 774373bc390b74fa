"""Argument values for exploration, read from the live state of the API instances or from small pools.

A purely random walk over BFCL tools mostly produces errors (unknown files, missing logins); filling
arguments from what the state holds right now keeps most exploration calls valid.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

WORDS = ["alpha", "beta", "notes", "draft", "summary", "budget", "report", "plan", "ideas", "log"]
NEW_DIRS = ["temp", "backup", "archive_2024", "projects", "drafts", "reports_old", "shared"]
NEW_FILES = ["notes.txt", "todo.md", "summary.txt", "plan.csv", "ideas.txt", "log_2024.txt", "readme.md"]
SENTENCES = [
    "Meeting moved to Friday",
    "Budget approved",
    "Remember to back up the data",
    "Draft ready for review",
    "Quarterly numbers look good",
    "Call the supplier tomorrow",
]
TAGS = ["#update", "#news", "#work", "#data", "#team"]
PEOPLE = ["alice", "bob", "carol", "dave", "erin"]
NEW_CONTACTS = ["Frank", "Grace", "Heidi", "Ivan", "Judy"]
TITLES = ["Login page broken", "Printer offline", "Slow network", "Update request", "Access needed"]
RESOLUTIONS = ["Restarted the service", "Replaced the cable", "Granted access", "Fixed in the last release"]
SI_UNITS = ["km", "m", "cm", "mm"]
IMPERIAL_PAIRS = [
    ("cm", "in"),
    ("in", "cm"),
    ("m", "ft"),
    ("ft", "m"),
    ("km", "miles"),
    ("miles", "km"),
    ("kg", "lb"),
    ("lb", "kg"),
]

# Tools that fail without a login, and the class whose login they need.
NEEDS_LOGIN: dict[str, str] = {
    **dict.fromkeys(
        ["post_tweet", "retweet", "comment", "follow_user", "list_all_following", "unfollow_user"], "TwitterAPI"
    ),
    **dict.fromkeys(["create_ticket", "get_user_tickets"], "TicketAPI"),
    **dict.fromkeys(
        ["send_message", "delete_message", "view_messages_sent", "search_messages", "get_message_stats"], "MessageAPI"
    ),
}

Generator = Callable[[dict[str, Any], random.Random], Any]


def _fs(inst: dict[str, Any]) -> Any:
    return inst["GorillaFileSystem"]


def _entries(inst: dict[str, Any], kind: str | None = None) -> list[str]:
    contents = _fs(inst)._current_dir.contents
    names = []
    for name, item in contents.items():
        is_dir = type(item).__name__ == "Directory"
        if kind is None or (kind == "dir") == is_dir:
            names.append(name)
    return sorted(names)


def _sorted(values) -> list:
    """A deterministic order for values of mixed types (scenario files mix int and str ids)."""
    return sorted(values, key=lambda v: (type(v).__name__, str(v)))


def _pick(rng: random.Random, values: list[Any], fallback: list[Any]) -> Any:
    return rng.choice(values) if values else rng.choice(fallback)


def _file(inst: dict[str, Any], rng: random.Random) -> str:
    return _pick(rng, _entries(inst, "file"), NEW_FILES)


def _dir(inst: dict[str, Any], rng: random.Random) -> str:
    return _pick(rng, _entries(inst, "dir"), NEW_DIRS)


def _word_from_file(inst: dict[str, Any], rng: random.Random) -> str:
    files = _entries(inst, "file")
    if files:
        words = _fs(inst)._current_dir.contents[rng.choice(files)].content.split()
        if words:
            return rng.choice(words[:30]).strip(".,!?")
    return rng.choice(WORDS)


def _cd_target(inst: dict[str, Any], rng: random.Random) -> str:
    dirs = _entries(inst, "dir")
    if _fs(inst)._current_dir.parent is not None and (not dirs or rng.random() < 0.25):
        return ".."
    return _pick(rng, dirs, NEW_DIRS)


def _tweet_ids(inst: dict[str, Any]) -> list[int]:
    return sorted(int(k) for k in inst["TwitterAPI"].tweets)


def _tweet_id(inst: dict[str, Any], rng: random.Random) -> int:
    return _pick(rng, _tweet_ids(inst), [0])


def _tweet_user(inst: dict[str, Any], rng: random.Random) -> str:
    users = _sorted({t["username"] for t in inst["TwitterAPI"].tweets.values()})
    return _pick(rng, users, PEOPLE)


def _tweet_word(inst: dict[str, Any], rng: random.Random) -> str:
    words = [w.strip(".,!?#") for t in inst["TwitterAPI"].tweets.values() for w in t["content"].split()]
    words = [w for w in words if len(w) > 3]
    return _pick(rng, _sorted(set(words)), WORDS)


def _ticket_id(inst: dict[str, Any], rng: random.Random) -> int:
    return _pick(rng, _sorted(t["id"] for t in inst["TicketAPI"].ticket_queue), [1])


def _message_user_id(inst: dict[str, Any], rng: random.Random) -> str:
    return _pick(rng, _sorted(inst["MessageAPI"].user_map.values()), ["USR001"])


def _inbox_receiver(inst: dict[str, Any], rng: random.Random) -> str:
    receivers = _sorted({list(m)[0] for m in inst["MessageAPI"].inbox})
    return _pick(rng, receivers, ["USR002"])


def _message_word(inst: dict[str, Any], rng: random.Random) -> str:
    words = [w.strip(".,!?") for m in inst["MessageAPI"].inbox for w in list(m.values())[0].split()]
    return _pick(rng, _sorted({w for w in words if len(w) > 3}), WORDS)


def _numbers(rng: random.Random) -> list[float]:
    return [rng.randint(1, 60) for _ in range(rng.randint(3, 5))]


def _ticket_updates(inst: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    field = rng.choice(["priority", "status", "title"])
    if field == "priority":
        return {"priority": rng.randint(1, 5)}
    if field == "status":
        return {"status": rng.choice(["Open", "In Progress", "Closed"])}
    return {"title": rng.choice(TITLES)}


VALUES: dict[tuple[str, str], Generator] = {
    ("cat", "file_name"): _file,
    ("cd", "folder"): _cd_target,
    ("cp", "source"): _file,
    ("cp", "destination"): lambda i, r: (
        _pick(r, _entries(i, "dir"), NEW_FILES) if r.random() < 0.6 else r.choice(NEW_FILES)
    ),
    ("diff", "file_name1"): _file,
    ("diff", "file_name2"): _file,
    ("du", "human_readable"): lambda i, r: r.random() < 0.5,
    ("echo", "content"): lambda i, r: r.choice(SENTENCES),
    ("echo", "file_name"): _file,
    ("find", "path"): lambda i, r: ".",
    ("find", "name"): lambda i, r: _pick(r, [n[: max(2, len(n) // 2)] for n in _entries(i)], WORDS),
    ("grep", "file_name"): _file,
    ("grep", "pattern"): _word_from_file,
    ("ls", "a"): lambda i, r: r.random() < 0.5,
    ("mkdir", "dir_name"): lambda i, r: r.choice(NEW_DIRS),
    ("mv", "source"): lambda i, r: _pick(r, _entries(i), NEW_FILES),
    ("mv", "destination"): lambda i, r: (
        _pick(r, _entries(i, "dir"), NEW_DIRS) if r.random() < 0.6 else r.choice(NEW_FILES)
    ),
    ("rm", "file_name"): _file,
    ("rmdir", "dir_name"): _dir,
    ("sort", "file_name"): _file,
    ("tail", "file_name"): _file,
    ("tail", "lines"): lambda i, r: r.randint(1, 5),
    ("touch", "file_name"): lambda i, r: r.choice(NEW_FILES),
    ("wc", "file_name"): _file,
    ("wc", "mode"): lambda i, r: r.choice(["l", "w", "c"]),
    ("authenticate_twitter", "username"): lambda i, r: i["TwitterAPI"].username,
    ("authenticate_twitter", "password"): lambda i, r: i["TwitterAPI"].password,
    ("comment", "tweet_id"): _tweet_id,
    ("comment", "comment_content"): lambda i, r: r.choice(SENTENCES),
    ("follow_user", "username_to_follow"): lambda i, r: r.choice(PEOPLE),
    ("get_tweet", "tweet_id"): _tweet_id,
    ("get_tweet_comments", "tweet_id"): _tweet_id,
    ("get_user_stats", "username"): _tweet_user,
    ("get_user_tweets", "username"): _tweet_user,
    ("mention", "tweet_id"): _tweet_id,
    ("mention", "mentioned_usernames"): lambda i, r: r.sample(PEOPLE, r.randint(1, 2)),
    ("post_tweet", "content"): lambda i, r: r.choice(SENTENCES),
    ("post_tweet", "tags"): lambda i, r: r.sample(TAGS, r.randint(1, 2)),
    ("post_tweet", "mentions"): lambda i, r: r.sample(PEOPLE, 1),
    ("retweet", "tweet_id"): _tweet_id,
    ("search_tweets", "keyword"): _tweet_word,
    ("unfollow_user", "username_to_unfollow"): lambda i, r: _pick(r, list(i["TwitterAPI"].following_list), PEOPLE),
    ("close_ticket", "ticket_id"): _ticket_id,
    ("create_ticket", "title"): lambda i, r: r.choice(TITLES),
    ("create_ticket", "description"): lambda i, r: r.choice(SENTENCES),
    ("create_ticket", "priority"): lambda i, r: r.randint(1, 5),
    ("edit_ticket", "ticket_id"): _ticket_id,
    ("edit_ticket", "updates"): _ticket_updates,
    ("get_ticket", "ticket_id"): _ticket_id,
    ("get_user_tickets", "status"): lambda i, r: r.choice(["Open", "Closed"]),
    ("resolve_ticket", "ticket_id"): _ticket_id,
    ("resolve_ticket", "resolution"): lambda i, r: r.choice(RESOLUTIONS),
    ("ticket_login", "username"): lambda i, r: r.choice(PEOPLE),
    ("ticket_login", "password"): lambda i, r: "pass" + str(r.randint(100, 999)),
    ("add_contact", "user_name"): lambda i, r: r.choice(NEW_CONTACTS),
    ("delete_message", "receiver_id"): _inbox_receiver,
    ("get_user_id", "user"): lambda i, r: _pick(r, _sorted(i["MessageAPI"].user_map), NEW_CONTACTS),
    ("message_login", "user_id"): _message_user_id,
    ("search_messages", "keyword"): _message_word,
    ("send_message", "receiver_id"): _message_user_id,
    ("send_message", "message"): lambda i, r: r.choice(SENTENCES),
    ("divide", "b"): lambda i, r: r.randint(1, 12),
    ("logarithm", "value"): lambda i, r: r.randint(2, 1000),
    ("logarithm", "base"): lambda i, r: r.choice([2, 10]),
    ("logarithm", "precision"): lambda i, r: r.randint(2, 6),
    ("square_root", "number"): lambda i, r: r.randint(1, 400),
    ("square_root", "precision"): lambda i, r: r.randint(2, 6),
    ("power", "exponent"): lambda i, r: r.randint(0, 4),
    ("round_number", "number"): lambda i, r: round(r.uniform(0, 100), 3),
    ("round_number", "decimal_places"): lambda i, r: r.randint(0, 2),
    ("si_unit_conversion", "unit_in"): lambda i, r: r.choice(SI_UNITS),
    ("si_unit_conversion", "unit_out"): lambda i, r: r.choice(SI_UNITS),
    ("imperial_si_conversion", "unit_in"): lambda i, r: r.choice(IMPERIAL_PAIRS)[0],
}

_TYPE_POOLS: dict[str, Generator] = {
    "string": lambda i, r: r.choice(WORDS),
    "integer": lambda i, r: r.randint(1, 20),
    "float": lambda i, r: float(r.randint(1, 100)),
    "boolean": lambda i, r: r.random() < 0.5,
    "array": lambda i, r: _numbers(r),
    "dict": lambda i, r: {},
}


def argument_value(
    tool: str, param: str, ptype: str, instances: dict[str, Any], rng: random.Random, chosen: dict[str, Any]
) -> Any:
    """A value for one parameter: live state first, then a pool for the parameter's type."""
    if tool == "imperial_si_conversion" and param == "unit_out":
        unit_in = chosen.get("unit_in")
        outs = [b for a, b in IMPERIAL_PAIRS if a == unit_in]
        return rng.choice(outs) if outs else "cm"
    generator = VALUES.get((tool, param))
    if generator is not None:
        try:
            return generator(instances, rng)
        except (KeyError, AttributeError, IndexError, ValueError):
            pass  # the class is not involved or its state lacks the field: use the type pool
    if tool in {"max_value", "mean", "min_value", "standard_deviation", "sum_values"}:
        return _numbers(rng)
    return _TYPE_POOLS.get(ptype, _TYPE_POOLS["string"])(instances, rng)


def login_call(class_name: str, instances: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The login a tool of ``class_name`` needs first, or None when already logged in."""
    instance = instances.get(class_name)
    if instance is None:
        return None
    if class_name == "TwitterAPI" and not instance.authenticated:
        return "authenticate_twitter", {"username": instance.username, "password": instance.password}
    if class_name == "TicketAPI" and not instance.current_user:
        return "ticket_login", {"username": "alice", "password": "pass123"}
    if class_name == "MessageAPI" and not instance.current_user:
        users = _sorted(instance.user_map.values())
        return ("message_login", {"user_id": users[0]}) if users else None
    return None
