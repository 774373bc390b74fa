"""Warm-up of a pretrained policy: supervised fine-tuning on the environment's demonstrations before GRPO.

A pretrained chat model that has never seen the environment's call format answers in prose, solves no task,
and gives GRPO only flat groups, so no update happens. The builtin tiny policy learns the format from
demonstrations (agent/tiny.py); `warm_up` gives a pretrained model the same: the same demonstrations
(tasks/splits.sft_demonstrations, none of them a task of D_0 or a held-out split), rendered with the model's
own chat template and masked to the assistant's tokens, fine-tuned by the same SFT recipe (`agent.tiny.sft`,
TRL's ``SFTTrainer``) with the warm-up's own steps, rate and batch (``policy.warmup_*``).

Round 0 runs it when ``policy.warmup_steps`` is above 0 and starts GRPO from its output (tasks/prepare.py).
The output folder holds a marker with the digest of every input (the model's files or name, the
demonstrations, the settings and seed), and a second call with the same inputs returns at once.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.chat import ChatFormat
from agent.checkpoints import checkpoint_digest, checkpoint_folder, save_atomically
from agent.tiny import MAX_SEQ_LEN, sft
from coevolve.config import PolicyConfig
from coevolve.config.policy import WARMUP_SETTINGS
from coevolve.optional import optional_module
from coevolve.records import Message, digest

torch = optional_module("torch")
transformers = optional_module("transformers")

MARKER = "warmup.json"

log = logging.getLogger(__name__)


def warmup_digest(model: str, conversations: Sequence[Sequence[Message]], config: PolicyConfig, seed: int) -> str:
    """What a warm-up's output depends on: the starting model's files, the demonstrations, settings and seed."""
    source = checkpoint_folder(model)
    return digest(
        {
            "model": checkpoint_digest(source),
            "conversations": [[(m.role, m.content) for m in conv] for conv in conversations],
            "settings": {f: getattr(config, f) for f in WARMUP_SETTINGS},
            "seed": seed,
            "version": 1,
        }
    )


def is_warmed(out_dir: Path, expected_digest: str) -> bool:
    marker = Path(out_dir) / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("digest") == expected_digest
    except (OSError, json.JSONDecodeError):
        return False


def warm_up(model: str, models_dir: Path, conversations: list[list[Message]], config: PolicyConfig, seed: int) -> Path:
    """Fine-tune ``model`` on the demonstrations for ``config.warmup_steps`` steps; return the folder it is in.

    The folder is ``models_dir/warmup-<digest of the inputs>``, so other inputs never find this one; it is returned
    at once when it already holds a warm-up of the same inputs. The inputs are digested once (the model's files
    included, hundreds of MB for a real model).
    """
    expected = warmup_digest(model, conversations, config, seed)
    out_dir = Path(models_dir) / f"warmup-{expected[:12]}"
    if is_warmed(out_dir, expected):
        return out_dir
    if not conversations:
        raise ValueError("warm_up needs at least one demonstration conversation.")
    log.info("checkpoint 0: %s warmed up by %d SFT steps into %s", model, config.warmup_steps, out_dir)
    started = time.perf_counter()
    torch.set_num_threads(config.torch_threads)
    source = checkpoint_folder(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    policy = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    chat = ChatFormat(tokenizer)
    examples = [chat.training_example(conv) for conv in conversations]
    examples = [(ids[:MAX_SEQ_LEN], mask[:MAX_SEQ_LEN]) for ids, mask in examples]
    # The tiny policy's recipe, with the warm-up's length, rate and batch: a pretrained model needs a rate
    # two orders below a random-init one and far fewer steps to learn a format.
    recipe = config.model_copy(
        update={
            "sft_steps": config.warmup_steps,
            "sft_learning_rate": config.warmup_learning_rate,
            "sft_batch_size": config.warmup_batch_size,
        }
    )
    losses = sft(policy, tokenizer, examples, recipe, seed)
    summary = {
        "digest": expected,
        "source": model,
        "conversations": len(conversations),
        "warmup_steps": config.warmup_steps,
        # TRL's logged losses: each the mean over warmup_steps // 40 steps (agent.tiny.sft).
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "duration_s": round(time.perf_counter() - started, 2),
    }
    save_atomically(out_dir, functools.partial(_write_warmed, policy, tokenizer, summary))
    return out_dir


def _write_warmed(policy: Any, tokenizer: Any, summary: dict[str, Any], folder: Path) -> None:
    """Weights, tokenizer, and last the warm-up report that marks the folder finished."""
    folder.mkdir()
    policy.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps(summary, indent=2))
