"""Picks the generation engine a configuration names: transformers, vLLM in-process, or an OpenAI-compatible server.

Every engine has the same contract (``tokenizer``, ``chat``, ``generate(prompts, temperature,
max_new_tokens, seeds=None) -> list[Generation]``, one seed per prompt), so the rollout and
evaluation stages never branch on it. Sampling seeds come from the caller (`tasks.rollout.message_seed`);
the ``seed`` given here only seeds calls made without them.
Each engine module names its heavy packages with `coevolve.optional`: vLLM, not installed in the main
environment, is imported only when engine 'vllm' is built.

    engine = make_engine(checkpoint, config)   # config.rollout.engine decides
    with open_engine(checkpoint, config) as engine:   # the stages: weights pushed to servers, released at the end
        ...

With ``rollout.managed_servers: N`` engine 'openai' starts N servers on the checkpoint itself
(`agent.serve.start_managed`) and stops them, by process group, when it is closed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent.http_engine import OpenAICompatibleEngine
from agent.serve import start_managed
from agent.transformers_engine import TransformersEngine
from agent.vllm_engine import VLLMEngine
from agent.weights import served_name, vllm_dtype
from coevolve.config import PipelineConfig


def make_engine(checkpoint: str | Path, config: PipelineConfig) -> Any:
    """The engine of ``config.rollout.engine``, generating with the checkpoint's weights."""
    rollout = config.rollout
    if rollout.engine == "transformers":
        return TransformersEngine(checkpoint, torch_threads=config.policy.torch_threads, seed=config.seed)
    if rollout.engine == "vllm":
        return VLLMEngine(
            checkpoint,
            seed=config.seed,
            dtype=vllm_dtype(checkpoint, rollout.vllm_dtype),
            max_model_len=rollout.vllm_max_model_len,
            gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
            tensor_parallel_size=rollout.vllm_tensor_parallel_size,
            data_parallel_size=rollout.vllm_data_parallel_size,
        )
    if rollout.engine == "openai":
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
            return OpenAICompatibleEngine(
                urls,
                rollout.served_model or served_name(checkpoint),
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
    raise ValueError(f"Unknown rollout.engine {rollout.engine!r}; use transformers, vllm or openai.")


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


def open_engine(checkpoint: str | Path, config: PipelineConfig) -> Any:
    """`make_engine`, with the checkpoint's weights pushed to the servers of engine 'openai' first.

    Rollout and evaluation open their engine this way at the start of every stage, so the weights
    an update wrote reach every server before they generate, also when a round resumes.
    """
    engine = make_engine(checkpoint, config)
    if config.rollout.engine == "openai" and config.rollout.served_model is None:
        try:
            engine.sync_weights(checkpoint, weight_sync_mode(config), config.run_dir() / "served-adapters")
        except BaseException:
            engine.close()
            raise
    return engine


def release(engine: Any) -> None:
    """Free what an engine holds (vLLM workers, GPU memory, connections) before the update stage trains."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def context_length(engine: Any) -> int | None:
    """Tokens the engine's model can attend to, or None when unknown."""
    reported = getattr(engine, "max_context_tokens", None)
    if reported is not None:
        return int(reported)
    model = getattr(engine, "model", None)
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)
