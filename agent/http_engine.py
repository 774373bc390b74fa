"""Generation through an OpenAI-compatible completions server (vLLM's), with behaviour logprobs.

Rollouts can run on a remote vLLM server while the pipeline runs elsewhere. The engine keeps the
same contract as `agent.transformers_engine.TransformersEngine`: token-id prompts in, one `Generation` per prompt
out (sampled token ids, the EOS included when it stopped, their logprobs, "stop" or "length").
Tokens never travel as text: prompts go as token-id lists and the server returns every sampled
token as ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``), so the ids that GRPO trains on
are exactly the ids the server sampled, with no re-tokenization.

Behaviour logprobs must be those of the sampling distribution (after temperature), like the
transformers engine's: start vLLM with ``--logprobs-mode processed_logprobs``. Greedy requests
(temperature 0) then get the untempered logprobs, also like the transformers engine. The engine
checks this once: the first sampled batch's logprobs are compared with a local forward pass of the
same checkpoint at the sampling temperature (`check_logprobs`), and a server that disagrees by more
than ``logprob_tolerance`` (mean absolute difference per token) stops the stage with the flag to
set. Without the checkpoint on this machine the check is skipped with a warning.

Seeds come from the caller, one per prompt (``generate(..., seeds=[...])``), and travel in each
request's body, so which prompt gets which seed never depends on request scheduling. The CPU build
of vLLM crashes on seeded requests whose prefill it splits into chunks ("CPU Generator does not
use offset"): start it with ``--no-enable-chunked-prefill --max-num-batched-tokens N`` (N at least
the context length).

Requests run concurrently (one prompt each, so the server's continuous batching sees all of them)
and spread over a fleet of servers (`agent.fleet`: ``base_url`` may be a list); transport failures,
timeouts and 5xx answers are retried (tenacity) on another healthy server and end in
`coevolve.errors.InfrastructureError`, which the Prefect rollout task retries. The model each
server is asked for is the name it lists for the checkpoint's folder, however the path was
written; `sync_weights` pushes a new round's weights to every server (`agent.weights`).

Usage::

    engine = OpenAICompatibleEngine("http://127.0.0.1:8000/v1", "/path/to/checkpoint")
    engine.generate([engine.chat.prompt_ids(messages)], temperature=0.9, max_new_tokens=96)
"""

from __future__ import annotations

import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import weights
from agent.chat import ChatFormat
from agent.engine import Engine, Generation
from agent.fleet import Fleet
from agent.serve import start_managed
from agent.transformers_engine import load_policy
from coevolve.errors import ConfigError, InfrastructureError
from coevolve.optional import optional_module

if TYPE_CHECKING:
    from coevolve.config import PipelineConfig

torch = optional_module("torch")
transformers = optional_module("transformers")

TOKEN_ID_PREFIX = "token_id:"
# Mean absolute difference per token between served and locally computed logprobs that the check
# accepts. A float32 vLLM server agrees with the local forward pass to within 1e-3 per token; a
# server returning untempered logprobs differs on every token the policy is unsure of (half a nat
# per token on the test policy's samples at temperature 1.5). Where the policy is nearly certain,
# tempered and untempered logprobs agree, and so do the importance ratios GRPO takes.
LOGPROB_TOLERANCE = 0.05
# Generations (and tokens of each) the logprob check compares: enough tokens to see a systematic
# difference, little enough that one local forward pass stays cheap.
LOGPROB_CHECK_SAMPLES = 4
LOGPROB_CHECK_TOKENS = 64
LOGPROBS_FLAG = "--logprobs-mode processed_logprobs"

log = logging.getLogger(__name__)


