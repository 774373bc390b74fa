"""Failure signals as plug-ins: each kind one module holding a `SignalKind`, all of them listed in `KINDS`.

coevolve/signals/base.py names the contract; coevolve/signals/registry.py lists the kinds (the method's
forgetting, boundary and rare, then any an installed package declares); docs/extending.md walks through
adding one.
"""

from coevolve.signals.base import KindSettings, NoSettings, SignalKind
from coevolve.signals.registry import KINDS, SIGNAL_KINDS, letters, signal_kind

__all__ = ["KINDS", "SIGNAL_KINDS", "KindSettings", "NoSettings", "SignalKind", "letters", "signal_kind"]
