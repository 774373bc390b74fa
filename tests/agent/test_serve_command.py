"""`coevolve serve` starts vLLM the way engine 'openai' expects it (the command line, without starting it)."""

from __future__ import annotations

from pathlib import Path

from agent.serve import ServeOptions, server_command, server_env
from coevolve.cli import main
from coevolve.config import load_config


def _flags(command: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for index, token in enumerate(command):
        if token.startswith("--"):
            following = command[index + 1] if index + 1 < len(command) else None
            out[token] = None if following is None or following.startswith("--") else following
    return out


def test_dry_run_prints_the_command_the_pipeline_expects(capsys, tmp_path):
    code = main(["serve", "--model", str(tmp_path), "--port", "8123", "--cpu", "--dry-run"])
    assert code == 0
    flags = _flags(capsys.readouterr().out.split())
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert "--enable-prefix-caching" in flags
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--dtype"] == "auto"
    assert "--no-enable-chunked-prefill" in flags and int(flags["--max-num-batched-tokens"]) >= 4096
    assert "--enable-lora" not in flags


def test_lora_training_serves_with_runtime_lora_room_for_stacked_rounds(tmp_path):
    config = load_config(overrides=["training.use_lora=true", "training.lora_rank=8", "rollout.server_max_lora_rank=40"])
    options = ServeOptions.from_config(config, tmp_path, cpu=False)
    flags = _flags(server_command(options, python="python"))
    assert "--enable-lora" in flags
    assert flags["--max-lora-rank"] == "64"  # the next rank vLLM accepts
    assert flags["--max-loras"] == "2"
    assert "--no-enable-chunked-prefill" not in flags  # GPU builds keep chunked prefill
    assert server_env(options, base={})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_every_server_accepts_weight_reloads_and_stays_on_loopback(tmp_path):
    env = server_env(ServeOptions(model=str(tmp_path)), base={})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env


def test_a_relative_model_path_is_served_under_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "round-000").mkdir()
    monkeypatch.chdir(tmp_path)
    flags = _flags(server_command(ServeOptions(model="round-000"), python="python"))
    assert flags["--model"] == str((tmp_path / "round-000").resolve())
    assert Path(flags["--model"]).is_absolute()


def test_parallel_sizes_pass_through_to_vllm(tmp_path):
    config = load_config(overrides=["rollout.vllm_tensor_parallel_size=2", "rollout.vllm_data_parallel_size=3"])
    flags = _flags(server_command(ServeOptions.from_config(config, tmp_path), python="python"))
    assert flags["--tensor-parallel-size"] == "2" and flags["--data-parallel-size"] == "3"
