"""Sampling seeds: every (run seed, round, task, sample) has its own stream, and a seeded sample never depends on
batching."""

from __future__ import annotations

import pytest

from agent.engines import make_engine
from coevolve.config import EnvironmentConfig, load_config
from coevolve.records import Provenance, Task, ToolCall
from tasks.rollout import episode_seed, message_seed, play_episodes


def _task(request: str, folder: str) -> Task:
    return Task(
        environment="bfcl",
        initial_config={"GorillaFileSystem": {"root": {"workspace": {"type": "directory", "contents": {}}}}},
        involved_classes=["GorillaFileSystem"],
        turns=[request],
        reference=[[ToolCall("mkdir", {"dir_name": folder})]],
        provenance=Provenance(origin="seed"),
    )


def test_episode_seeds_are_a_fixed_digest_of_run_seed_round_task_and_sample():
    # A literal: the derivation must give the same seed in every process, on every machine, in every version.
    assert episode_seed(0, 0, "t", 0) == episode_seed(0, 0, "t", 0) == 263859441518335265
    keys = [
        (seed, round_, task, sample) for seed in (0, 1) for round_ in (0, 1) for task in ("a", "b") for sample in (0, 1)
    ]
    assert len({episode_seed(*key) for key in keys}) == len(keys)


def test_every_message_of_an_episode_has_its_own_seed():
    episode = episode_seed(0, 0, "t", 0)
    assert len({message_seed(episode, step) for step in range(30)}) == 30
    assert message_seed(episode, 0) != message_seed(episode_seed(0, 1, "t", 0), 0)


def test_a_seeded_row_samples_the_same_tokens_whatever_its_batch(engine, prompts):
    seeds = [11, 22, 33, 44]
    batched = engine.generate(prompts, temperature=1.0, max_new_tokens=24, seeds=seeds)
    alone = engine.generate([prompts[2]], temperature=1.0, max_new_tokens=24, seeds=[33])
    reordered = engine.generate(
        prompts[::-1] + prompts[:1], temperature=1.0, max_new_tokens=24, seeds=seeds[::-1] + [11]
    )
    assert alone[0].token_ids == batched[2].token_ids == reordered[1].token_ids
    assert reordered[4].token_ids == batched[0].token_ids
    assert alone[0].logprobs == pytest.approx(batched[2].logprobs, abs=1e-5)


def test_seeded_samples_do_not_depend_on_earlier_calls(engine, prompts):
    first = engine.generate(prompts, temperature=1.0, max_new_tokens=24, seeds=[1, 2, 3, 4])
    engine.generate(prompts, temperature=1.0, max_new_tokens=24)  # advances the engine's own generator
    again = engine.generate(prompts, temperature=1.0, max_new_tokens=24, seeds=[1, 2, 3, 4])
    assert [g.token_ids for g in first] == [g.token_ids for g in again]


def test_different_seeds_draw_different_samples_of_one_prompt(engine, prompts):
    samples = engine.generate([prompts[0]] * 8, temperature=2.0, max_new_tokens=24, seeds=list(range(8)))
    assert len({tuple(g.token_ids) for g in samples}) > 1


def test_greedy_decoding_ignores_seeds(engine, prompts):
    one = engine.generate(prompts, temperature=0.0, max_new_tokens=16, seeds=[1, 2, 3, 4])
    other = engine.generate(prompts, temperature=0.0, max_new_tokens=16, seeds=[5, 6, 7, 8])
    assert [g.token_ids for g in one] == [g.token_ids for g in other]


def test_one_seed_per_prompt_is_required(engine, prompts):
    with pytest.raises(ValueError, match="one seed per prompt"):
        engine.generate(prompts, temperature=1.0, max_new_tokens=4, seeds=[1])


def test_two_runs_with_one_seed_play_identical_episodes_on_a_concurrent_server(tmp_path, openai_server):
    """24 requests race each other with more prompt tokens than one server step prefills; seeds fixed before
    dispatch keep the samples."""
    config = load_config(
        data={
            "state_dir": str(tmp_path),
            "rollout": {"engine": "openai", "base_url": openai_server.base_url, "concurrency": 24},
        },
        environ={},
    )
    # Long requests (about 900 prompt tokens each): four distinct prompts fill more than one prefill step.
    filler = "Keep every other file where it is and do not rename anything. " * 16
    tasks = [_task(f"make a folder {name}. {filler}", name) for name in ("logs", "temp", "docs", "data")]

    def run() -> list:
        engine = make_engine(openai_server.model_dir, config)
        try:
            return play_episodes(
                engine, tasks, samples=6, temperature=2.0, max_new_tokens=24, env_config=EnvironmentConfig(max_steps=2),
                run_id="r", round_=0, progress=False, seed=7,
            )  # fmt: skip
        finally:
            engine.close()

    first, second = run(), run()
    assert [t.completion_ids for t in first] == [t.completion_ids for t in second]
    for a, b in zip(first, second, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # The samples of one task differ from each other: each request carried its own seed.
    assert len({tuple(t.completion_ids) for t in first[:6]}) > 1
