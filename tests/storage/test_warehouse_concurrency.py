"""Writers and readers in separate processes, at once, with no lock; a writer killed with -9 leaves nothing a reader
sees.

Every file is written under a hidden name and renamed into place, so readers see whole files only,
and writers of disjoint shards of one round never touch each other's files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.warehouse import Warehouse

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUN = "run-a"
WRITERS, BATCHES, PER_BATCH = 4, 6, 5

# One shard of round 0: tasks shard*100 + batch*10 + i, each batch one write_trajectories call.
WRITER = """
import sys
sys.path.insert(0, "tests/storage")
from conftest import build_task, build_trajectory
from storage.warehouse import Warehouse

root, shard, batches, per_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
wh = Warehouse(root)
print("ready", flush=True)
sys.stdin.readline()  # all writers start together
for b in range(batches):
    tasks = [build_task(shard * 100 + b * 10 + i) for i in range(per_batch)]
    wh.write_trajectories([build_trajectory(t.task_id, s, s == 0) for t in tasks for s in range(2)])
"""

# Scans both tables in one session until told to stop; prints every count it saw, or the error.
READER = """
import json, select, sys
from storage.warehouse import Warehouse

con = Warehouse(sys.argv[1], read_only=True).connect()
seen = []
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    heads = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
    seen.append([heads, steps])
print(json.dumps(seen), flush=True)
"""


def spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_four_writers_of_disjoint_shards_and_a_reader_run_at_once(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    Warehouse(root).close()
    reader = spawn(READER, root)
    writers = [spawn(WRITER, root, shard, BATCHES, PER_BATCH) for shard in range(WRITERS)]
    try:
        for process in [reader, *writers]:
            assert process.stdout.readline().strip() == "ready", process.stderr.read()
        for writer in writers:
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            _, err = writer.communicate(timeout=120)
            assert writer.returncode == 0, err
        out, err = reader.communicate("stop\n", timeout=60)
        assert reader.returncode == 0, err
    finally:
        for process in [reader, *writers]:
            if process.poll() is None:
                process.kill()
                process.wait()

    total = WRITERS * BATCHES * PER_BATCH * 2
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen, "the reader ran while the writers wrote"
    assert all(heads <= total and steps <= 2 * total for heads, steps in seen)
    assert any(0 < heads < total for heads, _ in seen), "the reader's queries fell between writes"

    wh = Warehouse(root, read_only=True)
    counts = wh.sql(
        "SELECT (SELECT count(*) FROM trajectories) AS heads, "
        "(SELECT count(DISTINCT trajectory_id) FROM trajectories) AS ids, "
        "(SELECT count(*) FROM steps) AS steps, "
        "(SELECT count(DISTINCT (trajectory_id, step_index)) FROM steps) AS step_keys"
    ).row(0)
    assert counts == (total, total, 2 * total, 2 * total), "every row is there exactly once"
    orphans = wh.sql("SELECT count(*) AS n FROM steps s ANTI JOIN trajectories t USING (trajectory_id)")["n"][0]
    assert orphans == 0
    assert not list(root.rglob("*.partial"))


# Writes one batch large enough that writing it takes a while, then says it finished.
BIG_WRITER = """
import array, random, sys
sys.path.insert(0, "tests/storage")
from conftest import build_trajectory
from storage.warehouse import Warehouse

root, count, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
trajs = []
for i in range(count):
    t = build_trajectory(f"task-{i:04d}", 0, i % 2 == 0)
    t.completion_ids = list(array.array("i", rng.randbytes(4 * tokens)))  # incompressible: the file is big
    trajs.append(t)
wh = Warehouse(root)
print("writing", flush=True)
wh.write_trajectories(trajs)
print("written", flush=True)
"""


def test_a_writer_killed_in_the_middle_of_a_file_leaves_only_a_hidden_partial_that_a_resume_removes(
    tmp_path: Path, make_trajectory
) -> None:
    root = tmp_path / "wh"
    with Warehouse(root) as wh:
        wh.write_trajectories([make_trajectory("kept", s, True) for s in range(3)])
    writer = spawn(BIG_WRITER, root, 400, 40_000)
    partial: list[Path] = []
    try:
        assert writer.stdout.readline().strip() == "writing", writer.stderr.read()
        deadline = time.monotonic() + 60
        while not partial and writer.poll() is None and time.monotonic() < deadline:
            partial = list((root / "tables").rglob("*.partial"))
            if partial:
                # Frozen at once, then checked: on busy cores the writer can finish the file it was seen writing
                # before the kill lands, which would leave no partial to test.
                os.kill(writer.pid, signal.SIGSTOP)
                if not any(path.exists() for path in partial):
                    partial = []
                    os.kill(writer.pid, signal.SIGCONT)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert partial, "the writer was killed while a file was being written"
    assert writer.returncode == -signal.SIGKILL

    # Readers see the rows written before, and none of the killed write.
    reader = Warehouse(root, read_only=True)
    assert reader.sql("SELECT count(*) AS n FROM trajectories")["n"][0] == 3
    assert reader.stored_episodes(RUN, 0) == {("kept", 0), ("kept", 1), ("kept", 2)}
    assert list(root.rglob("*.partial")), "a read-only warehouse removes nothing"

    # A resumed writer removes what the killed one left and writes the batch again.
    resumed = Warehouse(root)
    assert {task for task, _ in resumed.stored_episodes(RUN, 0)} == {"kept"}
    assert not list(root.rglob("*.partial"))
    orphans = resumed.sql("SELECT count(*) AS n FROM steps s ANTI JOIN trajectories t USING (trajectory_id)")["n"][0]
    assert orphans == 0
