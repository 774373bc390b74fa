"""An ablation's claims can be checked from three small files: per-task outcomes, per-round outcomes and the runs'
figures, written beside the report, from which `coevolve report` writes the same report again."""

import json
import subprocess
import sys

import polars as pl
import pytest

from coevolve.errors import DataError
from flows.cli import main as cli_main
from tasks.ablation.inference import estimate_structure, two_way_test
from tasks.ablation.outcomes import (
    OUTCOMES_FILE,
    ROUND_OUTCOMES_FILE,
    RUNS_FILE,
    merge_results,
    read_results,
    write_results,
)
from tasks.ablation.report import write_report
from tasks.ablation.report_summary import matched_rounds, summarize
from tests.flows.conftest import REPO, cli_env

TASKS = [f"t{i:02d}" for i in range(12)]
DRAWS = 10  # simulated experiments per effect in the power line: its figure is not what these tests check


def scored_run(arm, seed, steps, solved_by_round, final_solved):
    """A run whose checkpoint after round r solves the first ``solved_by_round[r]`` per-round held-out tasks and
    whose final checkpoint the first ``final_solved`` final-split tasks; ``steps``: optimizer steps per round."""
    rounds = [
        {
            "round": r,
            "heldout_success": solved / len(TASKS),
            "pool_size": 100 + r,
            "accepted": 3,
            "rejected": 1,
            "signals": {"forgetting": 1, "boundary": 2, "rare": 3},
            "optimizer_steps": step_count,
            "checkpoint": f"/machine/path/round-{r:03d}",
        }
        for r, (step_count, solved) in enumerate(zip(steps, solved_by_round, strict=True))
    ]
    rounds[0]["baseline_heldout_success"] = 2 / len(TASKS)
    return {
        "arm": arm,
        "seed": seed,
        "run_id": f"abl-{arm}-s{seed}",
        "rounds": rounds,
        "official": {"multi_turn_base": 0.1},
        "heldout_outcomes": {t: i < final_solved for i, t in enumerate(TASKS)},
        "baseline_outcomes": {t: i < 2 for i, t in enumerate(TASKS)},
        "heldout_size": len(TASKS),
        "heldout_digest": "d1",
        "tested_split": "final-heldout",
        "round_heldout_outcomes": {r: {t: i < n for i, t in enumerate(TASKS)} for r, n in enumerate(solved_by_round)},
        "baseline_round_outcomes": {t: i < 2 for i, t in enumerate(TASKS)},
    }


