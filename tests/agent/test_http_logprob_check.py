"""The OpenAI engine checks its server's behaviour logprobs once, against a local forward pass of the checkpoint.

A server started without ``--logprobs-mode processed_logprobs`` returns logprobs before temperature;
GRPO would silently take its importance ratios against them. A second real server, started that
way, shows the check stopping the engine with the flag to set. The served policy is confident on
its prompts, so the servers sample at temperature 1.5, where tempered and untempered logprobs of
its samples differ by about half a nat per token.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest

from agent.http_engine import (
    LOGPROB_TOLERANCE,
    LOGPROBS_FLAG,
    OpenAICompatibleEngine,
    local_logprobs,
    logprob_difference,
    read_completion,
)
from agent.transformers_engine import TransformersEngine
from coevolve.errors import ConfigError
from tests.conftest import REPO, _free_port, _stop, _wait_until_ready, vllm_env


@pytest.fixture(scope="module")
def local(served_policy_dir):
    return TransformersEngine(served_policy_dir, torch_threads=1, seed=0)


@pytest.fixture(scope="module")
def prompts(local, served_conversations):
    return [local.chat.prompt_ids(conv[:2]) for conv in served_conversations]


@pytest.fixture(scope="module")
def untempered_server(vllm_python, served_policy_dir, tmp_path_factory):
    """The served policy on a second server started without --logprobs-mode: logprobs before temperature."""
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_path = tmp_path_factory.mktemp("vllm-untempered") / "server.log"
    command = [
        str(vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(served_policy_dir), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--seed", "0",
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096",
    ]  # fmt: skip
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=vllm_env(), cwd=REPO, start_new_session=True
        )
    try:
        _wait_until_ready(process, base_url, log_path)
        yield base_url
    finally:
        _stop(process)


def test_a_server_with_processed_logprobs_passes_the_check(openai_server, prompts):
    engine = OpenAICompatibleEngine(openai_server.base_url, openai_server.model, max_retries=1, timeout_s=60)
    engine.generate(prompts, temperature=1.5, max_new_tokens=16, seeds=[1, 2, 3, 4])
    assert engine.logprob_check == "passed"


def test_a_server_returning_untempered_logprobs_fails_with_the_flag_to_set(
    untempered_server, served_policy_dir, prompts
):
    engine = OpenAICompatibleEngine(untempered_server, str(served_policy_dir), max_retries=1, timeout_s=60)
    with pytest.raises(ConfigError, match=LOGPROBS_FLAG):
        engine.generate(prompts, temperature=1.5, max_new_tokens=16, seeds=[1, 2, 3, 4])


def test_greedy_requests_leave_the_check_for_the_first_sampled_batch(untempered_server, served_policy_dir, prompts):
    engine = OpenAICompatibleEngine(untempered_server, str(served_policy_dir), max_retries=1, timeout_s=60)
    engine.generate(prompts, temperature=0.0, max_new_tokens=8)
    assert engine.logprob_check == "pending"


def test_without_the_checkpoint_on_this_machine_the_check_is_skipped_with_a_warning(
    openai_server, prompts, tmp_path, caplog
):
    # A folder with the tokenizer only, as when the server holds weights this machine does not have.
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (openai_server.model_dir / name).exists():
            shutil.copy(openai_server.model_dir / name, tmp_path / name)
    engine = OpenAICompatibleEngine(openai_server.base_url, openai_server.model, tokenizer_path=tmp_path, max_retries=1)
    with caplog.at_level(logging.WARNING, logger="agent.http_engine"):
        engine.generate(prompts[:1], temperature=0.7, max_new_tokens=8)
    assert engine.logprob_check == "skipped"
    assert LOGPROBS_FLAG in caplog.text


def test_untempered_logprobs_differ_from_tempered_ones_beyond_the_tolerance(local, prompts):
    completions = [g.token_ids for g in local.generate(prompts, temperature=1.5, max_new_tokens=16, seeds=[5, 6, 7, 8])]
    tempered = local_logprobs(local.model, prompts, completions, temperature=1.5)
    assert logprob_difference(local_logprobs(local.model, prompts, completions, temperature=1.5), tempered) < 1e-6
    assert (
        logprob_difference(local_logprobs(local.model, prompts, completions, temperature=1.0), tempered)
        > LOGPROB_TOLERANCE
    )


def test_a_stopped_message_without_its_end_token_is_an_error():
    # A completions answer in vLLM's shape that says "stop" but lacks the end-of-message token 1.
    answer = {
        "choices": [
            {
                "finish_reason": "stop",
                "stop_reason": 1,
                "logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.1, -0.2]},
            }
        ]
    }
    with pytest.raises(ConfigError, match="end-of-message token 1"):
        read_completion(answer, eos=1, base_url="http://server/v1")


def test_a_stopped_message_keeps_the_end_token_the_server_returned():
    answer = {
        "choices": [
            {
                "finish_reason": "stop",
                "logprobs": {"tokens": ["token_id:7", "token_id:1"], "token_logprobs": [-0.1, -0.3]},
            }
        ]
    }
    generation = read_completion(answer, eos=1, base_url="http://server/v1")
    assert generation.token_ids == [7, 1] and generation.logprobs == [-0.1, -0.3] and generation.finish_reason == "stop"
