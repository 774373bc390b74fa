"""Rollout stage: the policy plays every task of a batch, n samples each, against fresh environments.

All episodes of a batch advance together: each loop asks the engine for one message for every
episode that is still running (batched generate calls of up to ``batch_size`` episodes), and steps
the environments of one chunk while the engine generates for the next.
Token bookkeeping is exact: ``completion_ids`` holds the model's tokens (mask 1, with behaviour
logprobs) and the environment's tokens (mask 0) in conversation order, which is what the GRPO
update trains on.

Sampling is seeded per message, before dispatch: every (run seed, round, task, sample) has its own
episode seed (`episode_seed`) and each of its messages a seed from that and the step index
(`message_seed`). Every engine takes one seed per prompt, so a round's samples differ from other
rounds' and do not depend on batching, request scheduling or what the engine generated before (the
sampled tokens do not; behaviour logprobs can differ in their last bits between batches of
different shapes, e.g. episodes replayed after an interrupted stage).

Where the environment writes the prompts itself (`Environment.conversation`; BFCL with
``environment.prompt_style: bfcl``) every step's prompt is what its conversation builds from the
conversation so far (bfcl-eval's handler, envs/bfcl/prompts.py), and such a prompt need not extend the previous prompt
plus the reply: Qwen's template drops the reasoning of earlier turns and re-writes tool calls, a
model's chat template may do likewise. An episode is therefore stored as one or more segments
(coevolve.records.Segment): a segment is a maximal run of consecutive steps whose prompts extend
each other token for token. While a step's prompt extends the segment's prompt plus completion, the
extension (environment tokens, mask 0) is appended and the step's reply follows it in the same
segment; a prompt that does not extend it starts a new segment whose prompt is exactly that prompt.
Every step's reply is thus in exactly one segment, right after the tokens the model was given for it:
every trained token is a token the model was given or produced at that step, each produced token is
trained once, and every produced token of every step is trained. The update stage trains each
segment with its episode's advantage (tasks/update.py). The compact style's prompts always extend
(its history is append-only), so its episodes have one segment.

Run alone: ``coevolve round --round R`` runs it as the first task of a round.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from prefect import get_run_logger
from tqdm.auto import tqdm

from agent.engine import Engine
from agent.engines import context_length, open_engine
from coevolve.config import EnvironmentConfig, PipelineConfig, RolloutConfig
from coevolve.errors import DataError
from coevolve.records import Task, Trajectory
from coevolve.stages import RolloutInput, RolloutOutput
from envs.registry import make_environment
from tasks.curriculum import StepCurriculum, informative_tasks
from tasks.episode import Episode, advance_episode, to_trajectory
from tasks.registry import stage
from tasks.samplers import estimates_of

if TYPE_CHECKING:
    import pyarrow as pa

    from storage.warehouse import Warehouse


def _digest_seed(text: str) -> int:
    # sha256, not hash(): the same text gives the same seed in every process and on every machine.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1  # 63 bits: fits any int64 seed


def episode_seed(seed: int, round_: int, task_id: str, sample: int) -> int:
    """The seed of one episode: distinct for every run seed, round, task and sample index."""
    return _digest_seed(f"episode:{seed}:{round_}:{task_id}:{sample}")


def message_seed(episode: int, step: int) -> int:
    """The seed of the ``step``-th model message of an episode whose seed is ``episode``."""
    return _digest_seed(f"message:{episode}:{step}")


def play_episodes(
    engine: Engine,
    tasks: list[Task],
    *,
    samples: int,
    temperature: float,
    max_new_tokens: int,
    env_config: EnvironmentConfig,
    run_id: str,
    round_: int,
    max_context_tokens: int | None = None,
    batch_size: int = RolloutConfig.model_fields["generate_batch"].default,
    progress: bool = True,
    desc: str = "rollout",
    seed: int | None = None,
    skip: set[tuple[str, int]] | None = None,
    on_finished: Callable[[list[Trajectory]], None] | None = None,
    flush_every: int = 32,
    first_sample: int = 0,
) -> list[Trajectory]:
    """Play ``samples`` episodes of every task and return one Trajectory per episode.

    The episodes of a task are numbered ``first_sample`` .. ``first_sample + samples - 1``: training
    step k of a round numbers its episodes from k x group_size (`coevolve.stages.step_samples`), so every episode of a
    round has its own (task_id, sample) and its own seed, however often the round's steps draw a task.

    With ``seed`` (the run's), every message is sampled from its own `message_seed`, so the same
    seed, round and tasks replay the same episodes with the same engine and weights, however the
    messages are batched; without it the engine's own randomness decides.

    An episode ends when the environment says the task is over ("done"), when it used
    ``env_config.max_steps`` model messages ("max_steps"), when a message hit the token limit or
    the context is full ("length"), or when a message was unparseable garbage ("error"). Only
    "done" episodes can earn a reward; the others are failures with their reason recorded.

    Episodes whose (task_id, sample) is in ``skip`` are not played (a resumed stage stored them
    already). ``on_finished`` receives finished trajectories in batches of ``flush_every`` as
    episodes end, and the rest at the end, so a caller can store them before the stage is over.
    """
    episodes: list[Episode] = []
    for task in tasks:
        for sample in range(first_sample, first_sample + samples):
            if skip and (task.task_id, sample) in skip:
                continue
            env = make_environment(env_config)
            messages = env.reset(task)
            conversation = env.conversation(task, render_chat=engine.chat.render_chat)
            if conversation is not None:
                prompt_ids = engine.chat.encode(conversation.text())
            else:
                prompt_ids = engine.chat.prompt_ids(messages)
            episodes.append(
                Episode(
                    task=task,
                    sample=sample,
                    env=env,
                    prompt_ids=prompt_ids,
                    seed=None if seed is None else episode_seed(seed, round_, task.task_id, sample),
                    conversation=conversation,
                )
            )

    # disable=None: drawn only when stderr is a terminal, so a log file or a pipe gets no bar.
    bar = tqdm(total=len(episodes), desc=desc, unit="ep", disable=None if progress else True, leave=False)
    finished: list[Trajectory] = []
    unflushed: list[Trajectory] = []

    def advance(chunk: list[Episode], generations: list) -> None:
        for episode, generation in zip(chunk, generations, strict=True):
            advance_episode(engine, episode, generation, env_config, max_context_tokens, max_new_tokens)
            if episode.finish_reason is not None:
                bar.update(1)

    def flush(at_least: int) -> None:
        # Batches of at most flush_every: bounded files, and a failure loses at most one batch.
        while on_finished is not None and unflushed and len(unflushed) >= at_least:
            on_finished(unflushed[:flush_every])
            del unflushed[:flush_every]

    active = list(episodes)
    # One worker steps the environments of a chunk while the engine generates for the next chunk
    # (torch and vLLM release the GIL while they compute). Chunks are generated in the same order
    # and the next loop starts only when every step is done, so results do not depend on timing.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-steps") as stepper:
        while active:
            pending = []
            for start in range(0, len(active), batch_size):
                chunk = active[start : start + batch_size]
                # With a run seed every episode has its own (episode_seed), so no episode is left out here.
                seeds = (
                    None if seed is None else [message_seed(e.seed, len(e.steps)) for e in chunk if e.seed is not None]
                )
                generations = engine.generate(
                    [e.context_ids for e in chunk], temperature=temperature, max_new_tokens=max_new_tokens, seeds=seeds
                )
                pending.append(stepper.submit(advance, chunk, generations))
            for stepped in pending:
                stepped.result()  # re-raises an error of the environment step here
            for episode in active:
                if episode.finish_reason is not None:
                    finished.append(to_trajectory(episode, run_id, round_))
                    unflushed.append(finished[-1])
            flush(flush_every)
            active = [e for e in active if e.finish_reason is None]
    flush(1)
    bar.close()
    order = {(e.task.task_id, e.sample): i for i, e in enumerate(episodes)}
    return sorted(finished, key=lambda t: order[(t.task_id, t.sample)])


def success_rate(trajectories: list[Trajectory]) -> float:
    return sum(t.success for t in trajectories) / len(trajectories) if trajectories else 0.0


def round_statistics(config: PipelineConfig, wh: Warehouse, round_: int) -> pa.Table:
    """Pool ``round_``'s task statistics with the run's ``pool`` settings, stored on first use
    (`Warehouse.task_difficulty`): what the round's sampler draws from."""
    return wh.task_difficulty(
        config.run_id,
        round_,
        history_episodes=config.pool.history_episodes,
        prior_strength=config.pool.prior_strength,
        kind_strength=config.pool.kind_strength,
    )


# --- Prefect task -------------------------------------------------------------------------------


@stage("rollout", retries=2, retry_delay_seconds=5)
def rollout_stage(config: PipelineConfig, wh: Warehouse, inputs: RolloutInput) -> RolloutOutput:
    """Play training step ``step``'s batch with the policy the previous step produced and store the trajectories.

    The step's curriculum (`tasks.curriculum.StepCurriculum`) hands out what to play: the batch ``pool.sampler``
    draws from the round's task statistics (`Warehouse.task_difficulty`), then, with gates
    (``rollout.dynamic_sampling``, ``rollout.gates``), replacement tasks until the step has ``tasks_per_batch``
    admitted groups or has spent its episode budget. Every draw is seeded by (seed, round, step, draw) and decided
    by stored outcomes only, so a resumed stage draws and plays exactly the same tasks.
    """
    round_, step = inputs.round_, inputs.step
    pool = wh.pool(config.run_id, round_)
    if not pool:
        raise DataError(f"Pool {round_} of run {config.run_id!r} is empty; round {round_ - 1} must finish first.")
    curriculum = StepCurriculum.for_step(config, estimates_of(round_statistics(config, wh, round_)), round_, step)
    group_size, samples = config.rollout.group_size, curriculum.samples
    # Episodes stored by an earlier, interrupted attempt are kept; only the missing ones are played.
    stored = {(task_id, sample) for task_id, sample in wh.stored_episodes(config.run_id, round_) if sample in samples}
    if stored:
        get_run_logger().info(
            "round %d step %d: %d episodes already stored, playing the rest", round_, step, len(stored)
        )
    batch = curriculum.first_draw(pool)
    draws = 0
    # Released when the block ends, before the update stage trains: vLLM shut down, GPU memory and connections freed.
    with open_engine(inputs.checkpoint, config) as engine:
        while batch:  # the batch, then (with gates) rounds of replacements
            draws += 1
            play_episodes(
                engine,
                batch,
                samples=group_size,
                temperature=config.rollout.temperature,
                max_new_tokens=config.rollout.max_new_tokens,
                env_config=config.environment,
                run_id=config.run_id,
                round_=round_,
                max_context_tokens=context_length(engine),
                batch_size=config.rollout.generate_batch,
                seed=config.seed,  # same seed and round, same samples on a re-run
                skip=stored,
                on_finished=wh.write_trajectories,  # durable in batches as episodes end
                flush_every=config.warehouse.flush_every,
                first_sample=samples.start,
                desc="rollout" if draws == 1 else f"rollout (replacements {draws - 1})",
            )
            outcomes = wh.outcomes(config.run_id, round_)
            batch = curriculum.next_draw(pool, outcomes)
    informative = informative_tasks(outcomes, samples, group_size)
    played = curriculum.played
    mine = [i for i, sample in enumerate(outcomes["sample"]) if sample in samples]  # this step's episodes
    successes = [outcomes["success"][i] for i in mine]
    reasons = dict(sorted(Counter(outcomes["finish_reason"][i] for i in mine).items()))
    rate = sum(successes) / len(successes) if successes else 0.0
    get_run_logger().info(
        "round %d step %d: %d episodes of %d tasks in %d draw(s), %d groups with reward variance, success %.3f, "
        "finish reasons %s",
        round_, step, len(successes), len(played), draws, len(informative), rate, reasons,
    )  # fmt: skip
    return RolloutOutput(
        trajectories=len(successes),
        tasks=len(played),
        success_rate=rate,
        finish_reasons=reasons,
        step=step,
        checkpoint=inputs.checkpoint,
        groups_played=len(played),
        informative_groups=len(informative),
        draws=draws,
        train_tasks=curriculum.train_tasks(outcomes),
    )