# `static` skips flat groups and so takes fewer steps than `full`; `random` as many as `full`.
RESULTS = [
    *(scored_run("full", s, [4, 4, 4], [3, 5, 7 + s % 2], 7 + s % 2) for s in (1, 2, 3)),
    *(scored_run("static", s, [2, 2, 4], [2, 3, 4 + s % 2], 4 + s % 2) for s in (1, 2, 3)),
    *(scored_run("random", s, [4, 4, 4], [3, 4, 6 + s % 3], 6 + s % 3) for s in (1, 2, 3)),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of RESULTS and the files beside it, written once."""
    folder = tmp_path_factory.mktemp("ablation")
    return folder, write_report(RESULTS, folder, "Ablation `abl`", power_draws=DRAWS)


def test_the_report_writes_the_outcomes_the_rounds_and_the_runs_beside_itself(report):
    folder, out = report
    assert sorted(p.split("/")[-1] for p in out["files"]) == sorted([OUTCOMES_FILE, ROUND_OUTCOMES_FILE, RUNS_FILE])
    final = pl.read_csv(folder / OUTCOMES_FILE)
    assert final.columns == ["task_id", "checkpoint0", *(f"{r['arm']}/s{r['seed']}" for r in RESULTS)]
    assert final["task_id"].to_list() == TASKS and final["full/s1"].sum() == 8 and final["checkpoint0"].sum() == 2
    per_round = pl.read_csv(folder / ROUND_OUTCOMES_FILE)
    assert per_round["static/s2/r1"].sum() == 3 and len(per_round.columns) == 2 + 9 * 3
    lines = [json.loads(line) for line in (folder / RUNS_FILE).read_text().splitlines()]
    assert [line["run_id"] for line in lines] == [r["run_id"] for r in RESULTS]
    assert "checkpoint" not in lines[0]["rounds"][0], "a path of the machine that ran it is not a result"
    assert "`coevolve report <this folder>`" in (folder / "report.md").read_text()


def test_the_runs_read_back_from_the_files_give_every_test_the_same_result(report):
    again = summarize(read_results(report[0]))
    first = summarize(RESULTS)
    for family in ("tests", "ckpt0_tests", "new_task_tests", "step_matched_tests"):
        assert again[family] == first[family]


def test_runs_are_matched_after_the_rounds_where_both_have_taken_the_smaller_step_total():
    full, static = RESULTS[0], RESULTS[3]
    # full: 4, 8, 12 steps after rounds 0-2; static: 2, 4, 8. Matched at 8: full after round 1, static after 2.
    assert matched_rounds(full, static) == (1, 2, 8)
    assert matched_rounds(full, RESULTS[6]) == (2, 2, 12)
    assert matched_rounds({**full, "rounds": [{"round": 0}]}, static) is None


def test_the_step_matched_comparison_tests_those_rounds_outcomes_and_is_its_own_family(report):
    summary = summarize(RESULTS)
    matched = summary["step_matched_tests"]
    assert list(matched) == ["full vs static", "full vs random", "random vs static"]
    full = {r["seed"]: r["round_heldout_outcomes"][1] for r in RESULTS if r["arm"] == "full"}
    static = {r["seed"]: r["round_heldout_outcomes"][2] for r in RESULTS if r["arm"] == "static"}
    expected = two_way_test(full, static)
    assert matched["full vs static"]["mean_diff"] == pytest.approx(expected["mean_diff"])
    assert matched["full vs static"]["p"] == pytest.approx(expected["p"]) and matched["full vs static"]["steps"] == 8
    # Unmatched, full's final checkpoint is compared with static's after fewer steps: a larger gap.
    assert summary["tests"]["static"]["mean_diff"] > matched["full vs static"]["mean_diff"]
    assert "### Family 6: at equal optimizer steps (3 comparisons, Holm)" in (report[0] / "report.md").read_text()


def test_new_tasks_against_replaying_d0_is_tested_as_random_against_static(report):
    summary = summarize(RESULTS)
    random_ = {r["seed"]: r["heldout_outcomes"] for r in RESULTS if r["arm"] == "random"}
    static = {r["seed"]: r["heldout_outcomes"] for r in RESULTS if r["arm"] == "static"}
    assert summary["new_task_tests"]["static"]["p"] == pytest.approx(two_way_test(random_, static)["p"])
    assert "### Family 5: `random` against `static` (1 comparisons, Holm)" in (report[0] / "report.md").read_text()
    assert summarize([r for r in RESULTS if r["arm"] != "random"])["new_task_tests"] == {}


def test_a_folder_without_the_runs_file_is_refused_naming_what_to_give(tmp_path):
    with pytest.raises(DataError, match=r"No runs.jsonl in .*state_dir/reports/<name>"):
        read_results(tmp_path)
    (tmp_path / RUNS_FILE).write_text('{"arm": "full"\n')
    with pytest.raises(DataError, match="runs.jsonl line 1 is not JSON"):
        read_results(tmp_path)


def test_coevolve_report_writes_and_prints_the_same_report_from_the_files_alone(report, tmp_path):
    folder = report[0]
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "report", str(folder), "--out", str(tmp_path / "again"),
         "--power-draws", str(DRAWS)],
        cwd=REPO, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "again" / "report.md").read_text() == (folder / "report.md").read_text()
    assert done.stdout.startswith("# Ablation `abl`") and f"report: {tmp_path / 'again' / 'report.md'}" in done.stdout


def parts_by_seed(tmp_path, results, seed_groups):
    """``results`` written as parts of one ablation, one folder per group of seeds, as machines would play them."""
    folders = []
    for i, seeds in enumerate(seed_groups):
        folders.append(tmp_path / f"part{i}")
        write_results([r for r in results if r["seed"] in seeds], folders[-1])
    return folders


def test_an_ablation_played_in_parts_reports_as_one_from_the_parts_folders(tmp_path):
    # `coevolve ablation` plays seed after seed, so the whole ablation's runs come in seed order.
    in_seed_order = sorted(RESULTS, key=lambda r: r["seed"])
    write_report(in_seed_order, tmp_path / "played-whole", "Ablation `abl`", power_draws=DRAWS)
    folders = parts_by_seed(tmp_path, in_seed_order, [{1}, {2, 3}])
    # The command in this process: the test above runs it as a user does.
    assert cli_main(["report", *map(str, folders), "--out", str(tmp_path / "joined"), "--power-draws", str(DRAWS)]) == 0
    for name in ("report.md", OUTCOMES_FILE, ROUND_OUTCOMES_FILE, RUNS_FILE):
        assert (tmp_path / "joined" / name).read_text() == (tmp_path / "played-whole" / name).read_text(), name


def test_parts_that_share_a_run_or_differ_in_checkpoint_0_are_refused_naming_both_folders(tmp_path):
    overlapping = parts_by_seed(tmp_path, RESULTS, [{1, 2}, {2, 3}])
    with pytest.raises(DataError, match=r"Run full/s2 is in both .*part0 and .*part1"):
        merge_results({str(f): read_results(f) for f in overlapping})
    other_checkpoint0 = [{**r, "baseline_outcomes": dict.fromkeys(TASKS, True)} for r in RESULTS if r["seed"] == 3]
    write_results(other_checkpoint0, tmp_path / "other")
    parts = {str(tmp_path / "part0"): read_results(tmp_path / "part0"), "other": read_results(tmp_path / "other")}
    with pytest.raises(DataError, match=r"other and .*part0 are parts of different ablations: their baseline_outcomes"):
        merge_results(parts)


def test_the_power_line_is_simulated_with_the_structure_of_the_runs_own_outcomes(report):
    folder, out = report
    arms = {}
    for r in RESULTS:
        arms.setdefault(r["arm"], {})[r["seed"]] = r["heldout_outcomes"]
    assert out["structure"] == estimate_structure(arms, RESULTS[0]["baseline_outcomes"])
    assert (
        f"estimated from these runs' own outcomes (checkpoint 0 solves {2 / 12:.3f};"
        in (folder / "report.md").read_text()
    )


def test_runs_without_per_task_outcomes_are_simulated_with_the_default_structure_and_say_so(tmp_path):
    bare = [{k: v for k, v in r.items() if "outcomes" not in k} for r in RESULTS]
    out = write_report(bare, tmp_path, "Ablation `abl`", power_draws=DRAWS)
    assert out["structure"] is None and "with the default structure" in (tmp_path / "report.md").read_text()


def test_a_round_without_held_out_outcomes_leaves_the_other_rounds_in_the_file(tmp_path):
    unscored = [{**r, "round_heldout_outcomes": {**r["round_heldout_outcomes"], 0: {}}} for r in RESULTS]
    write_results(unscored, tmp_path)
    per_round = pl.read_csv(tmp_path / ROUND_OUTCOMES_FILE)
    assert per_round.height == len(TASKS) and "full/s1/r1" in per_round.columns
    assert "full/s1/r0" not in per_round.columns


@pytest.mark.parametrize(
    "content",
    ["task_id,checkpoint0,full/s1\nt00,1,2\n", "task_id,full/s1\nt00,1\n", "task_id,checkpoint0\nt00,\n", "\x00\x01"],
)
def test_an_outcomes_file_that_is_not_one_is_refused_naming_the_file_and_the_command_that_writes_it(
    report, tmp_path, content
):
    for name in (RUNS_FILE, ROUND_OUTCOMES_FILE):
        (tmp_path / name).write_bytes((report[0] / name).read_bytes())
    (tmp_path / OUTCOMES_FILE).write_text(content)
    with pytest.raises(DataError, match=rf"{OUTCOMES_FILE} is not an outcomes file .* run the `coevolve ablation`"):
        read_results(tmp_path)
