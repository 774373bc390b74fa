"""A minimal client for any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, hosted APIs).

Used by the LLM synthesizer (tasks/synthesis/llm_synthesis.py) and the LLM judge (tasks/synthesis/judge.py). It posts
to ``{base_url}/chat/completions`` with httpx and returns the reply text. The API key is read from
the environment variable the configuration names, never from the configuration itself.

Errors split the way the pipeline retries them: a lost or failing server (connection error,
timeout, 5xx) raises InfrastructureError, which Prefect retries; a request the server refuses
(4xx, e.g. a prompt longer than the model's context) raises LLMRequestError, which callers turn
into a rejection with its reason so the round goes on. Try it against a running server:

    .venv/bin/python -c "from tasks.synthesis.llm_client import ChatClient; \
        print(ChatClient('http://127.0.0.1:8000/v1', 'MODEL').complete([{'role': 'user', 'content': 'hi'}]))"
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from coevolve.config import SynthesisConfig
from coevolve.errors import InfrastructureError, PipelineError


class LLMRequestError(PipelineError):
    """Raised when the endpoint refuses a request (4xx) or answers without a message."""


@dataclass
class ChatClient:
    """Chat completions on one endpoint and model."""

    base_url: str
    model: str
    api_key: str | None = None
    temperature: float = 0.7
    max_tokens: int = 384
    timeout_s: float = 120.0

    @classmethod
    def from_config(cls, config: SynthesisConfig) -> ChatClient:
        return cls(
            base_url=config.llm_base_url,
            model=config.llm_model,
            api_key=os.environ.get(config.llm_api_key_env) or None,
            temperature=config.llm_temperature,
            max_tokens=config.llm_max_tokens,
            timeout_s=config.llm_timeout_s,
        )

    def complete(
        self, messages: list[dict[str, str]], temperature: float | None = None, seed: int | None = None
    ) -> str:
        """The assistant's reply text to ``messages``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature if temperature is None else temperature,
            "max_tokens": self.max_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.base_url.rstrip("/") + "/chat/completions"
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"LLM endpoint {url} unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise InfrastructureError(
                f"LLM endpoint {url} failed with HTTP {response.status_code}: {response.text[:300]}"
            )
        if response.status_code >= 400:
            raise LLMRequestError(
                f"LLM endpoint refused the request (HTTP {response.status_code}): {response.text[:300]}"
            )
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMRequestError(f"LLM reply has no message: {response.text[:300]}") from exc
        return content if isinstance(content, str) else ""
