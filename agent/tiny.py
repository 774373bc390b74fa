"""The builtin tiny policy: a small Qwen3 built offline from demonstrations.

No model hub is reachable, so 'builtin:tiny' trains its own byte-level BPE tokenizer on the
demonstrations' text, initializes a small Qwen3 at random and teaches it the tool-call format by
supervised fine-tuning on assistant tokens only, with TRL's ``SFTTrainer``. A few hundred steps give
partial skill: enough that GRPO groups mix successes and failures, which is what makes a round produce signal.

The build is idempotent: out_dir holds a marker with a digest of every input (the demonstrations, the
model and SFT settings, the seed and the recipe's own code, `recipe_code_digest`), and a second call with
the same inputs returns at once.
"""

from __future__ import annotations

import ast
import functools
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.chat import END_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, TINY_CHAT_TEMPLATE, ChatFormat, render_tiny
from agent.checkpoints import save_atomically
from coevolve.config import PolicyConfig
from coevolve.optional import optional_module
from coevolve.records import Message, digest

datasets = optional_module("datasets")
tokenizers = optional_module("tokenizers")
torch = optional_module("torch")
transformers = optional_module("transformers")
trl = optional_module("trl")

MARKER = "tiny_policy.json"
MAX_SEQ_LEN = 2048
WARMUP_FRACTION = 0.05
# The code the build's output depends on: this module (tokenizer, model, SFT) and the chat format the
# demonstrations are rendered and masked with. The demonstrations themselves are digested as data.
RECIPE_MODULES = (Path(__file__).resolve(), Path(__file__).resolve().with_name("chat.py"))


def _code_shape(node: Any) -> Any:
    """A syntax tree as nested lists, without docstrings and without the empty fields newer Pythons add.

    Comments, formatting and docstrings do not change what the recipe computes; ``ast.dump`` itself is not
    stable across Python releases (3.12 adds ``type_params=[]`` to every function), this shape is.
    """
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if name == "body" and isinstance(value, list) and _has_docstring(node):
                value = value[1:]
            if value is None or value == []:
                continue
            fields.append([name, _code_shape(value)])
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_code_shape(item) for item in node]
    return repr(node)


def _has_docstring(node: ast.AST) -> bool:
    return isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (
        ast.get_docstring(node, clean=False) is not None
    )


def code_digest(paths: Sequence[Path]) -> str:
    """Digest of Python source files, blind to comments, docstrings and formatting."""
    return digest([_code_shape(ast.parse(path.read_text(encoding="utf-8"))) for path in paths])


@functools.cache
def recipe_code_digest() -> str:
    """Digest of the recipe's code (`RECIPE_MODULES`)."""
    return code_digest(RECIPE_MODULES)


def build_digest(conversations: Sequence[Sequence[Message]], config: PolicyConfig, seed: int) -> str:
    """What a build's output depends on: demonstrations, the model and SFT settings, seed and recipe code."""
    fields = ("sft_steps", "sft_learning_rate", "sft_batch_size", "hidden_size", "num_layers", "vocab_size")
    return digest(
        {
            "conversations": [[(m.role, m.content) for m in conv] for conv in conversations],
            "config": {f: getattr(config, f) for f in fields},
            "seed": seed,
            "recipe": recipe_code_digest(),
            "version": 3,
        }
    )


