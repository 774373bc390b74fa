"""Speed of the BFCL environment: steps per second, turn-check throughput, all 800 ground-truth replays.

Run: ``.venv/bin/python benchmarks/bfcl_env.py`` (add ``--repeat 5`` for more stable figures).
Prints one line per measurement; the figures measured on the project's machine are in
benchmarks/README.md (section "BFCL environment"). bfcl-eval's own checker is timed on the same
replays for comparison only: it runs call strings with ``eval``, which is acceptable here because
the strings are the official answers.
"""

from __future__ import annotations

import argparse
import sys
import time

import envs.bfcl.api as bfcl_api
from coevolve.optional import optional_module
from coevolve.records import Task
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.official import CATEGORIES, official_tasks

# bfcl-eval's own checker, imported after envs chose BFCL_PROJECT_ROOT (bfcl-eval creates folders there).
bfcl_checker = optional_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")


def replay(env: BfclEnvironment, task: Task) -> tuple[bool, int]:
    """The reference answer played through step(): one message per turn, then "done"."""
    env.reset(task)
    steps = 0
    for turn in task.reference:
        if turn:
            env.step("[" + ", ".join(call.render() for call in turn) + "]")
            steps += 1
        steps += 1
        if env.step("done").done:
            break
    return env.score()[1], steps


def bench_replays(tasks: list[Task]) -> dict[str, float]:
    env = BfclEnvironment()
    started = time.perf_counter()
    passed = steps = 0
    for task in tasks:
        ok, n = replay(env, task)
        passed += ok
        steps += n
    seconds = time.perf_counter() - started
    calls = sum(task.num_reference_calls for task in tasks)
    turns = sum(len(task.turns) for task in tasks)
    return {
        "episodes": len(tasks),
        "passed": passed,
        "seconds": seconds,
        "steps": steps,
        "calls": calls,
        "turns": turns,
    }


def bench_step_only(tasks: list[Task], rounds: int = 5) -> dict[str, float]:
    """step() alone on the first turn's answer (parse + execute + tool message), resets excluded."""
    env = BfclEnvironment(max_steps_per_turn=10_000)
    messages = ["[" + ", ".join(c.render() for c in task.reference[0]) + "]" for task in tasks]
    seconds = 0.0
    steps = 0
    for task, text in zip(tasks, messages, strict=True):
        env.reset(task)
        started = time.perf_counter()
        for _ in range(rounds):
            env.step(text)
        seconds += time.perf_counter() - started
        steps += rounds
    return {"steps": steps, "seconds": seconds}


def bench_bfcl_checker(category: str) -> dict[str, float]:
    entries = bfcl_api.load_jsonl(bfcl_api.DATA_DIR / f"BFCL_v4_{category}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in bfcl_api.load_jsonl(bfcl_api.DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json")
    }
    started = time.perf_counter()
    passed = 0
    for entry in entries:
        answer = answers[entry["id"]]
        decoded = [[turn] if turn else [] for turn in answer]
        passed += bfcl_checker.multi_turn_checker(decoded, answer, entry, category, "benchmark")["valid"]
    seconds = time.perf_counter() - started
    utils = sys.modules["bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"]  # loaded by the checker
    for name in [n for n in vars(utils) if n.startswith("benchmark")]:
        delattr(utils, name)
    return {"episodes": len(entries), "passed": passed, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="Repetitions; the fastest is reported.")
    args = parser.parse_args()

    started = time.perf_counter()
    tasks = [task for category in CATEGORIES for task in official_tasks(category)]
    print(f"load 800 official tasks: {time.perf_counter() - started:.2f} s (once per process)")

    best = min((bench_replays(tasks) for _ in range(args.repeat)), key=lambda r: r["seconds"])
    print(
        f"800 ground-truth replays (execute + check every turn): {best['seconds']:.2f} s, "
        f"{best['passed']}/{best['episodes']} passed, {best['episodes'] / best['seconds']:.0f} episodes/s, "
        f"{best['steps'] / best['seconds']:.0f} steps/s, {best['turns'] / best['seconds']:.0f} turn checks/s, "
        f"{best['calls'] / best['seconds']:.0f} reference calls/s (each runs twice: model side and truth side)"
    )
    step = min((bench_step_only(tasks) for _ in range(args.repeat)), key=lambda r: r["seconds"])
    print(f"step() alone (parse + execute + tool message): {step['steps'] / step['seconds']:.0f} steps/s")
    bfcl_seconds = 0.0
    bfcl_passed = 0
    for category in CATEGORIES:
        result = bench_bfcl_checker(category)
        bfcl_seconds += result["seconds"]
        bfcl_passed += result["passed"]
    print(f"bfcl-eval multi_turn_checker on the same 800 answers: {bfcl_seconds:.2f} s, {bfcl_passed}/800 passed")


if __name__ == "__main__":
    main()
