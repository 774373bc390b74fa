"""Hand-made demonstrations in the explorer's shape, for the policy tests and the SFT measurement.

Each conversation: a system message listing tools, a user request, one assistant message with the
calls, the tool results, and a final assistant ``done``.
"""

from __future__ import annotations

import random

from coevolve.records import Message, ToolCall

TOOLS = {
    "mkdir": ("dir_name", "Create a new directory in the current directory."),
    "cd": ("folder", "Change the current directory."),
    "touch": ("file_name", "Create an empty file."),
    "cat": ("file_name", "Show the content of a file."),
    "rm": ("file_name", "Remove a file or directory."),
    "ls": (None, "List the current directory."),
    "pwd": (None, "Print the current directory."),
    "wc": ("file_name", "Count the lines of a file."),
}
WORDS = ["temp", "notes", "data", "report", "logs", "draft", "music", "photos", "budget", "todo", "src", "docs"]
PLANS = [
    (("mkdir", "cd"), "Create a folder named {0} and move into it."),
    (("touch", "cat"), "Make an empty file {0}.txt and show what it holds."),
    (("mkdir",), "I need a new directory called {0}."),
    (("touch", "wc"), "Create {0}.txt, then count its lines."),
    (("cd", "ls"), "Go into {0} and list what is there."),
    (("rm",), "Delete {0}.txt please."),
    (("cd", "pwd"), "Switch to the {0} folder and tell me where I am."),
]


def system_message() -> Message:
    lines = ["You act by calling tools. Reply with calls like [name(arg='value')], or done when finished.", "Tools:"]
    for name, (arg, doc) in TOOLS.items():
        lines.append(f"- {name}({arg + ': str' if arg else ''}): {doc}")
    return Message("system", "\n".join(lines))


def _call(name: str, word: str) -> ToolCall:
    arg = TOOLS[name][0]
    if arg is None:
        return ToolCall(name)
    value = word + ".txt" if arg == "file_name" else word
    return ToolCall(name, {arg: value})


def demonstration(rng: random.Random) -> list[Message]:
    names, phrase = rng.choice(PLANS)
    word = rng.choice(WORDS) + (str(rng.randint(1, 99)) if rng.random() < 0.5 else "")
    calls = [_call(n, word) for n in names]
    return [
        system_message(),
        Message("user", phrase.format(word)),
        Message("assistant", "[" + ", ".join(c.render() for c in calls) + "]"),
        Message("tool", "\n".join(f"{c.name}: ok" for c in calls)),
        Message("assistant", "done"),
    ]


def synthetic_demonstrations(n: int, seed: int = 0) -> list[list[Message]]:
    rng = random.Random(seed)
    return [demonstration(rng) for _ in range(n)]
