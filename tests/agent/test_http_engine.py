"""The OpenAI-compatible engine against a real vLLM server: same contract and same tokens as the transformers engine."""

from __future__ import annotations

import math
import socket

import pytest
import torch

from agent.http_engine import OpenAICompatibleEngine, parse_token_id
from agent.transformers_engine import TransformersEngine
from coevolve.errors import InfrastructureError


@pytest.fixture(scope="module")
def remote(openai_server):
    engine = OpenAICompatibleEngine(openai_server.base_url, openai_server.model, max_retries=1, timeout_s=60)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def local(served_policy_dir):
    return TransformersEngine(served_policy_dir, torch_threads=1, seed=0)


@pytest.fixture(scope="module")
def prompts(local, served_conversations):
    return [local.chat.prompt_ids(conv[:2]) for conv in served_conversations]


def test_greedy_tokens_and_logprobs_match_the_transformers_engine(remote, local, prompts):
    served = remote.generate(prompts, temperature=0.0, max_new_tokens=30)
    reference = local.generate(prompts, temperature=0.0, max_new_tokens=30)
    assert [g.token_ids for g in served] == [g.token_ids for g in reference]
    for s, r in zip(served, reference, strict=True):
        assert s.finish_reason == r.finish_reason
        assert s.logprobs == pytest.approx(r.logprobs, abs=1e-3)


def test_every_sampled_token_has_one_finite_logprob(remote, prompts):
    for generation in remote.generate(prompts * 2, temperature=1.0, max_new_tokens=12):
        assert len(generation.logprobs) == len(generation.token_ids) > 0
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in generation.logprobs)


def test_stops_with_eos_included_or_reports_length(remote, prompts):
    finished = remote.generate(prompts, temperature=0.0, max_new_tokens=40)
    assert all(g.finish_reason == "stop" and g.token_ids[-1] == remote.chat.eos_token_id for g in finished)
    cut = remote.generate(prompts, temperature=0.0, max_new_tokens=2)
    assert all(g.finish_reason == "length" and len(g.token_ids) == 2 for g in cut)


def test_sampled_logprobs_are_those_of_the_tempered_distribution(remote, local, prompts):
    temperature = 0.7
    generation = remote.generate([prompts[1]], temperature=temperature, max_new_tokens=10)[0]
    ids = torch.tensor([prompts[1] + generation.token_ids])
    with torch.inference_mode():
        logits = local.model(input_ids=ids).logits[0, len(prompts[1]) - 1 : -1] / temperature
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(expected, torch.tensor(generation.logprobs), atol=1e-3)


def test_reports_the_served_context_length(remote):
    assert remote.max_context_tokens == 2048


def test_an_unknown_model_name_fails_as_infrastructure(openai_server):
    engine = OpenAICompatibleEngine(
        openai_server.base_url, "no-such-model", tokenizer_path=openai_server.model_dir, max_retries=0
    )
    with pytest.raises(InfrastructureError, match="no-such-model|404"):
        engine.generate([[1, 2, 3]], temperature=0.0, max_new_tokens=2)


def test_an_unreachable_server_fails_as_infrastructure_after_retries(served_policy_dir):
    with socket.socket() as sock:  # a port nobody listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = OpenAICompatibleEngine(
        f"http://127.0.0.1:{port}/v1", "m", tokenizer_path=served_policy_dir, max_retries=1, timeout_s=2
    )
    with pytest.raises(InfrastructureError, match="2 attempts"):
        engine.generate([[1, 2]], temperature=0.0, max_new_tokens=2)


def test_token_ids_are_read_from_the_token_id_form():
    assert parse_token_id("token_id:42") == 42
    with pytest.raises(InfrastructureError, match="return_tokens_as_token_ids"):
        parse_token_id("hello")


def test_empty_batch_gives_no_generations(served_policy_dir):
    engine = OpenAICompatibleEngine("http://127.0.0.1:9/v1", "m", tokenizer_path=served_policy_dir)
    assert engine.generate([], temperature=0.0, max_new_tokens=4) == []
