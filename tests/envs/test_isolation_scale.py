"""Isolation at scale: one environment object plays 10,000 episodes and memory stays flat.

Each episode resets on an official entry (every tenth of multi_turn_base, so every API class takes
part), runs the first reference turn as one message and ends the turn. Nothing of an episode may
survive the next reset: neither Python objects (counted by the garbage collector) nor resident memory.
The episodes run in a child process of their own, so threads of other tests (a Prefect server, engines)
cannot move its memory. ``python tests/envs/test_isolation_scale.py`` prints the measurements.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.official import official_tasks

EPISODES = 10_000
WARM_UP = 2_000
# A leak of 250 bytes per episode over the last 8,000 episodes would exceed this.
MAX_RSS_GROWTH_BYTES = 2 * 1024 * 1024
MAX_OBJECT_GROWTH = 1_000
REPO = Path(__file__).resolve().parents[2]


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure() -> dict[str, int]:
    """Plays the episodes; resident bytes and live objects after the warm-up and at the end."""
    tasks = official_tasks("multi_turn_base")[::10]
    env = BfclEnvironment()
    marks: dict[str, int] = {}
    for episode in range(EPISODES):
        task = tasks[episode % len(tasks)]
        env.reset(task)
        env.step("[" + ", ".join(call.render() for call in task.reference[0]) + "]")
        env.step("done")
        if episode + 1 in (WARM_UP, EPISODES):
            gc.collect()
            label = "start" if episode + 1 == WARM_UP else "end"
            marks[f"rss_{label}"] = resident_bytes()
            marks[f"objects_{label}"] = len(gc.get_objects())
    return marks


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory is read from /proc")
def test_ten_thousand_episodes_keep_memory_flat():
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, __file__], cwd=REPO, env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    assert marks["rss_end"] - marks["rss_start"] < MAX_RSS_GROWTH_BYTES
    assert marks["objects_end"] - marks["objects_start"] < MAX_OBJECT_GROWTH


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps(measure()))
