"""GPU check for a bare GPU machine: the transformers engine's rollouts and one GRPO update, on CUDA.

``make gpu-smoke`` needs vLLM and two environments built from the package registry. A machine that
only has CUDA torch, transformers, accelerate and peft (no registry, a few tens of MiB of files per
command) can still check the pipeline's own GPU path with this script and a handful of carried
wheels (TRL and the small packages it and the configuration import; `make gpu-check-wheels`):

1. the builtin tiny policy (`agent.tiny.build_tiny_policy`, SFT for ``--sft-steps`` steps);
2. rollouts with the transformers engine (`agent.transformers_engine.TransformersEngine`) in bf16 on CUDA:
   ``--prompts`` prompts x ``--samples`` samples, seeded, with behaviour logprobs; tokens/s;
3. the engine's memory handed back (`TransformersEngine.close`), memory left allocated printed;
4. one GRPO update through TRL on those samples (`tasks.update.grpo_update`, bf16 on CUDA), with
   alternating rewards so every group has reward variance; update seconds.

It prints one JSON line per part and a summary with tokens/s, update seconds and peak GPU memory of
each part. Without CUDA it refuses to run unless ``--allow-cpu`` is given (then it checks the script
on the CPU, in float32; its figures say nothing about a GPU).

    python benchmarks/gpu_check.py                 # on the GPU machine
    .venv/bin/python benchmarks/gpu_check.py --allow-cpu --sft-steps 4 --prompts 2 --samples 2

The update's module carries a Prefect task wrapper that this check does not use: where prefect is
not installed (a bare GPU machine), a stand-in whose ``task`` decorator returns the function
unchanged lets the module import; the update itself is the same function the round calls.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The same demonstrations, prompts and sampling temperature as the GPU smoke test (stdlib imports only there).
from benchmarks.gpu_smoke import NAMES, REQUESTS, SYSTEM, TEMPERATURE, builtin_policy  # noqa: E402


def _without_prefect() -> None:
    """Let tasks.update import where prefect is absent: its Prefect task wrapper is not used here."""
    if importlib.util.find_spec("prefect") is not None:
        return
    prefect = types.ModuleType("prefect")
    prefect.task = lambda *args, **kwargs: lambda fn: fn
    prefect.get_run_logger = lambda: None
    policies = types.ModuleType("prefect.cache_policies")
    policies.NO_CACHE = None
    sys.modules["prefect"], sys.modules["prefect.cache_policies"] = prefect, policies


def _memory(torch: Any, cuda: bool) -> dict[str, float]:
    if not cuda:
        return {}
    return {
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 3),
    }


def rollouts(
    policy: Path, prompts: int, samples: int, max_new_tokens: int, cuda: bool
) -> tuple[dict[str, Any], list, list]:
    """Seeded samples from the transformers engine in bf16 (CUDA) or float32 (CPU); the engine is closed after."""
    import torch

    from agent.transformers_engine import TransformersEngine
    from coevolve.records import Message

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    engine = TransformersEngine(policy, torch_threads=1, seed=0)
    if cuda:
        engine.model.to(torch.bfloat16)
    requests = [REQUESTS[i % len(REQUESTS)][0].format(name=NAMES[i % len(NAMES)]) for i in range(prompts)]
    batch = [
        engine.chat.prompt_ids([Message("system", SYSTEM), Message("user", r)])
        for r in requests
        for _ in range(samples)
    ]
    engine.generate(batch[:1], temperature=TEMPERATURE, max_new_tokens=4, seeds=[0])  # warm-up: kernels, caches
    started = time.perf_counter()
    generations = engine.generate(
        batch, temperature=TEMPERATURE, max_new_tokens=max_new_tokens, seeds=list(range(len(batch)))
    )
    seconds = time.perf_counter() - started
    tokens = sum(len(g.token_ids) for g in generations)
    dtype = str(next(engine.model.parameters()).dtype)
    peak = _memory(torch, cuda)
    engine.close()
    result = {
        "part": "rollouts (transformers engine)", "device": str(engine.device), "dtype": dtype, "episodes": len(batch),
        "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "memory": peak, "after_release": _memory(torch, cuda),
    }  # fmt: skip
    return result, batch, generations


def update(policy: Path, batch: list, generations: list, samples: int, work: Path, cuda: bool) -> dict[str, Any]:
    """One GRPO update through TRL (tasks.update.grpo_update) on the rollouts, half of every group rewarded."""
    import torch

    _without_prefect()
    from coevolve.config import PipelineConfig
    from coevolve.records import Trajectory
    from tasks.update import grpo_update

    config = PipelineConfig(
        run_id="gpu-check", state_dir=work / "state", seed=0,
        rollout={"group_size": samples, "temperature": TEMPERATURE}, training={"updates_per_batch": 1},
    )  # fmt: skip
    trajectories = []
    for index, (prompt, generation) in enumerate(zip(batch, generations, strict=True)):
        tokens, logprobs = generation.token_ids or [0], generation.logprobs or [0.0]
        reward = float(index % samples % 2)
        trajectories.append(
            Trajectory(
                run_id=config.run_id, round=0, task_id=f"t-{index // samples:03d}", sample=index % samples, steps=[],
                prompt_ids=list(prompt), completion_ids=list(tokens), completion_mask=[1] * len(tokens),
                logprobs=list(logprobs), reward=reward, success=reward > 0, finish_reason="done",
            )
        )  # fmt: skip
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    stats = grpo_update(policy, trajectories, config, work / "round-001")
    seconds = time.perf_counter() - started
    if stats.get("skipped"):
        raise SystemExit(f"The update was skipped: {stats.get('reason')}")
    return {
        "part": "update (TRL GRPO)",
        "steps": stats["steps"],
        "groups": stats["groups"],
        "seconds": round(seconds, 2),
        "memory": _memory(torch, cuda),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA: checks the script, not a GPU")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (a GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sft-steps", type=int, default=200, help="SFT steps of the builtin tiny policy")
    parser.add_argument(
        "--work", type=Path, help="folder for the policy and the update's output (default: a temporary one)"
    )
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(
            "No CUDA device: this checks the GPU path. Run it on a GPU machine, or pass --allow-cpu to check the "
            "script on the CPU.",
            file=sys.stderr,
        )
        return 2
    if args.samples < 2:
        parser.error("--samples must be at least 2: a GRPO group needs two samples to compare")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        work = args.work or Path(scratch)
        started = time.perf_counter()
        policy = builtin_policy(work / "policy", args.sft_steps)
        print(
            json.dumps(
                {
                    "part": "builtin policy",
                    "sft_steps": args.sft_steps,
                    "seconds": round(time.perf_counter() - started, 2),
                }
            )
        )
        rollout, batch, generations = rollouts(policy, args.prompts, args.samples, args.max_new_tokens, cuda)
        print(json.dumps(rollout))
        trained = update(policy, batch, generations, args.samples, work, cuda)
        print(json.dumps(trained))
        summary = {
            "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "tokens_per_s": rollout["tokens_per_s"], "update_s": trained["seconds"],
            "rollout_peak_gib": rollout["memory"].get("peak_gib"), "update_peak_gib": trained["memory"].get("peak_gib"),
            "allocated_after_release_gib": rollout["after_release"].get("allocated_gib"),
        }  # fmt: skip
        print(json.dumps({"summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
