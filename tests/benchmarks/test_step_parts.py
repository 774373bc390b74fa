"""benchmarks/step_parts.py: one real two-step round, its wall time split into parts that add up."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.step_parts import REST, ROOT, STEP_STAGES, main, markdown
from tests.conftest import make_tiny_config

pytestmark = pytest.mark.slow

TOLERANCE_S = 0.01  # the timers' own cost and clock granularity


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, prefect_api) -> dict:
    base = tmp_path_factory.mktemp("step-parts")
    config = make_tiny_config(base / "unused", training={"updates_per_batch": 1})
    config_file = base / "config.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return main(["--steps", "2", "--state-dir", str(base / "state"), "--config", str(config_file)])


def _children(rows: list[dict], row: dict) -> list[dict]:
    depth, path = row["depth"], row["path"]
    return [r for r in rows if r["depth"] == depth + 1 and r["path"][: depth + 1] == path]


def test_every_part_and_every_rest_is_non_negative(measured):
    assert measured["rows"], "no part was timed"
    for row in measured["rows"]:
        assert row["seconds"] >= (-TOLERANCE_S if row["rest"] else 0.0), row


def test_the_parts_inside_a_part_sum_to_no_more_than_it(measured):
    rows = measured["rows"]
    parents = [r for r in rows if not r["rest"] and _children(rows, r)]
    assert any(r["path"] == [ROOT, "rollout"] for r in parents)
    for row in parents:
        inside = [c for c in _children(rows, row) if not c["rest"] and not (c["concurrent"] and not row["concurrent"])]
        assert sum(c["seconds"] for c in inside) <= row["seconds"] + TOLERANCE_S, row["path"]
        (rest,) = [c for c in _children(rows, row) if c["rest"]]
        assert rest["seconds"] == pytest.approx(row["seconds"] - sum(c["seconds"] for c in inside), abs=1e-9)


def test_the_rollout_is_split_into_the_engine_generation_and_the_environment(measured):
    rollout = {r["path"][-1]: r for r in measured["rows"] if r["path"][:2] == [ROOT, "rollout"]}
    for part in ("engine open and weight load", "generation", "environment", "warehouse writes"):
        assert rollout[part]["calls"] > 0 and rollout[part]["step"], part
    assert rollout["generation"]["seconds"] > 0


def test_steps_times_the_per_step_figures_are_the_rounds_step_time(measured):
    steps, rows = measured["steps"], measured["rows"]
    assert steps == 2 and len(measured["step_s"]) == 2
    step_parts = [r for r in rows if r["depth"] == 1 and r["step"]]
    assert {r["part"] for r in step_parts} >= set(STEP_STAGES)
    assert steps * sum(r["per_step"] for r in step_parts) == pytest.approx(measured["steps_s"], abs=TOLERANCE_S)
    # The round holds the steps and the per-round stages, and nothing is counted twice.
    round_row = next(r for r in rows if r["path"] == [ROOT])
    top = [r for r in rows if r["depth"] == 1 and r["part"] != REST]
    assert measured["steps_s"] < sum(r["seconds"] for r in top) <= round_row["seconds"] + TOLERANCE_S
    assert {"prepare", "mine", "synthesize", "validate", "evaluate", "version"} <= {r["part"] for r in top}


def test_the_table_nests_the_parts_and_ends_with_the_steps_total(measured):
    table = markdown(measured["rows"], measured["steps"], measured["round_s"]).splitlines()
    assert table[0].startswith("| part | per step (mean of 2) |")
    for stage in ("prepare", "rollout", "update", "mine", "synthesize", "validate", "evaluate", "version"):
        assert sum(line.startswith(f"| {stage} stage |") for line in table) == 1, stage
    rollout = table.index(next(line for line in table if line.startswith("| rollout stage |")))
    assert any("of which generation" in line for line in table[rollout:])
    assert table[-1].startswith("| **training steps: rollout + update + release, all 2** |")
