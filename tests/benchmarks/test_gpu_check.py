"""benchmarks/gpu_check.py: refuses without CUDA, and with --allow-cpu runs rollouts and one GRPO update."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check import main

REPO = Path(__file__).resolve().parents[2]


def test_without_cuda_it_refuses_and_says_how_to_check_the_script():
    # A process that sees no CUDA device, on any machine: a GPU machine runs this test too.
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "No CUDA device" in done.stderr and "--allow-cpu" in done.stderr


@pytest.mark.slow
def test_with_allow_cpu_it_prints_throughput_update_time_and_memory(tmp_path, capsys):
    assert (
        main(
            [
                "--allow-cpu",
                "--sft-steps",
                "2",
                "--prompts",
                "2",
                "--samples",
                "2",
                "--max-new-tokens",
                "8",
                "--work",
                str(tmp_path),
            ]
        )
        == 0
    )
    lines = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"')
    ]  # TRL prints its own dict logs too
    parts = {line.get("part"): line for line in lines if "part" in line}
    assert parts["rollouts (transformers engine)"]["tokens"] > 0
    assert parts["update (TRL GRPO)"]["steps"] == 1
    summary = lines[-1]["summary"]
    assert summary["tokens_per_s"] > 0 and summary["update_s"] > 0 and summary["device"] == "cpu"