def parse_token_id(token: str) -> int:
    """The id in vLLM's ``token_id:<id>`` token form."""
    if not token.startswith(TOKEN_ID_PREFIX):
        raise InfrastructureError(
            f"The server returned the token {token!r} as text; it must support return_tokens_as_token_ids (vLLM does)."
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


def read_completion(answer: dict[str, Any], eos: int, base_url: str) -> Generation:
    """The Generation in a completions answer: sampled token ids, their logprobs, "stop" or "length".

    A message that stopped must end with the end-of-message token ``eos`` and its logprob, as vLLM
    returns a token given in stop_token_ids; an answer without it fails, since the policy's last
    token and its behaviour logprob would be unknown.
    """
    try:
        choice = answer["choices"][0]
        tokens = [parse_token_id(t) for t in choice["logprobs"]["tokens"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError) as exc:
        raise InfrastructureError(f"Unexpected completions answer from {base_url}: {str(answer)[:300]}") from exc
    if len(tokens) != len(logprobs):
        raise InfrastructureError(f"The server returned {len(tokens)} tokens but {len(logprobs)} logprobs.")
    stopped = bool(tokens) and tokens[-1] == eos
    if finish == "stop" and not stopped:
        raise ConfigError(
            f"The server at {base_url} ended a message (finish_reason 'stop', stop_reason "
            f"{choice.get('stop_reason')!r}, last token {tokens[-1] if tokens else None}) without returning the "
            f"end-of-message token {eos} and its logprob. Use a server that returns the stop token it was given in "
            "stop_token_ids (vLLM does)."
        )
    return Generation(token_ids=tokens, logprobs=logprobs, finish_reason="stop" if stopped else "length")


def local_logprobs(
    model: Any, prompts: list[list[int]], completions: list[list[int]], temperature: float
) -> list[list[float]]:
    """Logprob of every completion token under softmax(logits / temperature) of a local forward pass."""
    out = []
    with torch.inference_mode():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([list(prompt) + list(completion)], device=model.device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
            chosen = torch.tensor(completion, device=model.device)[:, None]
            out.append(torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).tolist())
    return out


def logprob_difference(served: list[list[float]], local: list[list[float]]) -> float:
    """Mean absolute difference per token between two sets of per-token logprobs of the same tokens."""
    pairs = [(a, b) for s, r in zip(served, local, strict=True) for a, b in zip(s, r, strict=True)]
    if not pairs:
        return 0.0
    return sum(abs(a - b) for a, b in pairs) / len(pairs)


def has_local_weights(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint folder on this machine (full weights or a LoRA adapter)."""
    folder = Path(path)
    return (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()


def fleet_urls(rollout: Any) -> list[str]:
    """The servers of engine 'openai': ``base_urls``, with ``base_url`` first when both are set."""
    urls = ([rollout.base_url] if rollout.base_url else []) + list(rollout.base_urls)
    return list(dict.fromkeys(u.rstrip("/") for u in urls))


def weight_sync_mode(config: PipelineConfig) -> str:
    """``rollout.weight_sync`` with 'auto' decided by the training mode and who runs the servers.

    LoRA runs load adapters; with managed servers, full fine-tuning restarts them on each checkpoint
    (they were just started on it, so nothing is pushed).
    """
    mode = config.rollout.weight_sync
    if mode == "auto" and config.training.use_lora:
        return "lora"
    if mode == "auto" and config.rollout.managed_servers > 0:
        return "restart"
    return mode


class OpenAICompatibleEngine(Engine):
    """Batched sampling from an OpenAI-compatible completions endpoint, with per-token logprobs."""

    name = "openai"

    @classmethod
    def from_config(cls, checkpoint: str | Path, config: PipelineConfig) -> OpenAICompatibleEngine:
        """The servers of ``rollout.base_url(s)``, or with ``rollout.managed_servers: N`` N servers started on the
        checkpoint itself (`agent.serve.start_managed`), which the engine stops, by process group, when closed."""
        rollout = config.rollout
        managed = None
        if rollout.managed_servers > 0:
            # The pipeline's own servers, started on this checkpoint; the engine stops them in close().
            managed = start_managed(config, checkpoint)
            urls = managed.urls
        else:
            urls = fleet_urls(rollout)
        if not urls:
            raise ValueError("rollout.engine is 'openai' but neither rollout.base_url nor rollout.base_urls is set.")
        # The checkpoint folder supplies the tokenizer; the servers are asked for the same weights by name
        # (the folder's resolved path, matched against each server's list), or by what a weight push loaded.
        try:
            return cls(
                urls,
                rollout.served_model or weights.served_name(checkpoint),
                api_key=os.environ.get(rollout.api_key_env) or None,
                tokenizer_path=checkpoint,
                timeout_s=rollout.request_timeout_s,
                max_retries=rollout.request_retries,
                concurrency=rollout.concurrency,
                logprob_tolerance=rollout.logprob_tolerance,
                control_timeout_s=rollout.control_timeout_s,
                managed=managed,
            )
        except BaseException:
            if managed is not None:
                managed.stop()
            raise

    def prepare(self, checkpoint: str | Path, config: PipelineConfig) -> None:
        """Push the checkpoint's weights to every server (`sync_weights`), unless rollout.served_model names
        what the servers serve."""
        if config.rollout.served_model is None:
            self.sync_weights(checkpoint, weight_sync_mode(config), config.run_dir() / "served-adapters")

    def __init__(
        self,
        base_url: str | list[str],
        model: str,
        api_key: str | None = None,
        *,
        tokenizer_path: str | Path | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        concurrency: int = 32,
        logprob_tolerance: float | None = LOGPROB_TOLERANCE,
        control_timeout_s: float = 30.0,
        managed: Any | None = None,
    ) -> None:

        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        # Requests spread across every server of the fleet; one that fails has its requests retried on the others.
        self.fleet = Fleet(
            urls, api_key=api_key, timeout_s=timeout_s, control_timeout_s=control_timeout_s,
            max_retries=max_retries, concurrency=concurrency,
        )  # fmt: skip
        self.base_url = self.fleet.servers[0].url
        self._client = self.fleet.servers[0].client
        self.model_name = model
        self.fleet.requested_model = model
        self.max_retries = max_retries
        self.concurrency = concurrency
        # The logprob check runs once per engine, on the first sampled batch; a tolerance of None turns it off.
        # Its state: "pending", then "passed" or "skipped" (no local checkpoint), or "off".
        self.logprob_tolerance = logprob_tolerance
        self.logprob_check = "off" if logprob_tolerance is None else "pending"
        self._check_lock = threading.Lock()
        # The tokenizer renders prompts and decodes replies here; the server only sees token ids.
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_path or model))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.chat = ChatFormat(self.tokenizer)
        self.model_path = tokenizer_path or model
        # Servers this engine started (`agent.serve.ManagedServers`): they live exactly as long as the engine.
        self.managed = managed

    # --- server information -----------------------------------------------------------------------
    @property
    def max_context_tokens(self) -> int | None:
        """The served model's context length, when the server reports it."""
        server = self.fleet.healthy()[0]
        name = self.fleet.model_for(server)
        entries = self.fleet.models(server)
        for entry in entries:
            if entry.get("id") == name:
                # A LoRA adapter's entry names its base model as parent; the context is the base's.
                parent = entry.get("parent")
                if entry.get("max_model_len") is None and parent:
                    return next((e.get("max_model_len") for e in entries if e.get("id") == parent), None)
                return entry.get("max_model_len")
        return None

    def sync_weights(self, checkpoint: str | Path, mode: str = "auto", stack_dir: str | Path | None = None) -> str:
        """Make every healthy server serve ``checkpoint`` (see `agent.weights`); returns the path taken.

        ``mode`` is ``lora``, ``reload``, ``off``, ``restart`` or ``auto`` (``reload`` where the servers allow
        it, else ``off``). ``restart`` is for servers this engine started on the checkpoint: nothing to push.
        """
        servers = self.fleet.check_health()
        if mode == "auto":
            mode = "reload" if all(weights.reload_supported(self.fleet, s) for s in servers) else "off"
        if mode == "lora":
            stack = Path(stack_dir) if stack_dir is not None else Path(checkpoint).parent / "served-adapters"
            weights.sync_lora(self.fleet, checkpoint, stack)
        elif mode == "reload":
            weights.sync_reload(self.fleet, checkpoint)
        self.fleet.readmit = mode in ("off", "restart")
        # The name requests ask for: the round's adapter, the name the reloaded server keeps, or the checkpoint's.
        self.model_name = [self.fleet.model_for(server) for server in servers][0]
        return mode

    def close(self) -> None:
        self.fleet.close()
        if self.managed is not None:
            self.managed.stop()

    # --- generation ---------------------------------------------------------------------------------
    def _generate(
        self, prompts: list[list[int]], temperature: float, max_new_tokens: int, seeds: list[int] | None
    ) -> list[Generation]:
        """One request per prompt, ``seeds`` in each request's body; without seeds the server's own randomness
        decides."""
        # Seeds are paired with their prompts here, before any request is in flight.
        jobs = list(zip(prompts, seeds if seeds is not None else [None] * len(prompts), strict=True))
        if len(jobs) == 1:
            generations = [self._complete(jobs[0][0], temperature, max_new_tokens, jobs[0][1])]
        else:
            # ``concurrency`` requests in flight per server, so every server's continuous batching sees a full batch.
            in_flight = self.concurrency * max(1, sum(s.healthy for s in self.fleet.servers))
            with ThreadPoolExecutor(max_workers=min(in_flight, len(jobs))) as pool:
                generations = list(
                    pool.map(lambda job: self._complete(job[0], temperature, max_new_tokens, job[1]), jobs)
                )
        if temperature > 0 and self.logprob_check == "pending":
            self.check_logprobs(prompts, generations, temperature)
        return generations

    def check_logprobs(self, prompts: list[list[int]], generations: list[Generation], temperature: float) -> None:
        """Compare a few served logprobs with a local forward pass of the checkpoint at ``temperature``.

        Raises ConfigError naming the vLLM flag when the mean absolute difference per token exceeds
        ``logprob_tolerance``; skipped (with a warning) when the checkpoint is not on this machine.
        """
        with self._check_lock:
            tolerance = self.logprob_tolerance
            if self.logprob_check != "pending" or tolerance is None:
                return
            if not has_local_weights(self.model_path):
                log.warning(
                    "Cannot check the behaviour logprobs of %s: the checkpoint %s is not on this machine. "
                    "Make sure the server runs with %s.", self.base_url, self.model_path, LOGPROBS_FLAG,
                )  # fmt: skip
                self.logprob_check = "skipped"
                return

            picked = [(p, g) for p, g in zip(prompts, generations, strict=True) if g.token_ids][:LOGPROB_CHECK_SAMPLES]
            completions = [g.token_ids[:LOGPROB_CHECK_TOKENS] for _, g in picked]
            served = [g.logprobs[:LOGPROB_CHECK_TOKENS] for _, g in picked]
            model, _ = load_policy(self.model_path)
            local = local_logprobs(model, [p for p, _ in picked], completions, temperature)
            del model
            difference = logprob_difference(served, local)
            if not math.isfinite(difference) or difference > float(tolerance):
                raise ConfigError(
                    f"The server at {self.base_url} returned logprobs that differ from a local forward pass of "
                    f"{self.model_path} at temperature {temperature} by {difference:.4f} per token on average "
                    f"(tolerance {self.logprob_tolerance}). GRPO needs the logprobs of the sampling distribution: "
                    f"start vLLM with {LOGPROBS_FLAG}, and serve this same checkpoint."
                )
            self.logprob_check = "passed"

    def _complete(self, prompt: list[int], temperature: float, max_new_tokens: int, seed: int | None) -> Generation:
        eos = self.chat.eos_token_id
        body: dict[str, Any] = {
            "model": None,  # filled per server: the name that server serves the weights under
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
        if seed is not None and temperature > 0:
            body["seed"] = int(seed)
        return read_completion(self._request("POST", "/completions", body), eos, self.base_url)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.fleet.request(method, path, body)
