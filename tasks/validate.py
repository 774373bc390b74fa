"""Validation stage: keep only the candidates the environment confirms, and grow the pool.

Every candidate is replayed from its initial state in a fresh environment. It is accepted when
its whole reference executes without an error and changes the environment's state, when it is
long enough, and when it is new: not a pool task, and not the same normalized action sequence
as one. The held-out and dev splits are sealed by what a task is (``Task.identity``: environment,
initial state, classes and normalized calls), so a reworded held-out or dev task is refused too.
Every rejection carries its reason.

Two optional checks (``validation`` section, both off by default): an LLM judge on the paper's
five criteria (tasks/synthesis/judge.py) after a clean replay, and a near-duplicate check of the query by
embedding similarity (tasks/synthesis/similarity.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prefect import get_run_logger

from coevolve.config import PipelineConfig, PoolConfig, SynthesisConfig
from coevolve.records import Candidate, Task, Verdict, digest, normal_value
from coevolve.stages import ValidateInput, ValidateOutput
from envs.registry import environment_for
from tasks.registry import stage
from tasks.splits import sealed_splits
from tasks.synthesis.judge import judge_from_config
from tasks.synthesis.similarity import NearDuplicateIndex

if TYPE_CHECKING:
    from storage.warehouse import Warehouse


def action_key(task: Task) -> str:
    """The normalized action sequence: same classes, same calls up to case, spacing and 1 == 1.0."""
    calls = [[(c.name, normal_value(c.arguments)) for c in turn] for turn in task.reference]
    return digest({"classes": sorted(task.involved_classes), "calls": calls})


def replay_verdict(candidate: Task, min_steps: int) -> Verdict:
    """Replay ``candidate`` in a fresh environment and decide on its own merits (length, errors, state change)."""
    calls = candidate.num_reference_calls
    if calls < min_steps:
        return Verdict(False, f"too short: {calls} reference calls, at least {min_steps} required")
    try:
        ok, reason, changed = environment_for(candidate).replay(candidate)
    except Exception as exc:  # noqa: BLE001 - a candidate must never crash the round
        return Verdict(False, f"replay raised {type(exc).__name__}: {exc}")
    if not ok:
        return Verdict(False, f"replay failed: {reason}")
    if not changed:
        return Verdict(False, "no state change: the reference only reads")
    return Verdict(True, f"replayed cleanly ({calls} calls)")


def validate_candidates(
    candidates: list[Candidate],
    pool: list[Task],
    heldout: Iterable[Task],
    config: SynthesisConfig,
    llm_judge: Callable[[Task], Verdict] | None = None,
    near_duplicates: NearDuplicateIndex | None = None,
    dev: Iterable[Task] = (),
) -> list[Candidate]:
    """Each candidate with its verdict, in input order.

    ``heldout`` and ``dev`` are the run's sealed splits: a candidate with the identity of one of
    their tasks (whatever its wording) is refused. ``near_duplicates`` holds the pool's queries
    (tasks/synthesis/similarity.py); ``llm_judge`` has the last word on candidates that replayed cleanly.
    """
    sealed = {t.identity: "same as a dev task" for t in dev}
    sealed.update({t.identity: "same as a held-out task" for t in heldout})
    seen_ids = {t.task_id: t.task_id for t in pool}
    seen_actions = {action_key(t): t.task_id for t in pool}
    judged: list[Candidate] = []
    for cand in candidates:
        task = cand.task
        key = action_key(task)
        identity = task.identity
        if identity in sealed:
            verdict = Verdict(False, sealed[identity])
        elif task.task_id in seen_ids:
            verdict = Verdict(False, f"duplicate of {seen_ids[task.task_id]}")
        elif key in seen_actions:
            verdict = Verdict(False, f"same action sequence as {seen_actions[key]}")
        else:
            verdict = replay_verdict(task, config.min_task_steps)
        if verdict.accepted and near_duplicates is not None:
            nearest, score = near_duplicates.check(" ".join(task.turns))
            if nearest is not None:
                verdict = Verdict(False, f"near-duplicate query of {nearest} (cosine {score:.3f})")
        if verdict.accepted and llm_judge is not None:
            opinion = llm_judge(task)
            verdict = Verdict(
                opinion.accepted, opinion.reason if not opinion.accepted else f"{verdict.reason}; {opinion.reason}"
            )
        if verdict.accepted:
            seen_ids[task.task_id] = task.task_id
            seen_actions[key] = task.task_id
            if near_duplicates is not None:
                near_duplicates.add(" ".join(task.turns), task.task_id)
        judged.append(Candidate(task=task, signal_id=cand.signal_id, verdict=verdict))
    return judged


def next_pool(pool: list[Task], judged: list[Candidate], config: PoolConfig) -> list[Task]:
    """Pool r+1. The paper's policy appends every accepted task and never removes one."""
    accepted = [c.task for c in judged if c.verdict is not None and c.verdict.accepted]
    grown = list(pool) + accepted
    if config.policy == "dedupe":
        keep: dict[str, Task] = {}
        for task in grown:
            keep.setdefault(action_key(task), task)
        grown = list(keep.values())
    if config.max_size is not None and len(grown) > config.max_size:
        # Oldest tasks leave first, so the newest evidence always enters.
        grown = grown[len(grown) - config.max_size :]
    return grown


# --- Prefect task -------------------------------------------------------------------------------


@stage("validate", retries=2, retry_delay_seconds=2)
def validate_stage(config: PipelineConfig, wh: Warehouse, inputs: ValidateInput) -> ValidateOutput:
    """Judge the candidates, store every verdict, and write pool ``round_ + 1``."""
    round_ = inputs.round_
    pool = wh.pool(config.run_id, round_)
    heldout, dev = sealed_splits(config, wh)
    parsed = [Candidate(task=Task.from_dict(c["task"]), signal_id=c.get("signal_id")) for c in inputs.candidates]
    llm_judge = judge_from_config(config.synthesis) if config.validation.llm_judge else None
    near = None
    if config.validation.embedding_dedupe:
        near = NearDuplicateIndex(
            [" ".join(t.turns) for t in pool], [t.task_id for t in pool], config.validation.similarity_threshold
        )
    judged = validate_candidates(parsed, pool, heldout, config.synthesis, llm_judge, near, dev=dev)
    grown = next_pool(pool, judged, config.pool)
    accepted = [c.task for c in judged if c.verdict and c.verdict.accepted]
    wh.write_candidates(config.run_id, round_, judged)
    wh.write_tasks(accepted)
    wh.set_pool(config.run_id, round_ + 1, [t.task_id for t in grown])
    reasons: dict[str, int] = {}
    for c in judged:
        if c.verdict and not c.verdict.accepted:
            key = c.verdict.reason.split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    get_run_logger().info(
        "round %d: accepted %d, rejected %d %s; pool %d -> %d",
        round_, len(accepted), len(judged) - len(accepted), reasons, len(pool), len(grown),
    )  # fmt: skip
    return ValidateOutput(
        accepted=len(accepted), rejected=len(judged) - len(accepted), pool_size=len(grown), rejections=reasons
    )
