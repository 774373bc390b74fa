"""The CLI pins torch, MKL and oneDNN to AVX2 kernels before torch loads, so AVX2 and AVX-512 machines compute the
same bits."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")

PROBE = """
import sys
from flows.commands import prepare_environment
from coevolve.config import load_config
prepare_environment(load_config(overrides=sys.argv[1:]))
import torch
print(torch.backends.cpu.get_cpu_capability())
"""


def _capability(tmp_path: Path, *overrides: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in PINS and not k.startswith("COEVOLVE_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, f"state_dir={tmp_path}", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip().splitlines()[-1]


def _native(tmp_path: Path) -> str:
    return _capability(tmp_path, "policy.cpu_kernels=native")


def test_the_default_runs_avx2_kernels_whatever_the_cpu_offers(tmp_path):
    native = _native(tmp_path)
    expected = "AVX2" if native in ("AVX2", "AVX512") else native  # a CPU without AVX2 keeps what it has
    assert _capability(tmp_path) == expected
