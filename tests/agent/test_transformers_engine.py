"""The transformers engine: batched sampling with the behaviour logprobs GRPO trains against."""

from __future__ import annotations

import gc
import math
import weakref

import torch
from transformers import AutoModelForCausalLM

from agent import transformers_engine
from agent.prefix_cache import PrefixStore, cut_points
from agent.transformers_engine import TransformersEngine
from coevolve.records import Message


def test_every_token_has_one_logprob(engine, prompts):
    for generation in engine.generate(prompts, temperature=1.0, max_new_tokens=12):
        assert len(generation.logprobs) == len(generation.token_ids) > 0
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in generation.logprobs)


def test_stops_with_eos_included_or_reports_length(engine, prompts):
    finished = engine.generate(prompts, temperature=0.0, max_new_tokens=40)
    assert all(g.finish_reason == "stop" and g.token_ids[-1] == engine.chat.eos_token_id for g in finished)
    cut = engine.generate(prompts, temperature=0.0, max_new_tokens=2)
    assert all(g.finish_reason == "length" and len(g.token_ids) == 2 for g in cut)


def test_greedy_is_deterministic_and_independent_of_batch_padding(engine, prompts):
    batched = engine.generate(prompts, temperature=0.0, max_new_tokens=20)
    again = engine.generate(prompts, temperature=0.0, max_new_tokens=20)
    alone = engine.generate([prompts[1]], temperature=0.0, max_new_tokens=20)
    assert [g.token_ids for g in batched] == [g.token_ids for g in again]
    assert alone[0].token_ids == batched[1].token_ids


def test_sampled_logprobs_match_a_full_forward_pass_at_the_temperature(engine, prompts):
    temperature = 0.7
    generation = engine.generate(prompts[:2], temperature=temperature, max_new_tokens=10)[1]
    ids = torch.tensor([prompts[1] + generation.token_ids])
    with torch.inference_mode():
        logits = engine.model(input_ids=ids).logits[0, len(prompts[1]) - 1 : -1] / temperature
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(expected, torch.tensor(generation.logprobs), atol=1e-4)