def is_built(out_dir: Path, conversations: Sequence[Sequence[Message]], config: PolicyConfig, seed: int) -> bool:
    marker = Path(out_dir) / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("digest") == build_digest(conversations, config, seed)
    except (OSError, json.JSONDecodeError):
        return False


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer whose chat template is the tiny template.

    Newlines are isolated before the byte-level split, so message boundaries stay token boundaries
    (see agent.chat).
    """
    core = tokenizers.Tokenizer(tokenizers.models.BPE())
    core.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split("\n", behavior="isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    core.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=END_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (END_TOKEN, PAD_TOKEN)],
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_model(tokenizer: Any, config: PolicyConfig, seed: int) -> Any:
    """A random-init Qwen3 sized by the config: few heads, a narrow MLP, tied embeddings."""
    torch.manual_seed(seed)
    heads = max(1, config.hidden_size // 32)
    model_config = transformers.Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.hidden_size * 3,
        num_hidden_layers=config.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2) if heads % 2 == 0 else heads,
        head_dim=config.hidden_size // heads,
        max_position_embeddings=MAX_SEQ_LEN * 2,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(END_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        bos_token_id=None,
    )
    return transformers.Qwen3ForCausalLM(model_config).float()


def sft(
    model: Any, tokenizer: Any, examples: list[tuple[list[int], list[int]]], config: PolicyConfig, seed: int
) -> list[float]:
    """Supervised fine-tuning with TRL's ``SFTTrainer`` on assistant tokens only; returns the logged losses.

    TRL logs the loss every ``sft_steps // 40`` steps, as the mean over those steps; the list holds them in order.

    The examples are already token ids with an assistant mask (``ChatFormat.training_example``), so SFT
    sees exactly the token sequences rollouts later produce; TRL turns the mask into labels and its
    fused head scores only the supervised positions. The schedule is a linear warmup then cosine decay
    to a tenth of the peak rate.
    """
    losses: list[float] = []

    # transformers is imported on first use (coevolve.optional), so mypy cannot see the base class; a comment, not a
    # code change, because the recipe's digest (recipe_code_digest) covers this module's code.
    class _Losses(transformers.TrainerCallback):  # type: ignore[name-defined]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    dataset = datasets.Dataset.from_dict(
        {"input_ids": [ids for ids, _ in examples], "assistant_masks": [mask for _, mask in examples]}
    )
    with tempfile.TemporaryDirectory(prefix="coevolve-sft-") as scratch:
        args = trl.SFTConfig(
            output_dir=scratch,
            max_steps=config.sft_steps,
            per_device_train_batch_size=min(config.sft_batch_size, len(examples)),
            learning_rate=config.sft_learning_rate,
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": 0.1},
            warmup_steps=max(1, int(config.sft_steps * WARMUP_FRACTION)),
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_length=MAX_SEQ_LEN,
            logging_steps=max(1, config.sft_steps // 40),
            save_strategy="no",
            report_to="none",
            seed=seed,
            data_seed=seed,
            use_cpu=not torch.cuda.is_available(),
            dataloader_num_workers=0,
            disable_tqdm=False,
            # The tiny model is float32 end to end: mixed precision would change checkpoint 0 across machines.
            bf16=False,
            fp16=False,
        )
        trainer = trl.SFTTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[_Losses()]
        )
        trainer.train()
    model.eval()
    return losses


def build_tiny_policy(out_dir: Path, conversations: list[list[Message]], config: PolicyConfig, seed: int) -> Path:
    """Train tokenizer + random-init Qwen3 + SFT on the conversations; save to out_dir and return it.

    Returns at once when out_dir already holds a model built from the same inputs.
    """
    out_dir = Path(out_dir)
    if is_built(out_dir, conversations, config, seed):
        return out_dir
    if not conversations:
        raise ValueError("build_tiny_policy needs at least one demonstration conversation.")

    started = time.perf_counter()
    torch.set_num_threads(config.torch_threads)
    tokenizer = train_tokenizer(
        [render_tiny(conv, add_generation_prompt=False) for conv in conversations], config.vocab_size
    )
    chat = ChatFormat(tokenizer)
    examples = [chat.training_example(conv) for conv in conversations]
    examples = [(ids[:MAX_SEQ_LEN], mask[:MAX_SEQ_LEN]) for ids, mask in examples]
    model = build_model(tokenizer, config, seed)
    losses = sft(model, tokenizer, examples, config, seed) if config.sft_steps else []

    model.generation_config.eos_token_id = chat.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    summary = {
        "digest": build_digest(conversations, config, seed),
        "conversations": len(conversations),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "sft_steps": config.sft_steps,
        # TRL's last logged loss: the mean over the final sft_steps // 40 steps.
        "final_loss": losses[-1] if losses else None,
        "duration_s": round(time.perf_counter() - started, 2),
    }
    # Written beside out_dir and swapped in, so an interrupted build never looks finished.
    save_atomically(out_dir, functools.partial(_write_policy, model, tokenizer, summary))
    return out_dir


def _write_policy(model: Any, tokenizer: Any, summary: dict[str, Any], folder: Path) -> None:
    """The policy's checkpoint folder: weights, tokenizer, and last the build report that marks it finished."""
    folder.mkdir()
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps(summary, indent=2))
