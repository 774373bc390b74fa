"""Rollout overhead: model tokens/s through `tasks.rollout.play_episodes` against the engine's raw `generate`.

Plays BFCL episodes greedily with a tiny policy while recording every batch the rollout loop sends
to the engine, then replays exactly those batches through ``engine.generate`` alone. Greedy
decoding makes the replay produce the same tokens, so the ratio of the two rates is the share of
engine throughput that survives the rollout's own work (environment steps, parsing, token
bookkeeping). Goal: at least 0.9.

    .venv/bin/python benchmarks/rollout.py                      # transformers engine
    .venv/bin/python benchmarks/rollout.py --base-url http://127.0.0.1:8000/v1 --served-model DIR

Prints one JSON line; the figures are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agent.http_engine import OpenAICompatibleEngine
from agent.tiny import build_tiny_policy
from agent.transformers_engine import TransformersEngine
from coevolve.config import EnvironmentConfig, PolicyConfig
from envs.registry import make_environment
from tasks.rollout import play_episodes


class RecordingEngine:
    """Passes calls to an engine and keeps every batch of prompts it was asked to continue."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.chat = engine.chat
        self.batches: list[list[list[int]]] = []
        self.generate_s = 0.0

    def generate(self, prompts, temperature, max_new_tokens, seeds=None):
        self.batches.append([list(p) for p in prompts])
        started = time.perf_counter()
        out = self.engine.generate(prompts, temperature=temperature, max_new_tokens=max_new_tokens, seeds=seeds)
        self.generate_s += time.perf_counter() - started
        return out


def build_policy(out_dir: Path, tasks, sft_steps: int, env_config) -> Path:
    env = make_environment(env_config)
    conversations = [env.demonstration(task) for task in tasks]
    return build_tiny_policy(out_dir, conversations, PolicyConfig(sft_steps=sft_steps), seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="both rates are the best of this many runs")
    parser.add_argument("--model", help="a checkpoint folder; default builds the tiny policy on the tasks")
    parser.add_argument("--base-url", help="use the OpenAI-compatible engine on this server instead of transformers")
    parser.add_argument("--served-model")
    args = parser.parse_args()

    env_config = EnvironmentConfig()
    build_tasks = make_environment(env_config).build_tasks
    tasks = build_tasks(args.tasks, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        model = (
            Path(args.model)
            if args.model
            else build_policy(Path(tmp) / "tiny", build_tasks(200, seed=8), args.sft_steps, env_config)
        )
        if args.base_url:
            engine = OpenAICompatibleEngine(args.base_url, args.served_model or str(model), tokenizer_path=model)
            name = "openai"
        else:
            engine = TransformersEngine(model, torch_threads=1, seed=0)
            name = "transformers"
        engine.generate([engine.chat.encode("warm up")], temperature=0.0, max_new_tokens=4)

        rollout_s = raw_s = float("inf")
        for _ in range(args.repeats):
            recorder = RecordingEngine(engine)
            started = time.perf_counter()
            trajectories = play_episodes(
                recorder, tasks, samples=args.samples, temperature=0.0, max_new_tokens=args.max_new_tokens,
                env_config=env_config, run_id="bench", round_=0, progress=False,
            )  # fmt: skip
            if time.perf_counter() - started < rollout_s:
                rollout_s = time.perf_counter() - started
                generate_s = recorder.generate_s
            model_tokens = sum(sum(t.completion_mask) for t in trajectories)

            started = time.perf_counter()
            replayed = sum(
                len(g.token_ids)
                for batch in recorder.batches
                for g in engine.generate(batch, temperature=0.0, max_new_tokens=args.max_new_tokens)
            )
            raw_s = min(raw_s, time.perf_counter() - started)

    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    print(json.dumps({
        "engine": name, "episodes": len(trajectories), "generate_calls": len(recorder.batches),
        "finish_reasons": reasons, "model_tokens": model_tokens, "replayed_tokens": replayed,
        "rollout_s": round(rollout_s, 2), "generate_share_of_rollout": round(generate_s / rollout_s, 3),
        "rollout_tokens_per_s": round(model_tokens / rollout_s, 1), "raw_tokens_per_s": round(replayed / raw_s, 1),
        "ratio": round((model_tokens / rollout_s) / (replayed / raw_s), 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