def test_greedy_logprobs_are_the_chosen_tokens_under_a_full_forward_pass(engine, prompts):
    # Evaluation's: taken from the decoding loop itself, untempered, without a forward pass per episode.
    generation = engine.generate(prompts[:2], temperature=0.0, max_new_tokens=10)[1]
    ids = torch.tensor([prompts[1] + generation.token_ids])
    with torch.inference_mode():
        logits = engine.model(input_ids=ids).logits[0, len(prompts[1]) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(expected, torch.tensor(generation.logprobs), atol=1e-4)


def test_samples_of_one_prompt_are_those_it_gives_in_a_batch_of_other_prompts(engine, prompts):
    """A task's samples share their prompt, which is read once for all of them; each sample stays its seed's."""
    group = engine.generate([prompts[0]] * 3, temperature=0.9, max_new_tokens=16, seeds=[21, 22, 23])
    mixed = engine.generate([prompts[0], prompts[1], prompts[0]], temperature=0.9, max_new_tokens=16, seeds=[21, 5, 23])
    assert (group[0].token_ids, group[0].logprobs) == (mixed[0].token_ids, mixed[0].logprobs)
    assert (group[2].token_ids, group[2].logprobs) == (mixed[2].token_ids, mixed[2].logprobs)


def test_behaviour_logprobs_do_not_depend_on_the_batch_an_episode_was_sampled_in(engine, prompts):
    """A replayed episode (a resumed rollout samples it in a smaller batch) stores the same bits."""
    seeds = [11, 12, 13, 14][: len(prompts)]
    batched = engine.generate(prompts, temperature=0.9, max_new_tokens=16, seeds=seeds)
    for i, prompt in enumerate(prompts):
        (alone,) = engine.generate([prompt], temperature=0.9, max_new_tokens=16, seeds=[seeds[i]])
        assert alone.token_ids == batched[i].token_ids
        assert alone.logprobs == batched[i].logprobs


def test_sampled_rows_leave_the_batch_once_their_message_ends(engine, prompts, monkeypatch):
    """The loop runs until the longest message ends; a row that stopped is not computed meanwhile."""
    decoded_rows = []
    forward = engine.model.forward

    def counting(*args, **kwargs):
        if kwargs.get("attention_mask") is not None and kwargs["input_ids"].shape[-1] == 1:
            decoded_rows.append(kwargs["input_ids"].shape[0])  # a step of the decoding loop
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", counting)
    seeds = [31, 32, 33, 34][: len(prompts)]
    lengths = [len(g.token_ids) for g in engine.generate(prompts, temperature=1.5, max_new_tokens=24, seeds=seeds)]
    assert min(lengths) < max(lengths)
    # After token p the rows still decoding are those whose message is longer than p + 1 tokens.
    assert decoded_rows == [sum(n > p + 1 for n in lengths) for p in range(max(lengths) - 1)]


def test_reload_switches_checkpoints(tmp_path, tiny_dir, prompts):
    engine = TransformersEngine(tiny_dir)
    perturbed = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        perturbed.lm_head.weight.mul_(-1.0)
    perturbed.save_pretrained(tmp_path / "other")
    engine.tokenizer.save_pretrained(tmp_path / "other")
    before = engine.generate(prompts[:1], temperature=0.0, max_new_tokens=8)[0].token_ids
    engine.reload(tmp_path / "other")
    after = engine.generate(prompts[:1], temperature=0.0, max_new_tokens=8)[0].token_ids
    assert before != after


def test_empty_batch_gives_no_generations(engine):
    assert engine.generate([], temperature=0.0, max_new_tokens=4) == []


def test_a_closed_engine_frees_its_model_and_the_first_close_freezes_what_survives_it(tiny_dir, monkeypatch):
    """A dropped model is freed by the cycle collector; the process's first close then freezes what survives that
    collection out of later ones, so closing the engine of each training step does not walk it again."""
    monkeypatch.setattr(transformers_engine, "_FROZEN", [])  # as in a process closing its first engine
    alive_before = [object()]
    freed = []
    for _ in range(2):
        engine = TransformersEngine(tiny_dir, torch_threads=1, seed=0)
        model = weakref.ref(engine.model)
        engine.close()
        freed.append(model() is None)
    assert freed == [True, True]
    assert not any(candidate is alive_before for candidate in gc.get_objects())


def test_samples_that_draw_the_same_message_are_scored_once_with_its_logprobs_alone(engine, prompts, monkeypatch):
    scored = []
    score = engine._behaviour_logprobs

    def counted(prompt, prompt_pass, tokens, temperature):
        scored.append(tuple(tokens))
        return score(prompt, prompt_pass, tokens, temperature)

    # Two samples with one seed draw one message; the third, its own.
    twins = engine.generate([prompts[0]] * 3, temperature=0.9, max_new_tokens=16, seeds=[7, 7, 8])
    monkeypatch.setattr(engine, "_behaviour_logprobs", counted)
    again = engine.generate([prompts[0]] * 3, temperature=0.9, max_new_tokens=16, seeds=[7, 7, 8])
    alone = engine.generate([prompts[0]], temperature=0.9, max_new_tokens=16, seeds=[7])
    assert twins[0].token_ids == twins[1].token_ids != twins[2].token_ids
    assert sorted(scored) == sorted([tuple(twins[0].token_ids), tuple(twins[2].token_ids), tuple(alone[0].token_ids)])
    assert [g.logprobs for g in again] == [g.logprobs for g in twins] and twins[0].logprobs == alone[0].logprobs
    again[0].logprobs.append(0.0)
    assert again[1].logprobs == twins[1].logprobs  # each generation owns its list


def _second_turn(engine, prompt, seed):
    """A two-turn episode's prompts: the first, then the first, its sampled message and a tool's answer."""
    (first,) = engine.generate([prompt], temperature=0.9, max_new_tokens=16, seeds=[seed])
    answer = engine.chat.continuation_ids([Message(role="tool", content='{"ok": true}')])
    return [*prompt, *first.token_ids, *answer], answer


def test_a_second_turn_gives_the_same_bits_whatever_prefixes_the_engine_still_holds(tiny_dir, prompts):
    """The store of prefix caches changes only the time: a turn sampled after its episode's first turn, by a fresh
    engine, and by one that keeps no prefix, gives the same tokens and logprobs."""
    played = TransformersEngine(tiny_dir, torch_threads=1, seed=0)
    second, _ = _second_turn(played, prompts[0], seed=3)
    after_first = played.generate([second], temperature=0.9, max_new_tokens=16, seeds=[4])
    fresh = TransformersEngine(tiny_dir, torch_threads=1, seed=0).generate(
        [second], temperature=0.9, max_new_tokens=16, seeds=[4]
    )
    keeps_none = TransformersEngine(tiny_dir, torch_threads=1, seed=0, prefix_cache_mb=0).generate(
        [second], temperature=0.9, max_new_tokens=16, seeds=[4]
    )
    assert after_first[0].token_ids == fresh[0].token_ids == keeps_none[0].token_ids
    assert after_first[0].logprobs == fresh[0].logprobs == keeps_none[0].logprobs


def test_a_second_turn_reads_only_what_followed_the_episodes_message(tiny_dir, prompts, monkeypatch):
    """After the first turn, the second turn's prompt is read from the cache of the first prompt and its message:
    the model is given only the tool's answer and the next generation prompt."""
    played = TransformersEngine(tiny_dir, torch_threads=1, seed=0)
    second, answer = _second_turn(played, prompts[0], seed=3)
    read: list[int] = []
    forward = played.model.forward

    def counted(*args, **kwargs):
        read.append(int(kwargs["input_ids"].shape[-1]) if kwargs["input_ids"].shape[0] == 1 else 0)
        return forward(*args, **kwargs)

    monkeypatch.setattr(played.model, "forward", counted)
    played._prompts_alone([second])
    assert sum(read) == len(answer)


def test_a_sequence_is_cut_after_each_generation_prompt_and_the_message_it_opens():
    end, opener = 9, [5, 6]
    # system/user text, its end, the opener, a message and its end, a tool's answer and its end, the opener
    assert cut_points([1, 9, 5, 6, 2, 3, 9, 4, 9, 5, 6], end, opener) == [4, 7]  # the end is no cut inside
    assert cut_points([1, 9, 5, 6, 2, 3, 9, 4, 9, 5, 6, 7], end, opener) == [4, 7, 11]
    assert cut_points([5, 6, 9], end, opener) == [2]
    assert cut_points([1, 9, 2, 9], end, opener) == []  # no assistant message: one piece
    assert cut_points([1, 2, 3], end, []) == []


def test_the_prefix_store_drops_the_least_recently_used_beyond_its_budget():
    store = PrefixStore(budget_bytes=3 * 4 * 2)  # three prefixes of one float32 key and value each
    one = [torch.zeros(1)]
    for name in ((1,), (2,), (3,)):
        store.put(name, one, one)
    assert store.get((1,)) is not None  # now the most recently used
    store.put((4,), one, one)
    assert store.get((2,)) is None and all(store.get(k) is not None for k in ((1,), (3,), (4,)))
    store.put((5,), [torch.zeros(10)], [torch.zeros(10)])  # larger than the budget: not kept
    assert store.get((5,)) is None
