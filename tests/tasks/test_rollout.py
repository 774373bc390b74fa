"""Rollout: every episode ends with a reason, garbage never crashes a round, token bookkeeping is exact."""

import threading
import time
from pathlib import Path

import pytest

from agent.chat import ChatFormat
from agent.tiny import build_tiny_policy, train_tokenizer
from agent.transformers_engine import Generation, TransformersEngine
from coevolve.config import EnvironmentConfig, PolicyConfig
from envs.bfcl.explorer import build_tasks
from envs.bfcl.official import official_tasks
from envs.registry import make_environment
from tasks.rollout import play_episodes


@pytest.fixture(scope="module")
def tasks():
    return build_tasks(3, seed=21)


@pytest.fixture(scope="module")
def untrained_engine(tmp_path_factory, tasks):
    """A random-init policy: its output is garbage, which is exactly what this module needs."""
    env = make_environment(EnvironmentConfig())
    conversations = [env.demonstration(t) for t in tasks]
    config = PolicyConfig(sft_steps=0, hidden_size=32, num_layers=1, vocab_size=400)
    path = build_tiny_policy(Path(tmp_path_factory.mktemp("policy")) / "m", conversations, config, seed=0)
    return TransformersEngine(path, torch_threads=1, seed=0)


def play(engine, tasks, **kw):
    settings = {
        "samples": 2,
        "temperature": 1.0,
        "max_new_tokens": 24,
        "env_config": EnvironmentConfig(max_steps=3),
        "run_id": "t",
        "round_": 0,
        "progress": False,
    }
    settings.update(kw)
    return play_episodes(engine, tasks, **settings)


def test_garbage_output_ends_episodes_as_failures_with_a_reason(untrained_engine, tasks):
    trajectories = play(untrained_engine, tasks)
    assert len(trajectories) == 6
    assert {t.finish_reason for t in trajectories} <= {"done", "error", "length", "max_steps"}
    assert all(t.reward == 0.0 and not t.success for t in trajectories if t.finish_reason != "done")


def test_completion_tokens_masks_and_logprobs_line_up(untrained_engine, tasks):
    for t in play(untrained_engine, tasks):
        assert len(t.completion_ids) == len(t.completion_mask) == len(t.logprobs)
        generated = sum(s.completion_tokens for s in t.steps)
        assert sum(t.completion_mask) == generated
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.completion_mask, strict=True) if m == 0)
        assert all(lp <= 0.0 for lp in t.logprobs)


def test_a_message_cut_by_the_token_limit_ends_the_episode(untrained_engine, tasks):
    trajectories = play(untrained_engine, tasks, max_new_tokens=1, temperature=1.0)
    cut = [t for t in trajectories if t.finish_reason == "length"]
    assert cut and all(len(t.steps) == 1 and t.steps[0].error for t in cut)


def test_the_step_limit_bounds_every_episode(untrained_engine, tasks):
    for t in play(untrained_engine, tasks, env_config=EnvironmentConfig(max_steps=1)):
        assert len(t.steps) == 1


def test_trajectory_ids_name_run_round_task_and_sample(untrained_engine, tasks):
    ids = [t.trajectory_id for t in play(untrained_engine, tasks[:1])]
    assert ids == [f"t/r0/{tasks[0].task_id}/s0", f"t/r0/{tasks[0].task_id}/s1"]


def test_two_rounds_of_one_run_sample_from_different_streams(untrained_engine, tasks):
    # Every round's rollout stage loads a fresh engine, seeded alike.
    def fresh():
        return TransformersEngine(untrained_engine.model_path, torch_threads=1, seed=0)

    round0 = play(fresh(), tasks[:1], seed=5, round_=0)
    round1 = play(fresh(), tasks[:1], seed=5, round_=1)
    # Same task, same sample index, same weights: only the round differs.
    assert [t.completion_ids for t in round0] != [t.completion_ids for t in round1]
    assert round0[0].steps[0].model_text != round1[0].steps[0].model_text


def test_a_round_replays_its_samples_whatever_the_batching(untrained_engine, tasks):
    whole = play(untrained_engine, tasks, seed=5, round_=3, batch_size=64)
    chunked = play(untrained_engine, tasks, seed=5, round_=3, batch_size=2)
    assert [t.completion_ids for t in whole] == [t.completion_ids for t in chunked]


