"""benchmarks/gpu_check.py: refuses without CUDA, and with --allow-cpu runs rollouts and one GRPO update."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.gpu_check import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_refuses_and_says_how_to_check_the_script(capsys):
    assert main([]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


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
