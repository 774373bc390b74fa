"""Update time on two training ranks against one, in one run: `tasks/training/launch.py` under torchrun (gloo on CPU).

Builds a random-init tiny policy (the builtin default's shape unless told otherwise), stores one
round of synthetic groups (random completion tokens, rewards with variance in every group) in a
fresh DuckDB warehouse, and trains the same stored groups three ways:

- ``in_process``: `grpo_update` in this process (the default, ``training.num_processes: 1``);
- ``torchrun_1``: `launch_update` with one rank (launcher overhead, same work);
- ``torchrun_2``: `launch_update` with two ranks, each training half of the groups.

For each it reports the wall time of the call (``wall_s``: process start and imports included), rank 0's
own `grpo_update` time (``train_s``: model load, TRL trainer set-up, the optimizer steps, saving), the
mean time of one optimizer step as TRL measures it (``step_s``, rank 0), and the largest weight
difference of the two-rank checkpoint from the in-process one.

    .venv/bin/python benchmarks/update_ranks.py                       # 16 groups of 8, 128-token completions
    .venv/bin/python benchmarks/update_ranks.py --groups 8 --completion-tokens 64 --repeat 3

Prints one JSON line; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from agent.chat import render_tiny
from agent.tiny import build_model, train_tokenizer
from coevolve.config import PipelineConfig, PolicyConfig
from coevolve.optional import optional_module
from coevolve.records import Message, Trajectory
from tasks.common import open_warehouse
from tasks.training.grpo_groups import group_round
from tasks.training.launch import launch_update
from tasks.update import grpo_update

safetensors_torch = optional_module("safetensors.torch")


def _policy(out: Path, hidden: int, layers: int, vocab: int) -> tuple[Path, int]:
    """A random-init tiny policy and the size of its vocabulary (BPE stops early on little text)."""
    texts = [
        render_tiny(
            [
                Message("user", f"make a folder d{i} and list it"),
                Message("assistant", f"[mkdir(dir_name='d{i}'), ls()]"),
            ],
            False,
        )
        for i in range(400)
    ]
    tokenizer = train_tokenizer(texts, vocab_size=vocab)
    build_model(tokenizer, PolicyConfig(hidden_size=hidden, num_layers=layers), seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, len(tokenizer)


def _groups(groups: int, group_size: int, prompt_tokens: int, completion_tokens: int, vocab: int, seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(prompt_tokens)]
        rewards = [float(s % 2) for s in range(group_size)]  # half succeed: every group has reward variance
        for sample, reward in enumerate(rewards):
            completion = [rng.randrange(vocab) for _ in range(completion_tokens)]
            out.append(
                Trajectory(
                    run_id="bench",
                    round=0,
                    task_id=f"t-{g:03d}",
                    sample=sample,
                    steps=[],
                    prompt_ids=prompt,
                    completion_ids=completion,
                    completion_mask=[1] * completion_tokens,
                    logprobs=[-7.0] * completion_tokens,  # about log(1/2048): what a random-init policy assigns
                    reward=reward,
                    success=reward > 0,
                    finish_reason="done",
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (training.updates_per_batch)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant, interleaved; the fastest is kept")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="update-ranks-") as scratch:
        root = Path(scratch)
        policy, vocab = _policy(root / "policy", args.hidden, args.layers, args.vocab)
        trajectories = _groups(args.groups, args.group_size, args.prompt_tokens, args.completion_tokens, vocab, seed=1)
        config = PipelineConfig(
            run_id="bench", state_dir=root / "state", seed=0,
            rollout={"group_size": args.group_size, "temperature": 0.9},
            training={"updates_per_batch": args.steps, "kl_reference": "round", "launcher": "torchrun"},
        )  # fmt: skip
        with open_warehouse(config) as wh:
            wh.write_trajectories(trajectories)

        results: dict[str, dict] = {}
        runs = {
            "in_process": lambda out: grpo_update(policy, trajectories, config, out),
            "torchrun_1": lambda out: launch_update(
                policy,
                group_round(trajectories, args.group_size),
                config.with_overrides({"training": {"num_processes": 1}}),
                0,
                out,
            ),
            "torchrun_2": lambda out: launch_update(
                policy,
                group_round(trajectories, args.group_size),
                config.with_overrides({"training": {"num_processes": 2}}),
                0,
                out,
            ),
        }
        for _, (name, run) in ((r, item) for r in range(args.repeat) for item in runs.items()):
            out = root / name
            started = time.perf_counter()
            stats = run(out)
            wall = time.perf_counter() - started
            if name in results and results[name]["wall_s"] <= wall:
                continue
            results[name] = {
                "wall_s": round(wall, 2),
                "train_s": stats["duration_s"],
                "step_s": round(stats["step_time"], 3),
                "steps": stats["steps"],
                "processes": stats.get("processes", 1),
                "groups_per_rank": sorted(
                    {len(v) for v in stats.get("rank_task_ids", {"0": stats["task_ids"]}).values()}
                ),
            }
        reference, two = (
            safetensors_torch.load_file(root / "in_process" / "model.safetensors"),
            safetensors_torch.load_file(root / "torchrun_2" / "model.safetensors"),
        )
        start = safetensors_torch.load_file(policy / "model.safetensors")
        print(
            json.dumps(
                {
                    "groups": args.groups,
                    "group_size": args.group_size,
                    "completion_tokens": args.completion_tokens,
                    "steps": args.steps,
                    "hidden": args.hidden,
                    "layers": args.layers,
                    "params": sum(v.numel() for v in start.values()),
                    **results,
                    "speedup_2_vs_1_torchrun": round(
                        results["torchrun_1"]["wall_s"] / results["torchrun_2"]["wall_s"], 2
                    ),
                    "speedup_2_vs_in_process": round(
                        results["in_process"]["wall_s"] / results["torchrun_2"]["wall_s"], 2
                    ),
                    "max_abs_weight_diff_2_vs_in_process": max(
                        (two[k] - reference[k]).abs().max().item() for k in reference
                    ),
                    "max_abs_weight_change": max((reference[k] - start[k]).abs().max().item() for k in reference),
                }  # fmt: skip
            )
        )


if __name__ == "__main__":
    main()
