"""Shared fixtures for the environment tests: small tasks built in code."""

from __future__ import annotations

import pytest

from coevolve.records import Provenance, Task, ToolCall

FS_CONFIG = {
    "GorillaFileSystem": {
        "root": {
            "alex": {
                "type": "directory",
                "contents": {
                    "notes.txt": {"type": "file", "content": "alpha beta\ngamma"},
                    "docs": {"type": "directory", "contents": {}},
                },
            }
        }
    }
}
TWITTER_CONFIG = {
    "TwitterAPI": {
        "username": "alex",
        "password": "pw1",
        "authenticated": True,
        "tweets": {},
        "tweet_counter": 0,
        "following_list": [],
    }
}


def _make_task(turns: list[str], reference: list[list[ToolCall]], config: dict | None = None, classes=None) -> Task:
    return Task(
        environment="bfcl",
        initial_config=config if config is not None else FS_CONFIG,
        involved_classes=classes or ["GorillaFileSystem"],
        turns=turns,
        reference=reference,
        provenance=Provenance(origin="seed"),
    )


@pytest.fixture
def make_task():
    """Factory: make_task(turns, reference, config=None, classes=None) -> Task."""
    return _make_task


@pytest.fixture
def twitter_config() -> dict:
    return TWITTER_CONFIG


@pytest.fixture
def fs_task() -> Task:
    """Two turns: create a folder and move the file into it, then read the file there."""
    return _make_task(
        ["Create 'temp' and move notes.txt into it.", "Show notes.txt from temp."],
        [
            [ToolCall("mkdir", {"dir_name": "temp"}), ToolCall("mv", {"source": "notes.txt", "destination": "temp"})],
            [ToolCall("cd", {"folder": "temp"}), ToolCall("cat", {"file_name": "notes.txt"})],
        ],
    )
