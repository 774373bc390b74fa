"""GPU smoke test: the pipeline's GPU path end to end in a few minutes, with throughput figures.

On a machine with one NVIDIA GPU, ``make gpu-smoke`` builds the two GPU environments and runs this
script. It checks, on the builtin tiny policy (`agent.tiny.build_tiny_policy`, trained here in
seconds) or on a local model folder (``--model PATH``; no hub is contacted):

1. engine 'vllm': `agent.vllm_engine.VLLMEngine` in-process, dtype ``auto`` (bf16 on the GPU for a
   float32 checkpoint), the round's sampling (seeded requests, behaviour logprobs, prefix caching);
2. standalone ``vllm.LLM.generate`` on the same model, prompts, seeds and stop token, with the same
   engine flags but no logprobs or prefix caching: what the engine's wrapper costs;
3. engine 'openai': a server started the way ``coevolve serve`` starts it (`agent.serve.start_server`),
   the pipeline's `OpenAICompatibleEngine` through `agent.engines.make_engine`, and the mean
   difference between served logprobs and a local transformers forward pass of the same checkpoint;
4. the update stage under torchrun with one process (``training.launcher: torchrun``,
   ``num_processes: 1``; `tasks.training.launch.launch_update`), for ``--rounds`` rounds, each on the previous
   round's checkpoint, trained on the in-process engine's samples with alternating rewards so every
   group has reward variance.

It prints one JSON line per part and a summary: generated tokens per second of each engine, the
engine 'vllm' / standalone ratio, and update seconds per round.

Interpreters: the pipeline's own environment runs this script (it needs trl, prefect and the rest);
vLLM runs in the environment that has it, as child processes (``--vllm-python``; default: this
interpreter if it imports vllm, else ``.venv-gpu-vllm``, else ``.venv-vllm``). Each vLLM part runs in
its own process, so the GPU memory of one is free before the next starts. On the GPU machine
``make gpu-smoke`` builds ``.venv-gpu`` (the project) and ``.venv-gpu-vllm`` (vLLM's CUDA build):
vLLM pins a fastapi older than the one prefect 3.8.8 needs, so the two cannot share one environment.

Without CUDA the script refuses to run, unless ``--allow-cpu`` is given: then the same script runs
on the CPU build here (``.venv`` plus ``.venv-vllm``; figures in benchmarks/README.md):

    .venv/bin/python benchmarks/gpu_smoke.py --allow-cpu
    .venv-gpu/bin/python benchmarks/gpu_smoke.py --model /models/Qwen3-0.6B   # on a GPU machine
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SYSTEM = "Tools: mkdir(dir_name), cd(folder), touch(file_name), ls(). Reply with calls in brackets, or done."
REQUESTS = [
    ("make a folder {name} and enter it", "[mkdir(dir_name='{name}'), cd(folder='{name}')]"),
    ("create the file {name}.txt", "[touch(file_name='{name}.txt')]"),
    ("go into the {name} folder", "[cd(folder='{name}')]"),
    ("list the {name} folder", "[cd(folder='{name}'), ls()]"),
]
NAMES = ["temp", "docs", "logs", "data", "src", "notes", "build", "cache"]
TEMPERATURE = 0.9


# --- the model and the prompts ----------------------------------------------------------------------


def _conversations() -> list:
    from coevolve.records import Message

    return [
        [Message("system", SYSTEM), Message("user", request.format(name=name)),
         Message("assistant", calls.format(name=name)), Message("tool", "ok"), Message("assistant", "done")]
        for request, calls in REQUESTS
        for name in NAMES
    ]  # fmt: skip


def builtin_policy(out_dir: Path, sft_steps: int) -> Path:
    """The builtin tiny policy (default shape), trained briefly on templated tool calls."""
    from agent.tiny import build_tiny_policy
    from coevolve.config import PolicyConfig

    return build_tiny_policy(out_dir, _conversations(), PolicyConfig(sft_steps=sft_steps), seed=0)


def make_prompts(model: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from agent.chat import ChatFormat
    from coevolve.records import Message

    chat = ChatFormat(AutoTokenizer.from_pretrained(str(model)))
    requests = [
        request.format(name=f"{name}{i}") for i in range(count) for request, _ in REQUESTS for name in NAMES[:1]
    ]
    return [chat.prompt_ids([Message("system", SYSTEM), Message("user", text)]) for text in requests[:count]]


# --- vLLM parts, each in a process of the vLLM interpreter ------------------------------------------


def _tokens_per_s(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 1) if seconds > 0 else 0.0


def part_engine(job: dict[str, Any]) -> dict[str, Any]:
    """Engine 'vllm' as the pipeline builds it: VLLMEngine, seeded requests with behaviour logprobs."""
    from agent.vllm_engine import VLLMEngine

    started = time.perf_counter()
    engine = VLLMEngine(
        job["model"],
        seed=0,
        dtype=job["dtype"],
        max_model_len=job["max_model_len"],
        gpu_memory_utilization=job["gpu_memory_utilization"],
    )
    start_s = time.perf_counter() - started
    try:
        batch, seeds = job["batch"], job["seeds"]
        engine.generate(batch[:4], TEMPERATURE, 8, seeds[:4])  # warm-up
        started = time.perf_counter()
        generations = engine.generate(batch, TEMPERATURE, job["max_new_tokens"], seeds)
        seconds = time.perf_counter() - started
        dtype = str(engine.llm.llm_engine.model_config.dtype).removeprefix("torch.")
    finally:
        engine.close()
    tokens = sum(len(g.token_ids) for g in generations)
    return {
        "part": "engine vllm (VLLMEngine)", "dtype": dtype, "start_s": round(start_s, 1), "requests": len(batch),
        "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": _tokens_per_s(tokens, seconds),
        "generations": [{"token_ids": g.token_ids, "logprobs": g.logprobs} for g in generations],
    }  # fmt: skip


def part_standalone(job: dict[str, Any]) -> dict[str, Any]:
    """Plain ``vllm.LLM.generate``: same model, prompts, seeds and stop token; no logprobs, no prefix caching."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from agent.chat import ChatFormat
    from agent.vllm_engine import _whole_prefills_on_cpu

    eos = ChatFormat(AutoTokenizer.from_pretrained(job["model"])).eos_token_id
    args = {"dtype": job["dtype"], "gpu_memory_utilization": job["gpu_memory_utilization"], "enforce_eager": True}
    if job["max_model_len"] is not None:
        args["max_model_len"] = job["max_model_len"]
    # The CPU build needs whole prefills for seeded requests, as the engine does; nothing on a GPU.
    args.update(_whole_prefills_on_cpu(job["model"], args))
    started = time.perf_counter()
    llm = LLM(model=job["model"], seed=0, **args)
    start_s = time.perf_counter() - started
    batch, seeds = job["batch"], job["seeds"]

    def params(seed: int, tokens: int) -> Any:
        return SamplingParams(
            temperature=TEMPERATURE, max_tokens=tokens, seed=seed, stop_token_ids=[eos], detokenize=False
        )

    prompts = [TokensPrompt(prompt_token_ids=p) for p in batch]
    llm.generate(prompts[:4], [params(s, 8) for s in seeds[:4]], use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.generate(prompts, [params(s, job["max_new_tokens"]) for s in seeds], use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "part": "standalone vllm.LLM.generate", "start_s": round(start_s, 1), "requests": len(batch), "tokens": tokens,
        "seconds": round(seconds, 3), "tokens_per_s": _tokens_per_s(tokens, seconds),
    }  # fmt: skip


def vllm_python(given: str | None) -> Path:
    """The interpreter that runs the vLLM parts and the server (see the module docstring)."""
    if given:
        return Path(given)
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    for venv in (".venv-gpu-vllm", ".venv-vllm"):
        candidate = REPO / venv / "bin" / "python"
        if candidate.is_file():
            return candidate
    raise SystemExit(
        "No interpreter with vLLM: run `make gpu-smoke` (GPU) or `make setup-vllm` (CPU), or pass --vllm-python."
    )


def run_part(python: Path, part: str, job: dict[str, Any], work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run ``part`` of this script under ``python``; its output goes to ``<work>/<part>.log``."""
    job_file, out_file, log = work / f"{part}.json", work / f"{part}.out.json", work / f"{part}.log"
    job_file.write_text(json.dumps(job))
    with log.open("w") as handle:
        code = subprocess.run(
            [str(python), str(Path(__file__).resolve()), "--part", part, str(job_file), str(out_file)],
            env=env, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, check=False,
        ).returncode  # fmt: skip
    if code != 0:
        raise SystemExit(f"The {part} part failed ({code}); the end of {log}:\n{log.read_text()[-4000:]}")
    return json.loads(out_file.read_text())


# --- engine 'openai' on a server started as `coevolve serve` starts it --------------------------------


def part_server(model: Path, job: dict[str, Any], python: Path, work: Path, cuda: bool) -> dict[str, Any]:
    from agent.engines import make_engine
    from agent.http_engine import local_logprobs, logprob_difference
    from agent.serve import ServeOptions, base_url, free_port, start_server, stop_server, wait_until_ready
    from coevolve.config import PipelineConfig

    options = ServeOptions(
        model=str(model), dtype=job["dtype"], max_model_len=job["max_model_len"], seed=0, cpu=not cuda, port=free_port()
    )
    log = work / "server.log"
    started = time.perf_counter()
    process = start_server(options, log, python=python)
    try:
        wait_until_ready(process, base_url(options), log, timeout_s=900)
        start_s = time.perf_counter() - started
        # The logprob check is reported below instead of enforced: a half-precision server differs from
        # a float32 local pass by more than the float32 tolerance.
        config = PipelineConfig(
            state_dir=work / "state",
            rollout={
                "engine": "openai",
                "base_url": base_url(options),
                "logprob_tolerance": None,
                "vllm_dtype": job["dtype"],
            },
        )
        with make_engine(model, config) as engine:
            batch, seeds = job["batch"], job["seeds"]
            engine.generate(batch[:4], TEMPERATURE, 8, seeds[:4])  # warm-up
            started = time.perf_counter()
            generations = engine.generate(batch, TEMPERATURE, job["max_new_tokens"], seeds)
            seconds = time.perf_counter() - started
    finally:
        stop_server(process)
    import torch

    from agent.transformers_engine import load_policy

    policy = load_policy(model)[0].to("cuda" if cuda else "cpu")
    picked = [i for i, g in enumerate(generations) if g.token_ids][:8]
    local = local_logprobs(policy, [batch[i] for i in picked], [generations[i].token_ids for i in picked], TEMPERATURE)
    difference = logprob_difference([generations[i].logprobs for i in picked], local)
    del policy
    if cuda:
        torch.cuda.empty_cache()
    tokens = sum(len(g.token_ids) for g in generations)
    return {
        "part": "engine openai (coevolve serve)", "start_s": round(start_s, 1), "requests": len(batch),
        "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": _tokens_per_s(tokens, seconds),
        "logprob_mean_abs_diff_vs_float32_local": round(difference, 5),
    }  # fmt: skip


# --- the update stage under torchrun, one process --------------------------------------------------


def part_update(
    model: Path, batch: list[list[int]], samples: int, generations: list[dict], rounds: int, work: Path
) -> dict[str, Any]:
    from agent.checkpoints import trainer_state_to_resume
    from coevolve.config import PipelineConfig
    from coevolve.records import Trajectory
    from tasks.common import open_warehouse
    from tasks.training.grpo_groups import group_round
    from tasks.training.launch import launch_update

    config = PipelineConfig(
        run_id="gpu-smoke", state_dir=work / "update-state", seed=0,
        rollout={"group_size": samples, "temperature": TEMPERATURE},
        training={"updates_per_batch": 2, "kl_reference": "round", "launcher": "torchrun", "num_processes": 1},
    )  # fmt: skip
    results, checkpoint = [], model
    for round_ in range(rounds):
        trajectories = []
        for index, (prompt, generation) in enumerate(zip(batch, generations, strict=True)):
            tokens = generation["token_ids"] or [0]
            logprobs = generation["logprobs"] or [0.0]
            reward = float(index % samples % 2)  # half of every group succeeds: each group has reward variance
            trajectories.append(
                Trajectory(
                    run_id=config.run_id, round=round_, task_id=f"t-{index // samples:03d}", sample=index % samples,
                    steps=[], prompt_ids=list(prompt), completion_ids=list(tokens), completion_mask=[1] * len(tokens),
                    logprobs=list(logprobs), reward=reward, success=reward > 0, finish_reason="done",
                )
            )  # fmt: skip
        with open_warehouse(config) as wh:
            wh.write_trajectories(trajectories)
        out = work / "checkpoints" / f"round-{round_ + 1:03d}"
        started = time.perf_counter()
        # One optimizer across the rounds, as the update stage carries it (training.carry_optimizer).
        resume = trainer_state_to_resume(Path(checkpoint), expected=round_ > 0)
        stats = launch_update(
            Path(checkpoint), group_round(trajectories, samples), config, round_, out, resume_from=resume
        )
        wall = time.perf_counter() - started
        if stats.get("skipped"):
            raise SystemExit(f"The update of round {round_} was skipped: {stats.get('reason')}")
        results.append(
            {
                "round": round_,
                "wall_s": round(wall, 2),
                "train_s": stats["duration_s"],
                "steps": stats["steps"],
                "launcher": stats["launcher"],
            }
        )
        checkpoint = out
    return {
        "part": "update (torchrun, 1 process)",
        "rounds": results,
        "update_s_per_round": round(sum(r["wall_s"] for r in results) / len(results), 2),
    }


# --- main ------------------------------------------------------------------------------------------


def _child_env(cuda: bool) -> dict[str, str]:
    """Offline, loopback-only environment of the vLLM children (as `coevolve serve` gets)."""
    from agent.serve import ServeOptions, server_env

    env = server_env(ServeOptions(model=".", cpu=not cuda))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a local model folder (default: the builtin tiny policy, built here)")
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run without CUDA (the CPU build of vLLM): checks the script, not a GPU",
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (a GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="update rounds to time")
    parser.add_argument(
        "--dtype", default="auto", help="vLLM dtype; auto serves a float32 checkpoint in half precision (bf16)"
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--sft-steps", type=int, default=60, help="SFT steps of the builtin tiny policy")
    parser.add_argument("--vllm-python", help="interpreter with vLLM (default: see the module docstring)")
    parser.add_argument("--work-dir", help="keep models, logs and checkpoints here (default: a temporary folder)")
    args = parser.parse_args()

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(
            "gpu_smoke: CUDA is not available to torch in this environment, so there is no GPU path to check. "
            "Run it on a machine with an NVIDIA GPU (make gpu-smoke), or pass --allow-cpu to run the same steps on "
            "the CPU build.",
            file=sys.stderr,
        )
        return 2
    python = vllm_python(args.vllm_python)
    work_root = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    work_root.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(
        json.dumps(
            {"device": device, "torch": torch.__version__, "vllm_python": str(python), "work_dir": str(work_root)}
        ),
        flush=True,
    )

    started = time.perf_counter()
    model = Path(args.model).resolve() if args.model else builtin_policy(work_root / "tiny-policy", args.sft_steps)
    print(
        json.dumps({"part": "model", "model": str(model), "build_s": round(time.perf_counter() - started, 1)}),
        flush=True,
    )
    prompts = make_prompts(model, args.prompts)
    batch = [p for p in prompts for _ in range(args.samples)]
    job = {
        "model": str(model), "batch": batch, "seeds": list(range(len(batch))), "max_new_tokens": args.max_new_tokens,
        "dtype": args.dtype, "max_model_len": args.max_model_len, "gpu_memory_utilization": args.gpu_memory_utilization,
    }  # fmt: skip
    env = _child_env(cuda)

    engine = run_part(python, "engine", job, work_root, env)
    generations = engine.pop("generations")
    print(json.dumps(engine), flush=True)
    standalone = run_part(python, "standalone", job, work_root, env)
    print(json.dumps(standalone), flush=True)
    served = part_server(model, job, python, work_root, cuda)
    print(json.dumps(served), flush=True)
    update = part_update(model, batch, args.samples, generations, args.rounds, work_root)
    print(json.dumps(update), flush=True)
    standalone_rate = standalone["tokens_per_s"]
    print(
        json.dumps(
            {
                "summary": device, "requests": len(batch), "max_new_tokens": args.max_new_tokens,
                "engine_vllm_tokens_per_s": engine["tokens_per_s"], "standalone_tokens_per_s": standalone_rate,
                "engine_vs_standalone": round(engine["tokens_per_s"] / standalone_rate, 2) if standalone_rate else None,
                "engine_openai_tokens_per_s": served["tokens_per_s"],
                "update_s_per_round": update["update_s_per_round"],
                "total_s": round(time.perf_counter() - started, 1),
            }
        ),
        flush=True,
    )  # fmt: skip
    return 0


def _run_part_from_argv() -> int:
    """``gpu_smoke.py --part NAME JOB OUT``: one vLLM part in this (the vLLM) interpreter."""
    name, job_file, out_file = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    job = json.loads(job_file.read_text())
    result = {"engine": part_engine, "standalone": part_standalone}[name](job)
    out_file.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    sys.exit(_run_part_from_argv() if len(sys.argv) > 1 and sys.argv[1] == "--part" else main())
