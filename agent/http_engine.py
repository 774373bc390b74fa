"""Generation through an OpenAI-compatible completions server (vLLM's), with behaviour logprobs.

Rollouts can run on a remote vLLM server while the pipeline runs elsewhere. The engine keeps the
same contract as `agent.engine.TransformersEngine`: token-id prompts in, one `Generation` per prompt
out (sampled token ids, the EOS included when it stopped, their logprobs, "stop" or "length").
Tokens never travel as text: prompts go as token-id lists and the server returns every sampled
token as ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``), so the ids that GRPO trains on
are exactly the ids the server sampled, with no re-tokenization.

Behaviour logprobs must be those of the sampling distribution (after temperature), like the
transformers engine's: start vLLM with ``--logprobs-mode processed_logprobs``. Greedy requests
(temperature 0) then get the untempered logprobs, also like the transformers engine.

Requests run concurrently (one prompt each, so the server's continuous batching sees all of them);
transport failures, timeouts and 5xx answers are retried with backoff and end in
`coevolve.errors.InfrastructureError`, which the Prefect rollout task retries.

Usage::

    engine = OpenAICompatibleEngine("http://127.0.0.1:8000/v1", "/path/to/checkpoint")
    engine.generate([engine.chat.prompt_ids(messages)], temperature=0.9, max_new_tokens=96)
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from coevolve.errors import InfrastructureError

from agent.chat import ChatFormat
from agent.engine import Generation

# Answers worth another try: the server is busy or restarting, or a proxy in front of it failed.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
TOKEN_ID_PREFIX = "token_id:"


def parse_token_id(token: str) -> int:
    """The id in vLLM's ``token_id:<id>`` token form."""
    if not token.startswith(TOKEN_ID_PREFIX):
        raise InfrastructureError(
            f"The server returned the token {token!r} as text; it must support return_tokens_as_token_ids (vLLM does)."
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


class OpenAICompatibleEngine:
    """Batched sampling from an OpenAI-compatible completions endpoint, with per-token logprobs."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        tokenizer_path: str | Path | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        concurrency: int = 32,
        seed: int | None = None,
    ) -> None:
        import httpx
        from transformers import AutoTokenizer

        self.base_url = base_url.rstrip("/")
        self.model_name = model
        self.max_retries = max_retries
        self.concurrency = concurrency
        # A per-request seed makes a run repeatable; each request gets its own so that the n samples
        # of one task (identical prompts) still differ.
        self._seeds = itertools.count(seed) if seed is not None else None
        self._seed_lock = threading.Lock()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        # The tokenizer renders prompts and decodes replies here; the server only sees token ids.
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or model))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.chat = ChatFormat(self.tokenizer)
        self.model_path = tokenizer_path or model

    # --- server information -----------------------------------------------------------------------
    def served_models(self) -> list[dict[str, Any]]:
        """The server's ``/models`` entries (vLLM's carry ``max_model_len``)."""
        return list(self._request("GET", "/models").get("data", []))

    @property
    def max_context_tokens(self) -> int | None:
        """The served model's context length, when the server reports it."""
        for entry in self.served_models():
            if entry.get("id") == self.model_name:
                return entry.get("max_model_len")
        return None

    def close(self) -> None:
        self._client.close()

    # --- generation ---------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], temperature: float, max_new_tokens: int) -> list[Generation]:
        """Continue every prompt until EOS or max_new_tokens; one Generation per prompt, in order."""
        if not prompts:
            return []
        if any(not p for p in prompts):
            raise ValueError("Every prompt needs at least one token.")
        if len(prompts) == 1:
            return [self._complete(prompts[0], temperature, max_new_tokens)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda p: self._complete(p, temperature, max_new_tokens), prompts))

    def _next_seed(self) -> int | None:
        if self._seeds is None:
            return None
        with self._seed_lock:
            return next(self._seeds)

    def _complete(self, prompt: list[int], temperature: float, max_new_tokens: int) -> Generation:
        eos = self.chat.eos_token_id
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": list(prompt),
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "logprobs": 0,  # the sampled token's own logprob, no alternatives
            "return_tokens_as_token_ids": True,
            # The chat format's end-of-message token ends a message even where the model's
            # generation config names another EOS.
            "stop_token_ids": [eos],
            "skip_special_tokens": False,
        }
        seed = self._next_seed()
        if seed is not None:
            body["seed"] = seed
        answer = self._request("POST", "/completions", body)
        try:
            choice = answer["choices"][0]
            tokens = [parse_token_id(t) for t in choice["logprobs"]["tokens"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError) as exc:
            raise InfrastructureError(f"Unexpected completions answer from {self.base_url}: {str(answer)[:300]}") from exc
        if len(tokens) != len(logprobs):
            raise InfrastructureError(f"The server returned {len(tokens)} tokens but {len(logprobs)} logprobs.")
        stopped = bool(tokens) and tokens[-1] == eos
        if finish == "stop" and not stopped:
            # Servers that drop the stop token from the output: put it back, the policy did sample it.
            # Its logprob is unknown here, so count it as certain (it is masked the same way as others).
            tokens.append(eos)
            logprobs.append(0.0)
            stopped = True
        return Generation(token_ids=tokens, logprobs=logprobs, finish_reason="stop" if stopped else "length")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            try:
                response = self._client.request(method, path, json=body)
            except httpx.HTTPError as exc:  # connection refused, reset, timeout
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in RETRYABLE_STATUS:
                last_error = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code in (400, 422):
                raise ValueError(f"The server rejected the request ({response.status_code}): {response.text[:500]}")
            if response.status_code >= 400:
                raise InfrastructureError(
                    f"{method} {self.base_url}{path} answered {response.status_code}: {response.text[:300]}. "
                    "Check rollout.base_url, the served model name and the API key."
                )
            return response.json()
        raise InfrastructureError(
            f"{method} {self.base_url}{path} failed after {self.max_retries + 1} attempts; last error: {last_error}"
        )
