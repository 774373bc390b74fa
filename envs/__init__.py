"""Agent environments: the protocol (envs.base), BFCL multi-turn (envs.bfcl), call parsing and exploration."""

import os
import tempfile
from pathlib import Path

# Importing bfcl_eval.utils writes folders under BFCL_PROJECT_ROOT (site-packages by default).
os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "bfcl_root"))
