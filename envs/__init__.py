"""Agent environments: the contract (envs.base), the registry that builds one by name (envs.registry), BFCL
multi-turn (envs.bfcl), the workplace of mail, calendar, contacts and tasks (envs.workplace) and call parsing
(envs.calls)."""

import os
import tempfile
from pathlib import Path

# bfcl-eval creates folders under BFCL_PROJECT_ROOT when it is imported (site-packages by default, which
# may be read-only). This package is imported before any of its modules, and they are the only ones
# importing bfcl-eval, so this is the one place the root is chosen. The project never reads those
# folders (bfcl-eval's result, score and lock folders stay empty), so one scratch folder serves every
# run; an operator's own BFCL_PROJECT_ROOT is kept.
os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "bfcl_root"))
