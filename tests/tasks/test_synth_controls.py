"""Controls: the random arm spends the same exploration volume as the signal arm in the same round."""

from dataclasses import replace

import pytest

from coevolve.config import SynthesisConfig
from coevolve.records import Provenance, Signal
from envs.bfcl.explorer import build_tasks
from tasks.synthesize import random_targets, synthesize_targets
from tasks.validate import validate_candidates


def test_random_mode_explores_as_many_targets_as_signal_mode():
    pool = build_tasks(3, seed=21)
    signals = [
        Signal("run", 2, "boundary", f"run/r2/{pool[0].task_id}/s0", pool[0].task_id, {"group_rewards": [1.0, 0.0]}),
        Signal(
            "run", 2, "forgetting", f"run/r2/{pool[1].task_id}/s1", pool[1].task_id, {"window": [1.0], "score": 0.0}
        ),
        Signal(
            "run",
            2,
            "rare",
            f"run/r2/{pool[2].task_id}/s2",
            pool[2].task_id,
            {"pattern": "ls", "count": 1, "total": 50},
        ),
    ]
    config = SynthesisConfig(explorations_per_signal=1, steps_per_exploration=4)
    targets = random_targets(pool, len(signals), 2, seed=0)
    _, signal_records = synthesize_targets(signals, pool, config, 2, 0, progress=False)
    random_candidates, random_records = synthesize_targets(targets, pool, config, 2, 0, progress=False)
    assert len(targets) == len(signals)
    assert len(random_records) == len(signal_records) == len(signals)
    assert all(
        c.task.provenance.origin == "random" and c.task.provenance.parent_trajectory_id is None
        for c in random_candidates
    )


def test_random_targets_are_reproducible_and_drawn_from_the_pool():
    pool = build_tasks(4, seed=22)
    first, again = random_targets(pool, 6, 1, seed=5), random_targets(pool, 6, 1, seed=5)
    assert [(t.task_id, t.evidence) for t in first] == [(t.task_id, t.evidence) for t in again]
    assert {t.task_id for t in first} <= {t.task_id for t in pool}
    assert [t.signal_id for t in first] == [f"random:1:{i}" for i in range(6)]


@pytest.mark.parametrize("split, reason", [("heldout", "same as a held-out task"), ("dev", "same as a dev task")])
def test_a_random_control_task_that_is_a_sealed_task_reworded_is_refused(split, reason):
    pool = build_tasks(2, seed=23)
    [made, *_] = synthesize_targets(
        random_targets(pool, 2, 1, 0), pool, SynthesisConfig(explorations_per_signal=1), 1, 0, progress=False
    )[0]
    sealed = replace(made.task, turns=["Worded by a person, not by the template."], provenance=Provenance(split))
    heldout, dev = ([sealed], []) if split == "heldout" else ([], [sealed])
    [judged] = validate_candidates([made], pool, heldout, SynthesisConfig(), dev=dev)
    assert (judged.verdict.accepted, judged.verdict.reason) == (False, reason)
