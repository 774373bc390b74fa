"""Per-step overhead of a training step: what rebuilding the trainer and writing durable state costs each step.

Each training step's update builds a TRL GRPOTrainer on the previous step's checkpoint, resumes the
trainer state saved beside it (optimizer, scheduler, global step, RNG) and writes its own checkpoint
and state (tasks/training/grpo_trainer.py). This measures, for a random-init policy of the builtin default's
shape (unless told otherwise) on one batch of synthetic groups, the parts of one step as
tasks/training/grpo_trainer.train runs them:

- ``policy_load_s``: loading the checkpoint (`load_policy`);
- ``trainer_build_s``: constructing the trainer (TRL's reference model included when beta > 0);
- ``update_s``: ``trainer.train()``, the step's optimizer steps (``--updates``);
- ``checkpoint_save_s``: writing the checkpoint folder (merged weights and tokenizer; with LoRA the adapter);
- ``state_save_s`` / ``state_load_s``: writing the trainer state (transformers' ``_save_optimizer_and_scheduler``,
  RNG, trainer_state.json) and reading the optimizer and scheduler back into a fresh trainer;
- ``state_bytes`` / ``checkpoint_bytes``: their sizes on disk;
- ``step_fresh_s`` / ``step_resumed_s``: one whole `grpo_update` without and with a state to resume.

It also estimates the state's save and load time for a 4B-parameter model at ``--disk-gb-s``: full
fine-tuning keeps two fp32 AdamW moments per parameter (2 x 4 bytes x 4e9 = 32 GB); LoRA at
``--estimate-lora-rank`` on every linear layer of Qwen3-4B's shapes keeps the adapter's parameters only.

    .venv/bin/python benchmarks/step_overhead.py                   # builtin shape, 8 groups of 8, 1 update
    .venv/bin/python benchmarks/step_overhead.py --lora --repeat 3

Prints one JSON line; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.chat import render_tiny
from agent.checkpoints import save_atomically
from agent.tiny import build_model, train_tokenizer
from agent.transformers_engine import load_policy
from coevolve.config import PipelineConfig, PolicyConfig
from coevolve.optional import optional_module
from coevolve.records import Message, Trajectory
from tasks.training.grpo_groups import group_round
from tasks.update import grpo_update

grpo_trainer = optional_module("tasks.training.grpo_trainer")
grpo_resume = optional_module("tasks.training.grpo_resume")
datasets = optional_module("datasets")

# Qwen3-4B: 36 layers, hidden 2560, 32 query and 8 key/value heads of 128, MLP 9728. (in, out) of each linear layer.
QWEN3_4B_LAYERS = 36
QWEN3_4B_LINEAR = [(2560, 4096), (2560, 1024), (2560, 1024), (4096, 2560), (2560, 9728), (2560, 9728), (9728, 2560)]


def _policy(out: Path, hidden: int, layers: int, vocab: int) -> tuple[Path, int]:
    """A random-init tiny policy and the size of its vocabulary (BPE stops early on little text)."""
    texts = [
        render_tiny([Message("user", f"make a folder d{i}"), Message("assistant", f"[mkdir(dir_name='d{i}')]")], False)
        for i in range(400)
    ]
    tokenizer = train_tokenizer(texts, vocab_size=vocab)
    build_model(tokenizer, PolicyConfig(hidden_size=hidden, num_layers=layers), seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, len(tokenizer)


def _groups(groups: int, group_size: int, completion_tokens: int, vocab: int) -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(32)]
        for sample in range(group_size):
            out.append(
                Trajectory(
                    run_id="bench", round=0, task_id=f"t-{g:03d}", sample=sample, steps=[], prompt_ids=prompt,
                    completion_ids=[rng.randrange(vocab) for _ in range(completion_tokens)],
                    completion_mask=[1] * completion_tokens, logprobs=[-7.0] * completion_tokens,
                    reward=float(sample % 2), success=bool(sample % 2), finish_reason="done",
                )
            )  # fmt: skip
    return out


def _timed(what: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = what()
    return time.perf_counter() - started, value


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _build(checkpoint: Path, trajectories: list[Trajectory], config: PipelineConfig, scratch: str) -> Any:
    """The trainer tasks/training/grpo_trainer.train builds, on a fresh copy of the checkpoint's policy."""
    round_groups = group_round(trajectories, config.rollout.group_size)
    model, tokenizer = load_policy(checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = grpo_trainer.ReplayGRPOTrainer(
            model=model,
            reward_funcs=[grpo_trainer.stored_reward],
            args=grpo_trainer.grpo_arguments(config, round_groups, 1, scratch),
            train_dataset=datasets.Dataset.from_dict({"prompt": list(round_groups.slots)}),
            processing_class=tokenizer,
            rollout_func=grpo_trainer.StoredRollouts(round_groups, tokenizer.pad_token_id),
            peft_config=grpo_trainer.lora_config(config),
        )
    trainer.remove_callback(grpo_trainer.PrinterCallback)
    return trainer


def measure_once(policy: Path, trajectories: list[Trajectory], config: PipelineConfig, work: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    lora = config.training.use_lora
    figures["policy_load_s"], _ = _timed(lambda: load_policy(policy))
    with tempfile.TemporaryDirectory() as scratch:
        figures["trainer_build_s"], trainer = _timed(lambda: _build(policy, trajectories, config, scratch))
        figures["update_s"], _ = _timed(trainer.train)
        state = work / "state"
        figures["state_save_s"], _ = _timed(lambda: grpo_resume.save_trainer_state(trainer, state))
        write = functools.partial(grpo_trainer.write_trained, trainer.model, trainer.processing_class, lora, None)
        figures["checkpoint_save_s"], _ = _timed(lambda: save_atomically(work / "checkpoint", write))
        fresh = _build(policy, trajectories, config, scratch)
        fresh.create_optimizer_and_scheduler(num_training_steps=config.training.updates_per_batch)
        figures["state_load_s"], _ = _timed(lambda: fresh._load_optimizer_and_scheduler(str(state)))
    figures["state_bytes"] = _size(state)
    figures["checkpoint_bytes"] = _size(work / "checkpoint")
    # Whole steps as the stage runs them: the first from checkpoint 0, the second resuming its state.
    first = grpo_update(policy, trajectories, config, work / "step-1")
    second = grpo_update(work / "step-1", trajectories, config, work / "step-2", state_expected=True)
    assert second["optimizer_resumed_from"] is not None and second["global_step"] == 2 * first["global_step"]
    figures["step_fresh_s"], figures["step_resumed_s"] = first["duration_s"], second["duration_s"]
    return figures


def estimate_4b(disk_gb_s: float, lora_rank: int) -> dict[str, float]:
    """Save (or load) seconds of the trainer state of a 4B model at ``disk_gb_s``, full fine-tuning and LoRA."""
    full_bytes = 2 * 4 * 4e9  # two fp32 AdamW moments per parameter
    lora_params = QWEN3_4B_LAYERS * sum(lora_rank * (i + o) for i, o in QWEN3_4B_LINEAR)
    lora_bytes = 2 * 4 * lora_params  # the moments of the adapter's fp32 parameters only
    return {
        "full_state_gb": full_bytes / 1e9,
        "full_state_s": full_bytes / (disk_gb_s * 1e9),
        "full_weights_bf16_s": 2 * 4e9 / (disk_gb_s * 1e9),
        "lora_params_m": lora_params / 1e6,
        "lora_state_gb": lora_bytes / 1e9,
        "lora_state_s": lora_bytes / (disk_gb_s * 1e9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--updates", type=int, default=1, help="optimizer steps of the step (updates_per_batch)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (rank 16) instead of full weights")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median of each figure is kept")
    parser.add_argument("--disk-gb-s", type=float, default=1.0, help="disk bandwidth of the 4B estimate, GB/s")
    parser.add_argument("--estimate-lora-rank", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="step-overhead-") as tmp:
        root = Path(tmp)
        policy, vocab = _policy(root / "checkpoint-0", args.hidden, args.layers, args.vocab)
        trajectories = _groups(args.groups, args.group_size, args.completion_tokens, vocab)
        config = PipelineConfig(
            state_dir=root,
            rollout={"group_size": args.group_size, "temperature": 1.0},
            training={"updates_per_batch": args.updates, "use_lora": args.lora, "lora_rank": 16},
        )
        runs = [measure_once(policy, trajectories, config, root / f"run-{i}") for i in range(args.repeat)]
        parameters = sum(p.numel() for p in load_policy(policy)[0].parameters())
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in medians.items()}
    estimate = {k: round(v, 2) for k, v in estimate_4b(args.disk_gb_s, args.estimate_lora_rank).items()}
    print(
        json.dumps(
            {
                "parameters": parameters,
                "lora": args.lora,
                "groups": args.groups,
                "group_size": args.group_size,
                "updates": args.updates,
                **rounded,
                "estimate_4b": estimate,
                "disk_gb_s": args.disk_gb_s,
            }
        )
    )


if __name__ == "__main__":
    main()
