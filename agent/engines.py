"""Picks the generation engine a configuration names: transformers, vLLM in-process, or an OpenAI-compatible server.

Every engine has the same contract (``tokenizer``, ``chat``, ``generate(prompts, temperature,
max_new_tokens, seeds=None) -> list[Generation]``, one seed per prompt), so the rollout and
evaluation stages never branch on it. Sampling seeds come from the caller (`tasks.rollout.message_seed`);
the ``seed`` given here only seeds calls made without them.
Each engine module is imported only when chosen: vLLM is not installed in the main environment.

    engine = make_engine(checkpoint, config)   # config.rollout.engine decides
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from coevolve.config import PipelineConfig


def make_engine(checkpoint: str | Path, config: PipelineConfig) -> Any:
    """The engine of ``config.rollout.engine``, generating with the checkpoint's weights."""
    rollout = config.rollout
    if rollout.engine == "transformers":
        from agent.engine import TransformersEngine

        return TransformersEngine(checkpoint, torch_threads=config.policy.torch_threads, seed=config.seed)
    if rollout.engine == "vllm":
        from agent.vllm_engine import VLLMEngine

        return VLLMEngine(
            checkpoint,
            seed=config.seed,
            dtype=rollout.vllm_dtype,
            max_model_len=rollout.vllm_max_model_len,
            gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
        )
    if rollout.engine == "openai":
        from agent.http_engine import OpenAICompatibleEngine

        if not rollout.base_url:
            raise ValueError("rollout.engine is 'openai' but rollout.base_url is not set.")
        # The checkpoint folder supplies the tokenizer; the server is asked for the same weights by name.
        return OpenAICompatibleEngine(
            rollout.base_url,
            rollout.served_model or str(checkpoint),
            api_key=os.environ.get(rollout.api_key_env) or None,
            tokenizer_path=checkpoint,
            timeout_s=rollout.request_timeout_s,
            max_retries=rollout.request_retries,
            concurrency=rollout.concurrency,
            logprob_tolerance=rollout.logprob_tolerance,
        )
    raise ValueError(f"Unknown rollout.engine {rollout.engine!r}; use transformers, vllm or openai.")


def context_length(engine: Any) -> int | None:
    """Tokens the engine's model can attend to, or None when unknown."""
    reported = getattr(engine, "max_context_tokens", None)
    if reported is not None:
        return int(reported)
    model = getattr(engine, "model", None)
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)
