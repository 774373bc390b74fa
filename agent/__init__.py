"""The policy: its chat format, the builtin tiny model, the engine contract and the transformers engine."""

from agent.chat import ChatFormat
from agent.engine import Engine, Generation
from agent.tiny import build_tiny_policy
from agent.transformers_engine import TransformersEngine, load_policy

__all__ = ["ChatFormat", "Engine", "Generation", "TransformersEngine", "build_tiny_policy", "load_policy"]
