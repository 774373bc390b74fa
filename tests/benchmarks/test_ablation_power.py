"""benchmarks/ablation_power.py: one JSON line per design, with the runs it costs and what it detects."""

import json

from benchmarks.ablation_power import main


def test_each_design_prints_its_runs_and_the_smallest_differences_it_detects(capsys):
    main(["--seeds", "2,10", "--tasks", "40,2000", "--arms", "4", "--draws", "20", "--step", "0.05"])
    printed = map(json.loads, capsys.readouterr().out.splitlines())
    lines = {(line["seeds"], line["final_tasks"]): line for line in printed}
    assert list(lines) == [(2, 40), (2, 2000), (10, 40), (10, 2000)]
    assert [line["runs"] for line in lines.values()] == [8, 8, 40, 40]
    # Two seeds of 40 tasks detect not even 0.1; ten seeds of 2,000 tasks detect the search's first step.
    assert lines[2, 40]["detectable_arm_vs_arm"] is None and lines[2, 40]["detectable_arm_vs_checkpoint0"] is None
    assert lines[10, 2000]["detectable_arm_vs_arm"] == 0.05 and lines[10, 2000]["detectable_arm_vs_checkpoint0"] == 0.05