class _Handshake:
    """The real engine, with decode (run by the environment-step worker) waiting for the next generate call."""

    def __init__(self, engine) -> None:
        self.engine, self.chat = engine, engine.chat
        self.second_generate = threading.Event()
        self.calls = 0
        self.waits: list[bool] = []
        self.tokenizer = self

    def generate(self, prompts, temperature, max_new_tokens, seeds=None):
        self.calls += 1
        if self.calls == 2:
            self.second_generate.set()
        return self.engine.generate(prompts, temperature=temperature, max_new_tokens=max_new_tokens, seeds=seeds)

    def decode(self, ids, **kw):
        if not self.waits:
            self.waits.append(self.second_generate.wait(timeout=20))
        return self.engine.tokenizer.decode(ids, **kw)


def test_environment_steps_of_one_chunk_run_while_the_next_chunk_generates(untrained_engine, tasks):
    # The first chunk's first step blocks until the second chunk's generate call starts: stepping
    # after generating (no overlap) would wait the full timeout and record False.
    engine = _Handshake(untrained_engine)
    trajectories = play(engine, tasks, batch_size=3)
    assert engine.waits == [True]
    assert len(trajectories) == 6


# --- prompt_style 'bfcl' under a chat template that rewrites history ---------------------------------
# Drops the reasoning of assistant messages before the last user query (a user message that is not a
# tool-result list), as Qwen3's template does.
_THINK_STRIPPING_TEMPLATE = (
    "{% set ns = namespace(last=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' and not m['content'].startswith(\"[{'role': 'tool'\") %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class _ScriptedEngine:
    """Replies from a script, tokenized by a real tokenizer; records the prompt of every step."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.chat, self.replies, self.prompts, self.generated = (
            tokenizer,
            ChatFormat(tokenizer),
            list(replies),
            [],
            [],
        )

    def generate(self, prompts, temperature, max_new_tokens, seeds=None):
        out = []
        for prompt in prompts:
            ids = self.chat.generated_ids(self.replies.pop(0))
            self.prompts.append(list(prompt))
            self.generated.append(ids)
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"))
        return out


@pytest.fixture(scope="module")
def rewritten_episode():
    """A bfcl-style episode whose fourth prompt drops the reasoning of turn 0: (trajectory, prompts, replies)."""
    task = official_tasks("multi_turn_base", limit=1)[0]  # turn 0: cd, mkdir, mv; then a grep turn
    tokenizer = train_tokenizer(["[cd(folder='document')] <think>plan</think> tool user system"], vocab_size=300)
    tokenizer.chat_template = _THINK_STRIPPING_TEMPLATE
    replies = [
        "<think>go there first</think>[cd(folder='document')]",
        "<think>then the folder</think>[mkdir(dir_name='temp'), mv(source='final_report.pdf', destination='temp')]",
        "<think>turn done</think>no more calls",
        "<think>search</think>[grep(file_name='final_report.pdf', pattern='budget analysis')]",
        "done",
    ]
    engine = _ScriptedEngine(tokenizer, replies)
    env_config = EnvironmentConfig(prompt_style="bfcl", bfcl_handler="chat", max_steps=5)
    (t,) = play(engine, [task], samples=1, env_config=env_config, temperature=0.0, max_new_tokens=64)
    assert len(engine.prompts) == 5 and "go there first" not in tokenizer.decode(engine.prompts[3])
    return t, engine.prompts, engine.generated


def _placements(segment, prompts, generated) -> dict[int, int]:
    """The steps whose reply follows exactly that step's prompt in ``segment``, and where the reply starts."""
    sequence = segment.prompt_ids + segment.completion_ids
    return {
        k: len(prompt)
        for k, (prompt, reply) in enumerate(zip(prompts, generated, strict=True))
        if len(prompt) >= len(segment.prompt_ids)
        and sequence[: len(prompt)] == prompt
        and sequence[len(prompt) : len(prompt) + len(reply)] == reply
    }


def _trained_positions(segment) -> set[int]:
    offset = len(segment.prompt_ids)
    return {offset + i for i, m in enumerate(segment.completion_mask) if m}


def test_bfcl_style_trains_only_tokens_a_step_was_given_or_produced(rewritten_episode):
    t, prompts, generated = rewritten_episode
    for segment in t.segments:
        replies = {
            start + i for k, start in _placements(segment, prompts, generated).items() for i in range(len(generated[k]))
        }
        # Every trained token is a step's reply, right after exactly the prompt that step was given.
        assert _trained_positions(segment) <= replies


def test_bfcl_style_trains_no_produced_token_twice(rewritten_episode):
    t, prompts, generated = rewritten_episode
    placed = [k for segment in t.segments for k in _placements(segment, prompts, generated)]
    assert len(placed) == len(set(placed))
    assert sum(sum(segment.completion_mask) for segment in t.segments) <= sum(len(g) for g in generated)


def test_bfcl_style_trains_every_produced_token_of_every_step(rewritten_episode):
    t, prompts, generated = rewritten_episode
    trained = set()
    for segment in t.segments:
        positions = _trained_positions(segment)
        for k, start in _placements(segment, prompts, generated).items():
            if set(range(start, start + len(generated[k]))) <= positions:
                trained.add(k)
    assert trained == set(range(len(prompts)))


def test_a_prompt_that_rewrites_history_starts_a_new_segment_with_that_prompt(rewritten_episode):
    t, prompts, _ = rewritten_episode
    # Turn 0's three steps extend each other; turn 1's first prompt drops turn 0's reasoning.
    assert len(t.segments) == 2
    assert t.later_segments[0].prompt_ids == prompts[3]


def test_compact_style_stores_each_episode_as_one_segment(untrained_engine, tasks):
    assert all(t.later_segments == [] for t in play(untrained_engine, tasks))


# --- scoring: a correct episode played through the rollout earns the reward ---------------------------


@pytest.mark.parametrize("environment", ["bfcl", "workplace"])
def test_an_episode_that_plays_the_reference_is_scored_a_success_with_reward_one(environment):
    env_config = EnvironmentConfig(name=environment, max_steps=12)
    env = make_environment(env_config)
    task = env.build_tasks(1, seed=21, calls_per_turn=2)[0]
    replies = [m.content for m in env.demonstration(task) if m.role == "assistant"]
    assert len(task.reference) >= 2 and len(replies) > len(task.reference)  # several turns, several messages
    engine = _ScriptedEngine(train_tokenizer(replies, vocab_size=300), replies)
    (solved,) = play(engine, [task], samples=1, env_config=env_config, temperature=0.0, max_new_tokens=256)
    assert (solved.finish_reason, solved.reward, solved.success) == ("done", 1.0, True)
    assert engine.replies == [] and [c for s in solved.steps for c in s.calls] == [
        c for turn in task.reference for c in turn
    ]

    # The same task answered with "done" at every turn ends the same way ("done") and earns nothing.
    lazy = _ScriptedEngine(train_tokenizer(replies, vocab_size=300), ["done"] * len(task.reference))
    (skipped,) = play(lazy, [task], samples=1, env_config=env_config, temperature=0.0, max_new_tokens=256)
    assert (skipped.finish_reason, skipped.reward, skipped.success) == ("done", 0.0, False)


# --- prompt_style 'bfcl': the record of each step, and where an episode is cut ---------------------------------

_BFCL_REPLIES = [
    "<think>go there first</think>[cd(folder='document')]",
    "<think>then the folder</think>[mkdir(dir_name='temp'), mv(source='final_report.pdf', destination='temp')]",
    "<think>turn done</think>no more calls",
]


class _CutScriptedEngine(_ScriptedEngine):
    """A scripted engine whose replies at the given steps stop at the token limit (finish_reason 'length')."""

    def __init__(self, tokenizer, replies, cut_steps):
        super().__init__(tokenizer, replies)
        self.cut_steps = set(cut_steps)

    def generate(self, prompts, temperature, max_new_tokens, seeds=None):
        out = super().generate(prompts, temperature, max_new_tokens, seeds)
        first = len(self.generated) - len(out)
        return [
            Generation(g.token_ids, g.logprobs, "length" if first + k in self.cut_steps else g.finish_reason)
            for k, g in enumerate(out)
        ]


def _bfcl_episode(replies, cut_steps=(), max_steps=5, **kw):
    """The first official multi-turn task (four turns) played in bfcl style from ``replies``: (trajectory, engine)."""
    task = official_tasks("multi_turn_base", limit=1)[0]
    tokenizer = train_tokenizer(["[cd(folder='document')] <think>plan</think> tool user system"], vocab_size=300)
    tokenizer.chat_template = _THINK_STRIPPING_TEMPLATE
    engine = _CutScriptedEngine(tokenizer, replies, cut_steps)
    env_config = EnvironmentConfig(prompt_style="bfcl", bfcl_handler="chat", max_steps=max_steps)
    (t,) = play(engine, [task], samples=1, env_config=env_config, temperature=0.0, max_new_tokens=64, **kw)
    return t, engine


def test_bfcl_style_records_each_step_as_the_model_wrote_it_with_its_turn_index_and_token_count(rewritten_episode):
    t, _, generated = rewritten_episode
    assert [
        (s.turn, s.index, s.model_text, s.completion_tokens, [c.name for c in s.calls], s.error) for s in t.steps
    ] == [
        (0, 0, _BFCL_REPLIES[0], len(generated[0]), ["cd"], None),
        (0, 1, _BFCL_REPLIES[1], len(generated[1]), ["mkdir", "mv"], None),
        (0, 2, _BFCL_REPLIES[2], len(generated[2]), [], None),
        (
            1,
            3,
            "<think>search</think>[grep(file_name='final_report.pdf', pattern='budget analysis')]",
            len(generated[3]),
            ["grep"],
            None,
        ),
        (1, 4, "done", len(generated[4]), [], None),
    ]
    assert t.finish_reason == "done"
    for segment in t.segments:
        assert segment.logprobs == [-0.5 if m else 0.0 for m in segment.completion_mask]


def test_bfcl_style_a_reply_cut_by_the_token_limit_is_the_last_step_and_ends_the_episode_as_length():
    t, engine = _bfcl_episode(_BFCL_REPLIES, cut_steps={1})
    assert len(engine.generated) == 2
    assert [(s.index, s.model_text, [c.name for c in s.calls], s.error) for s in t.steps] == [
        (0, _BFCL_REPLIES[0], ["cd"], None),
        (1, _BFCL_REPLIES[1], [], "message hit the token limit"),
    ]
    assert t.steps[1].completion_tokens == len(engine.generated[1])
    assert (t.finish_reason, t.reward, t.success) == ("length", 0.0, False)


def test_bfcl_style_an_episode_ends_as_length_once_the_next_prompt_and_reply_could_exceed_the_context():
    _, probe = _bfcl_episode(_BFCL_REPLIES + ["done"])
    fits = len(probe.prompts[1]) + 64  # the second prompt and a whole reply fill the context exactly
    t, engine = _bfcl_episode(_BFCL_REPLIES, max_context_tokens=fits)
    assert len(t.steps) == 2 and t.finish_reason == "length"
    t, engine = _bfcl_episode(_BFCL_REPLIES, max_context_tokens=fits - 1)
    assert len(t.steps) == 1 and t.finish_reason == "length"
    assert len(engine.generated) == 1


def _reference_replies():
    """The first official multi-turn task answered turn by turn: its reference calls, then a reply without calls."""
    task = official_tasks("multi_turn_base", limit=1)[0]
    return [r for turn in task.reference for r in ("[" + ", ".join(c.render() for c in turn) + "]", "no more calls")]


def test_bfcl_style_each_step_is_numbered_in_its_turn_and_the_last_turns_end_is_done():
    began = time.perf_counter()
    t, engine = _bfcl_episode(_reference_replies(), max_steps=12)
    assert 0.0 < t.duration_s <= time.perf_counter() - began  # the episode's own time, inside the call's
    assert [(s.turn, s.index) for s in t.steps] == [(k // 2, k) for k in range(8)]
    assert (t.finish_reason, t.reward, t.success, len(engine.generated)) == ("done", 1.0, True, 8)
    # Nothing follows the last reply: the environment's next prompt is not added once the episode is over.
    assert t.segments[-1].completion_mask[-1] == 1


def test_bfcl_style_an_episode_stops_after_exactly_max_steps_steps_as_max_steps():
    t, engine = _bfcl_episode(_reference_replies(), max_steps=3)
    assert [(s.turn, s.index) for s in t.steps] == [(0, 0), (0, 1), (1, 2)]
    assert (t.finish_reason, t.reward, len(engine.generated)) == ("max_steps", 0.0, 3)
    assert t.segments[-1].completion_mask[-1] == 1


# --- compact style: the record of each step, and where an episode is cut -----------------------------------


def _compact_episode(replies=None, cut_steps=(), max_steps=12, **kw):
    """A three-turn bfcl task played in compact style from ``replies`` (default: its demonstration's
    messages, the reference calls and a "done" per turn): (trajectory, engine, the demonstration's messages)."""
    env_config = EnvironmentConfig(name="bfcl", max_steps=max_steps)
    env = make_environment(env_config)
    task = env.build_tasks(1, seed=21, calls_per_turn=2)[0]
    demonstration = [m.content for m in env.demonstration(task) if m.role == "assistant"]
    engine = _CutScriptedEngine(train_tokenizer(demonstration, vocab_size=300), replies or demonstration, cut_steps)
    (t,) = play(engine, [task], samples=1, env_config=env_config, temperature=0.0, max_new_tokens=256, **kw)
    return t, engine, demonstration


def test_compact_style_records_each_step_with_its_turn_index_text_and_token_count():
    t, engine, replies = _compact_episode()
    assert len(replies) == 6
    assert [(s.turn, s.index, s.model_text, s.completion_tokens, s.error) for s in t.steps] == [
        (k // 2, k, replies[k], len(engine.generated[k]), None) for k in range(6)
    ]
    assert [len(s.calls) for s in t.steps] == [2, 0, 2, 0, 1, 0]
    assert (t.finish_reason, t.reward, t.success, t.later_segments) == ("done", 1.0, True, [])
    assert t.logprobs == [-0.5 if m else 0.0 for m in t.completion_mask]
    assert t.completion_mask[-1] == 1
    assert t.prompt_ids + t.completion_ids[: len(engine.prompts[-1]) - len(t.prompt_ids)] == engine.prompts[-1]


def test_compact_style_a_reply_cut_by_the_token_limit_is_the_last_step_and_ends_the_episode_as_length():
    t, engine, replies = _compact_episode(cut_steps={1})
    assert [(s.index, s.model_text, s.calls, s.error) for s in t.steps[1:]] == [
        (1, replies[1], [], "message hit the token limit")
    ]
    assert (len(t.steps), t.steps[1].completion_tokens, t.steps[1].turn) == (2, len(engine.generated[1]), 0)
    assert (t.finish_reason, t.reward, t.success) == ("length", 0.0, False)


def test_compact_style_an_unparseable_reply_ends_the_episode_as_an_error():
    t, engine, _ = _compact_episode(["[ls("])
    assert [(s.index, s.calls, s.error) for s in t.steps] == [(0, [], "unparseable tool call: [ls(")]
    assert (t.finish_reason, t.reward, t.success, len(engine.generated)) == ("error", 0.0, False, 1)


def test_compact_style_an_episode_stops_after_exactly_max_steps_steps_as_max_steps():
    t, engine, _ = _compact_episode(max_steps=3)
    assert [(s.turn, s.index) for s in t.steps] == [(0, 0), (0, 1), (1, 2)]
    assert (t.finish_reason, t.reward, len(engine.generated)) == ("max_steps", 0.0, 3)
    assert t.completion_mask[-1] == 1


def test_compact_style_an_episode_ends_as_length_once_its_context_and_a_reply_could_exceed_the_limit():
    _, probe, _ = _compact_episode()
    fits = len(probe.prompts[1]) + 256  # the context after the first step and a whole reply fill the limit exactly
    t, engine, _ = _compact_episode(max_context_tokens=fits)
    assert (len(t.steps), t.finish_reason, len(engine.generated)) == (2, "length", 2)
    t, engine, _ = _compact_episode(max_context_tokens=fits - 1)
    assert (len(t.steps), t.finish_reason, len(engine.generated)) == (1, "length", 1)


def test_bfcl_style_a_segment_opened_by_a_prompt_no_reply_followed_is_not_stored():
    _, probe = _bfcl_episode(_BFCL_REPLIES + ["<think>search</think>[grep(file_name='a', pattern='b')]", "done"])
    # The fourth prompt rewrites history (a new segment) and leaves no room for a reply: the episode ends there.
    t, engine = _bfcl_episode(_BFCL_REPLIES, max_context_tokens=len(probe.prompts[3]) + 63)
    assert (len(t.steps), t.finish_reason, len(engine.generated)) == (3, "length", 3)
    assert t.later_segments == []
    assert t.prompt_ids == probe.prompts[0] and t.completion_mask[-1] == 1
