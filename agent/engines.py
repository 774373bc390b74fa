"""The generation engines by name, and how a stage opens one: transformers, vLLM in-process, OpenAI-compatible
servers, and any engine an installed package declares.

Every engine keeps the contract of agent/engine.py (`Engine`: ``tokenizer``, ``chat``,
``generate(prompts, temperature, max_new_tokens, seeds=None) -> list[Generation]``, one seed per prompt), so
the rollout and evaluation stages never branch on it. Sampling seeds come from the caller
(`tasks.rollout.message_seed`); the ``seed`` of the configuration only seeds calls made without them. Each
engine module names its heavy packages with `coevolve.optional`: vLLM, not installed in the main environment,
is imported only when engine 'vllm' is built.

    engine = make_engine(checkpoint, config)   # config.rollout.engine decides
    with open_engine(checkpoint, config) as engine:   # the stages: weights pushed to servers, released at the end
        ...

A package adds an engine by declaring its `Engine` subclass under the entry-point group ``coevolve.engines``
(``[project.entry-points."coevolve.engines"] myengine = "mypackage.engine:MyEngine"``); the configuration
accepts ``rollout.engine: myengine`` wherever that package is installed (coevolve/config/engines.py reads the
names without importing it).
"""

from __future__ import annotations

from pathlib import Path

from agent.engine import Engine
from agent.http_engine import OpenAICompatibleEngine
from agent.transformers_engine import TransformersEngine
from agent.vllm_engine import VLLMEngine
from coevolve.config import PipelineConfig
from coevolve.config.engines import ENGINE_ENTRY_POINTS
from coevolve.plugins import declared_class

BUILT_IN: dict[str, type[Engine]] = {e.name: e for e in (TransformersEngine, VLLMEngine, OpenAICompatibleEngine)}


def engine_class(name: str) -> type[Engine]:
    """The engine called ``name``: a built-in one, or the one an installed package declares under that name."""
    return declared_class(ENGINE_ENTRY_POINTS, name, BUILT_IN, Engine, "agent/engine.py", "rollout.engine")


def make_engine(checkpoint: str | Path, config: PipelineConfig) -> Engine:
    """The engine of ``config.rollout.engine``, generating with the checkpoint's weights."""
    return engine_class(config.rollout.engine).from_config(checkpoint, config)


def open_engine(checkpoint: str | Path, config: PipelineConfig) -> Engine:
    """`make_engine`, made ready for the checkpoint (`Engine.prepare`: servers get its weights pushed).

    Rollout and evaluation open their engine this way at the start of every stage, so the weights
    an update wrote reach every server before they generate, also when a round resumes.
    """
    engine = make_engine(checkpoint, config)
    try:
        engine.prepare(checkpoint, config)
    except BaseException:
        engine.close()
        raise
    return engine


def release(engine: Engine) -> None:
    """Free what an engine holds (vLLM workers, GPU memory, connections) before the update stage trains."""
    engine.close()


def context_length(engine: Engine) -> int | None:
    """Tokens the engine's model can attend to, or None when unknown."""
    reported = engine.max_context_tokens
    return int(reported) if reported is not None else None
