"""The policy: its chat format, the builtin tiny model, and the transformers generation engine."""

from agent.chat import ChatFormat
from agent.tiny import build_tiny_policy
from agent.transformers_engine import Generation, TransformersEngine, load_policy

__all__ = ["ChatFormat", "Generation", "TransformersEngine", "build_tiny_policy", "load_policy"]
