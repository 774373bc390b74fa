"""Shared fixtures of the policy tests: a handful of short demonstrations and a tiny policy trained on them."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agent.tiny import build_tiny_policy
from agent.transformers_engine import TransformersEngine
from coevolve.config import PolicyConfig
from coevolve.records import Message

SYSTEM = "Tools: mkdir(dir_name), cd(folder), touch(file_name). Reply with calls in brackets, or done."

# (request, calls) pairs; each becomes one full conversation.
EXCHANGES = [
    ("make a folder temp and enter it", "[mkdir(dir_name='temp'), cd(folder='temp')]"),
    ("create the file notes.txt", "[touch(file_name='notes.txt')]"),
    ("go into the docs folder", "[cd(folder='docs')]"),
    ("make a folder logs", "[mkdir(dir_name='logs')]"),
]


def conversation(request: str, calls: str) -> list[Message]:
    return [
        Message("system", SYSTEM),
        Message("user", request),
        Message("assistant", calls),
        Message("tool", "ok"),
        Message("assistant", "done"),
    ]


@pytest.fixture(scope="session")
def demos() -> list[list[Message]]:
    return [conversation(request, calls) for request, calls in EXCHANGES]


@pytest.fixture(scope="session")
def tiny_config() -> PolicyConfig:
    return PolicyConfig(
        sft_steps=150, sft_learning_rate=3e-3, sft_batch_size=4, hidden_size=64, num_layers=2, vocab_size=320
    )


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, demos: list[list[Message]], tiny_config: PolicyConfig) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("policy") / "tiny", demos, tiny_config, seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def engine(tiny_dir):
    """The tiny policy in the transformers engine (per module: the engine's own generator is state)."""
    return TransformersEngine(tiny_dir, torch_threads=1, seed=0)


@pytest.fixture(scope="module")
def prompts(engine, demos):
    return [engine.chat.prompt_ids(conv[:2]) for conv in demos]
