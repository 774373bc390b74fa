"""How rollouts are generated: the engine, its client settings, and the servers it talks to.

These are fields of the ``rollout`` section (`RolloutConfig` composes them), so their YAML keys,
``COEVOLVE_ROLLOUT__*`` variables and ``--set rollout.*`` overrides are those of that section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from coevolve.config.base import Section
from coevolve.plugins import declared_names

# The engines agent/engines.py builds in (tests/flows/test_engine_plugin.py checks the two lists agree), and the
# entry-point group under which an installed package declares another; its names are read here without importing
# the package, so the configuration stays light.
BUILT_IN_ENGINES: tuple[str, ...] = ("transformers", "vllm", "openai")
ENGINE_ENTRY_POINTS = "coevolve.engines"


def engine_names() -> list[str]:
    """Every value rollout.engine may take here: the built-in engines, then those installed packages declare."""
    return [*BUILT_IN_ENGINES, *declared_names(ENGINE_ENTRY_POINTS)]


class EngineSettings(Section):
    # The generation backend and its settings: the client of an OpenAI-compatible server, and vLLM's.
    engine: str = Field(
        "transformers",
        description=(
            "Generation backend. 'transformers' runs anywhere; 'vllm' runs vllm.LLM in-process, so only in an "
            "interpreter that has vLLM (.venv-vllm, .venv-gpu-vllm: vLLM cannot share an environment with the "
            "project's prefect); 'openai' sends token-id prompts to OpenAI-compatible vLLM servers at base_url(s) or "
            "started by the pipeline (managed_servers), as `make gpu-run` does; an installed package may add others "
            "(docs/extending.md)."
        ),
    )

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        known = engine_names()
        if value not in known:
            raise ValueError(f"unknown engine {value!r}; use one of {known}, or install the package that declares it")
        return value

    base_url: str | None = Field(
        None, description="Server URL for engine 'openai', e.g. http://127.0.0.1:8000/v1 (required for that engine)."
    )
    served_model: str | None = Field(
        None,
        description=(
            "Model name on the 'openai' server; None sends the round's checkpoint path, which is the name vLLM "
            "serves a folder under, so a server restarted on each checkpoint needs no setting."
        ),
    )
    api_key_env: str = Field(
        "COEVOLVE_OPENAI_API_KEY",
        description=(
            "Environment variable holding the 'openai' server's API key, so keys never sit in config files; unset "
            "sends none."
        ),
    )
    request_timeout_s: float = Field(
        300.0, gt=0, description="Seconds one 'openai' completion may take: long messages on a busy server."
    )
    request_retries: int = Field(
        3, ge=0, description="Retries of a failed 'openai' request (connection, timeout, 5xx) before the stage fails."
    )
    # At most 1024: each request in flight is a thread of the rollout process, and a vLLM server batches at most
    # its max_num_seqs (256 by default) at once, so more only queue there while their threads hold memory here.
    concurrency: int = Field(
        32,
        ge=1,
        le=1024,
        description="Requests in flight to each 'openai' server, so its continuous batching sees the batch.",
    )
    logprob_tolerance: float | None = Field(
        0.05,
        ge=0,
        description=(
            "Engine 'openai' compares its first sampled batch's logprobs with a local forward pass of the checkpoint "
            "and stops when the mean absolute difference per token exceeds this: a server without --logprobs-mode "
            "processed_logprobs returns untempered logprobs, which silently bias GRPO's importance ratios. A float32 "
            "server agrees within 1e-3; a server in lower precision than the local float32 pass may need more. None "
            "skips the check (e.g. a checkpoint too large to load on the machine running the rollout stage)."
        ),
    )
    vllm_dtype: str = Field(
        "auto", description="Weights dtype of vLLM engines and servers; 'auto' keeps a local checkpoint's saved dtype."
    )
    vllm_gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="GPU memory share of engine 'vllm': half leaves room for the update stage's trainer.",
    )
    vllm_max_model_len: int | None = Field(
        None, ge=16, description="Context length of engine 'vllm'; None uses the model's."
    )
    vllm_tensor_parallel_size: int = Field(
        1,
        ge=1,
        description=(
            "GPUs one vLLM engine (in-process or `coevolve serve`) shards a model over: for models one GPU cannot hold."
        ),
    )
    vllm_data_parallel_size: int = Field(
        1,
        ge=1,
        description=(
            "Model replicas of one vLLM engine (in-process or `coevolve serve`): more rollout throughput per machine."
        ),
    )
    prefill_batch: int = Field(
        8,
        ge=1,
        description=(
            "Prompts per forward pass when the transformers engine reads a greedy batch's prompts (evaluation): a "
            "whole padded batch's activations outgrow a CPU's caches, and 8 at a time read 48 prompts of the "
            "shipped checkpoint in 0.23 s against 0.41 s at once (benchmarks/STEP.md). Sampling reads each distinct "
            "prompt alone."
        ),
    )
    prefix_cache_mb: int = Field(
        256,
        ge=0,
        description=(
            "Memory the transformers engine keeps for the KV caches of prompt prefixes while it samples: a turn's "
            "prompt then reads only what was added since the episode's last message. The caches are exact (a prefix "
            "is always read in the same pieces), so the budget changes speed, never the tokens or logprobs; 0 keeps "
            "none."
        ),
    )


class ServerSettings(Section):
    # The rollout servers of engine 'openai': a fleet at given URLs, or servers the pipeline starts itself.
    base_urls: list[str] = Field(
        default_factory=list,
        description=(
            "Fleet of OpenAI-compatible servers for engine 'openai'; requests spread across them and a server that "
            "fails mid-round has its requests retried on the others. base_url alone is a one-server fleet."
        ),
    )
    control_timeout_s: float = Field(
        30.0,
        gt=0,
        description=(
            "Seconds a health check or weight-push call to a server may take, so a hung server cannot stall a stage."
        ),
    )
    weight_sync: Literal["auto", "lora", "reload", "off", "restart"] = Field(
        "auto",
        description=(
            "How engine 'openai' gets each round's weights onto its servers: 'lora' loads the round's adapter "
            "(training.use_lora; servers started on checkpoint 0 with --enable-lora), 'reload' reloads the "
            "checkpoint in place (servers with VLLM_SERVER_DEV_MODE=1), 'off' asks for the checkpoint by name "
            "(servers restarted on each checkpoint by someone else), 'restart' starts the pipeline's own servers on "
            "each stage's checkpoint (managed_servers > 0; for vLLM builds that cannot reload in place). 'auto' is "
            "'lora' with use_lora, else 'restart' with managed servers, else 'reload' where the servers allow it, "
            "else 'off'."
        ),
    )
    managed_servers: int = Field(
        0,
        ge=0,
        description=(
            "Rollout servers the pipeline starts itself (`coevolve serve`, on 127.0.0.1) on each rollout or "
            "evaluation stage's checkpoint and stops when the stage releases its engine, so no server holds memory "
            "while the update trains. The fallback where servers cannot take weights in place (a vLLM without "
            "reload_weights, or a checkpoint that changed tied embeddings on servers not started by coevolve serve): "
            "costs one server start per stage. 0: use base_url(s)."
        ),
    )
    server_python: str | None = Field(
        None,
        description=(
            "Interpreter the managed servers run from: an environment with vLLM, kept apart from the pipeline's "
            "because vLLM pins an older fastapi than prefect needs (`make gpu-run` names .venv-gpu-vllm's). None: "
            ".venv-vllm's when it exists, else the pipeline's own."
        ),
    )
    managed_port: int = Field(
        8100,
        ge=1024,
        le=65535,
        description=(
            "Port of the first managed server; the following ones take the next ports, and a port already taken is "
            "replaced by a free one, so a stale server or another run cannot block a stage."
        ),
    )
    server_max_lora_rank: int = Field(
        64,
        ge=1,
        description=(
            "--max-lora-rank of `coevolve serve` with use_lora: one adapter of rank lora_rank is trained on "
            "checkpoint 0 across the run, so lora_rank is what a server needs; more leaves room for state folders of "
            "earlier versions, whose rounds were served as a stack of one adapter per round (rank rounds x lora_rank)."
        ),
    )
    server_max_loras: int = Field(
        2, ge=1, description="--max-loras of `coevolve serve`: the round's adapter and the one being replaced."
    )
