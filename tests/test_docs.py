"""The README and the docs/ pages: every page is reachable from the README, every documented command is one
the CLI accepts with a configuration that loads, and the facts the pages state about the code say what the code
and its configurations say.

The commands are read from the fenced ``bash`` blocks wherever they live (tests/doc_blocks.py); nothing is run
but the CLI's argument parser and the configuration loader, so a renamed flag, subcommand or setting fails here.
The stated facts (the ablation's arms, options, run counts and settings, folder names, how the curriculum's prior
is formed, the labels and figures of the result tables, where the README's sample output came from) are read from
the code, configs/ablation.yaml and git, never copied into this file.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from coevolve.config import load_config
from flows.cli import build_parser
from storage import task_stats
from tasks.ablation.arms import ARMS, CURRICULUM_SUFFIX
from tasks.ablation.outcomes import merge_results, read_results
from tasks.ablation.report import write_report
from tasks.ablation.report_summary import run_total
from tasks.training.launch import launch_dir
from tests.doc_blocks import (
    FENCED_BLOCK,
    REPO,
    command_blocks,
    command_pages,
    doc_pages,
    prose,
    sample_outputs,
    sentences,
    split_sentences,
    tables,
)

README = REPO / "README.md"
EXPERIMENTS = REPO / "docs" / "experiments.md"
ABLATION_REPORT = REPO / "docs" / "ablation_report.md"
ABLATION_CONFIG = REPO / "configs" / "ablation.yaml"
WORKPLACE_REPORT = REPO / "docs" / "workplace_ablation_report.md"
# The ten-seed ablation's parts, one folder of outcome files each, committed as their seeds finished.
TEN_SEED_PARTS = REPO / "docs" / "ablation10_data"
# Each committed report and the folders of outcome files it rests on (tasks/ablation/outcomes.py), joined in order.
REPORT_DATA = {
    ABLATION_REPORT: sorted(p for p in TEN_SEED_PARTS.iterdir() if p.is_dir()),
    WORKPLACE_REPORT: [REPO / "docs" / "workplace_ablation_data"],
}
NUMBER_WORDS = {
    word: n for n, word in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}


def _coevolve_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, the arguments after `coevolve`, the variables the block exported before it) for each documented call."""
    found = []
    for block in command_blocks():
        exported: dict[str, str] = {}
        for number, words in enumerate(block.commands(), start=1):
            if words[0] == "export":
                exported.update(word.split("=", 1) for word in words[1:] if "=" in word)
                continue
            if words[0].endswith("bin/coevolve"):
                args = [w for w in words[1:] if w != "&"]
                where = f"{block.page.relative_to(REPO)}: {args[0]}, command {number} of its block"
                found.append((where, args, dict(exported)))
    return found


COMMANDS = _coevolve_commands()


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    unlinked = [page.name for page in doc_pages()[1:] if f"](docs/{page.name})" not in readme]
    assert unlinked == []


def test_the_documentation_shows_the_commands_a_newcomer_starts_with():
    assert len(COMMANDS) >= 20  # every page's examples are found, not just the README's
    assert any(
        "make run" in block.text and "make test" in block.text
        for block in command_blocks()
        if block.page.name == "README.md"
    )


@pytest.mark.parametrize(("where", "args", "exported"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_parses_and_its_configuration_loads(where, args, exported, monkeypatch):
    monkeypatch.chdir(REPO)  # the docs run commands from the repository root (configs/..., deployments/...)
    args = ["/tmp/checkpoint" if a == "$CKPT" else a for a in args]
    parsed = build_parser().parse_args(args)  # an unknown subcommand or flag exits with argparse's usage error
    if hasattr(parsed, "set"):
        environ = {k: v for k, v in exported.items() if k.startswith("COEVOLVE_")}
        load_config(parsed.config, parsed.set, environ=environ)


def _ablation_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["ablation"]


ABLATION_SEEDS = _ablation_parser().get_default("seeds").split(",")


def _section(page: Path, heading: str) -> str:
    """The text of ``page`` from the line ``heading`` to the next heading of its level or above."""
    text = page.read_text()
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = re.compile(rf"^#{{1,{len(level)}}} ", re.M).search(text, start + len(heading) + 2)
    return text[start : end.start() if end else len(text)]


def test_every_list_of_ablation_arms_is_the_registry():
    """`coevolve ablation --help` and experiments.md's arms are tasks/ablation/arms.py's ARMS; the README's headline
    tables (BFCL's and the workplace's) list registered arms in the registry's order, `static`, `random` and `full`
    among them (the others are optional)."""
    arms_help = str(next(a.help for a in _ablation_parser()._actions if a.dest == "arms"))
    assert [name.strip(" .") for name in arms_help.split("):", 1)[1].split(",")] == list(ARMS)
    headlines = [t for t in tables(README) if t.header[0] == "arm" and "gain over checkpoint 0" in t.header]
    assert len(headlines) == 2
    for headline in headlines:
        listed = [row[0] for row in headline.rows]
        assert listed == [arm for arm in ARMS if arm in listed]
        assert {"static", "random", "full"} <= set(listed)
    described = next(p for p in re.split(r"\n\s*\n", prose(EXPERIMENTS)) if p.startswith("Arms, "))
    assert set(re.findall(r"`([a-z][a-z+-]*)`", described)) == set(ARMS)


def test_every_ablation_option_is_documented_with_its_default():
    """experiments.md's table of options names each option `coevolve ablation` takes, with its default."""
    config = load_config(None, [], environ={})
    options = {
        a.option_strings[-1]: a
        for a in _ablation_parser()._actions
        if a.option_strings and a.dest not in {"help", "config", "set"}
    }
    documented = {
        re.match(r"`(--[\w-]+)", row[0])[1]: row[1]  # type: ignore[index]
        for table in tables(EXPERIMENTS)
        if table.header[:2] == ["option", "default"]
        for row in table.rows
    }
    assert sorted(documented) == sorted(options)
    for option, action in options.items():
        if action.default is not None:
            assert f"`{action.default}`" in documented[option], option
        else:  # the help names what stands in for it: all arms, or a configuration field
            fallback = re.search(r"\(default: (\w+)\)", action.help or "")[1]  # type: ignore[index]
            expected = "all" if fallback == "all" else f"`{fallback}` ({getattr(config, fallback)})"
            assert documented[option].startswith(expected), option


RUNS = re.compile(r"\b(\d+) runs\b")
ARM_COUNT = re.compile(rf"\b({'|'.join(NUMBER_WORDS)})[ -]arms?\b", re.I)
SEED_RANGE = re.compile(r"\bseeds (\d+)-(\d+)\b")
GENERIC_RUNS = re.compile(r"\b(?:an|the) ablation's (\d+) runs\b", re.I)
LISTED_RUNS = re.compile(r"\b(\d+) runs: arms ([^;]+); seeds ([^;]+);")


def test_every_stated_number_of_ablation_runs_is_arms_times_seeds():
    """A run is one (arm, seed): "N runs" is the arms times the seeds its sentence names, and an ablation's runs
    in general are the registry's arms times the command's default seeds."""
    checked, wrong = 0, []
    for page in doc_pages():
        for sentence in sentences(page):
            if not RUNS.search(sentence):
                continue
            listed, arms, generic = (
                LISTED_RUNS.search(sentence),
                ARM_COUNT.search(sentence),
                GENERIC_RUNS.search(sentence),
            )
            seeds = SEED_RANGE.search(sentence)
            seed_count = int(seeds[2]) - int(seeds[1]) + 1 if seeds else len(ABLATION_SEEDS)
            if listed:
                expected, claims = len(listed[2].split(",")) * len(listed[3].split(",")), [int(listed[1])]
            elif arms:
                expected, claims = NUMBER_WORDS[arms[1].lower()] * seed_count, [int(n) for n in RUNS.findall(sentence)]
                if generic and NUMBER_WORDS[arms[1].lower()] != len(ARMS):
                    wrong.append((page.name, sentence))
            elif generic:
                expected, claims = len(ARMS) * seed_count, [int(generic[1])]
            else:
                continue
            checked += 1
            wrong += [(page.name, sentence) for claim in claims if claim != expected]
    assert checked >= 8 and wrong == []


SETS_VALUE = re.compile(r"`configs/ablation\.yaml`\)? sets (\d+)|(\d+) in `configs/ablation\.yaml`")
SETTING = re.compile(r"`(?:\w+\.)?(\w+)(?:: \w+)?`")


def test_every_value_quoted_from_configs_ablation_yaml_is_its_value():
    """A value the pages quote from configs/ablation.yaml ("sets N", "N in") is the value of the setting they name
    before it, and the ablation's "N dev tasks" is its rollout.dev_eval_tasks."""
    settings = {
        field: value
        for section in yaml.safe_load(ABLATION_CONFIG.read_text()).values()
        if isinstance(section, dict)
        for field, value in section.items()
    }
    checked, wrong = 0, []
    for page in doc_pages():
        for sentence in sentences(page):
            if "configs/ablation.yaml" not in sentence:
                continue
            for claim in SETS_VALUE.finditer(sentence):
                named = [m[1] for m in SETTING.finditer(sentence[: claim.start()]) if m[1] in settings]
                checked += 1
                if not named or settings[named[-1]] != int(claim[1] or claim[2]):
                    wrong.append((page.name, sentence))
            for count in re.findall(r"\b(\d+) dev tasks\b", sentence):
                checked += 1
                if int(count) != settings["dev_eval_tasks"]:
                    wrong.append((page.name, sentence))
    assert checked >= 4 and wrong == []


def test_documented_update_log_folders_are_the_ones_the_code_writes():
    """Every `update/round-...` folder the pages name has the shape of tasks/training/launch.py's launch_dir."""
    config = load_config(None, [], environ={})
    written = re.sub(r"\d", "N", launch_dir(config, 7, 3).relative_to(config.run_dir()).as_posix())
    documented = [
        (page.name, m[0]) for page in doc_pages() for m in re.finditer(r"update/round-[\w-]*", page.read_text())
    ]
    assert documented and [folder for _, folder in documented if folder != written] == [], written


def test_the_curriculum_prior_is_described_as_the_tasks_of_the_same_tools():
    """The task statistics' prior is what a task's kind (the tools it calls) scored; its descriptions say so."""
    sql = task_stats._TASK_DIFFICULTY
    assert "list_distinct(tools)" in sql and "PARTITION BY kind" in sql  # the code: a task's kind is its tools
    for page, heading in (
        (README, "## Curriculum and dynamic sampling"),
        (REPO / "storage" / "VIEWS.md", "## v_task_difficulty"),
    ):
        text = _section(page, heading)
        comments = [line for _, block in FENCED_BLOCK.findall(text) for line in block.splitlines()]
        said = [s for s in comments + split_sentences(text) if "prior" in s]
        assert [s for s in said if "origin" in s] == [], page.name
        assert any("same tools" in s for s in said), page.name


def test_the_readme_curriculum_snippet_states_its_episode_budget(tmp_path):
    """The README's curriculum settings say the most episodes they play a round on the default schedule, and what
    the default plays without them."""
    section = _section(README, "## Curriculum and dynamic sampling")
    snippet = tmp_path / "curriculum.yaml"
    snippet.write_text(next(block for language, block in FENCED_BLOCK.findall(section) if language == "yaml"))
    curriculum, default = load_config(snippet, [], environ={}), load_config(None, [], environ={})
    assert curriculum.rollout.dynamic_sampling and curriculum.training == default.training
    steps, n = default.training.batches_per_round, default.rollout.group_size
    most = steps * curriculum.rollout.tasks_per_batch * n * curriculum.rollout.max_rollout_factor
    text = " ".join(split_sentences(section))
    assert f"at most {most:g} episodes a round" in text
    assert f"({steps} x {default.rollout.tasks_per_batch} tasks x {n} samples)" in text


def _git_commit_exists(commit: str) -> bool:
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return found.returncode == 0


LAB_NOTES = REPO / "benchmarks" / "HISTORY.md"


def _lab_note(command: str, figure_starts: str, holding: str = "") -> list[str]:
    """The lab notes' row (commit, machine, command, figure, ...) of ``command`` whose figure starts with
    ``figure_starts`` and holds ``holding``; fails naming what was looked for when there is none."""
    rows = [
        row
        for table in tables(LAB_NOTES)
        if table.header[:4] == ["commit", "machine", "command", "figure"]
        for row in table.rows
        if row[2] == f"`{command}`" and row[3].startswith(figure_starts) and holding in row[3]
    ]
    assert rows, f"no row of benchmarks/HISTORY.md for `{command}`: {figure_starts} ... {holding}"
    return rows[0]


def test_sample_outputs_are_generic_and_the_readme_figures_are_rows_of_the_lab_notes():
    """No sample output holds a machine's own path; the README's `make run` rows and its two times are rows of
    benchmarks/HISTORY.md, whose commit exists, and experiments.md's table of figures quotes the same rows, time and
    commit."""
    machine_paths = [
        (page.name, path)
        for page in doc_pages()
        for block in sample_outputs(page)
        for path in re.findall(r"(?<![\w.])(?:/(?:work|root|home|Users)/\S*|~/\S*)", block)
    ]
    assert machine_paths == []
    text = README.read_text()
    output = next(block for block in sample_outputs(README) if "checkpoint 0 held-out success" in block)
    checkpoint0 = re.search(r"checkpoint 0 held-out success: ([\d.]+)", output)[1]  # type: ignore[index]
    rows = re.findall(r"^\s+\d+\s+(\d+)\s.*\s([\d.]+)\s+\d+s$", output, re.M)
    pools, heldout = "/".join(r[0] for r in rows), "/".join(r[1] for r in rows)
    quoted_rows = f"checkpoint 0 {checkpoint0}, pools {pools}, held-out {heldout}"
    timed = re.search(r"it took (\d+ min \d+ s) from a fresh clone", text)
    suite = re.search(r"its pytest part took (\d+ min \d+ s) \((\d+ passed, \d+ skipped)\)", text)
    assert rows and timed and suite
    run_note = _lab_note("make run", timed[1], quoted_rows)
    suite_note = _lab_note(".ci/run", suite[1], suite[2])
    shallow = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    )
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("not a full git checkout: the cited commits cannot be looked up")
    assert _git_commit_exists(run_note[0]) and _git_commit_exists(suite_note[0]), (run_note[0], suite_note[0])
    figures = {row[0]: row for table in tables(EXPERIMENTS) if table.header[0] == "figure" for row in table.rows}
    quoted = next(row for label, row in figures.items() if label.startswith("`make run` rows"))
    assert f"checkpoint 0 at {checkpoint0}, pools {pools}, held-out {heldout}" in quoted[0]
    assert quoted[3].split()[0] == run_note[0]
    timing = next(row for label, row in figures.items() if label.startswith("`make run` time"))
    assert timed[1] in timing[0] and timing[3].split()[0] == run_note[0]


SPLITS = ("final split", "per-round split")


def _final_split_results(report: Path) -> dict[str, str]:
    """Each arm's held-out success on the final split: the column `final` of the report's tests against
    checkpoint 0."""
    table = next(t for t in tables(report) if t.header[0] == "arm" and {"ckpt 0", "final"} <= set(t.header))
    return table.column(table.header.index("final"))


def _final_split_size(report: Path) -> int:
    found = re.search(r"Tested on the final held-out split: ([\d,]+) tasks", report.read_text())
    assert found, f"{report.name} does not say how many tasks its final split holds"
    return int(found[1].replace(",", ""))


def _quoted_report(label: str) -> Path:
    """The report a label's figures come from: the workplace's where the label names it, BFCL's otherwise."""
    return WORKPLACE_REPORT if "workplace" in label.lower() else ABLATION_REPORT


def test_held_out_success_labels_name_their_split_and_quote_the_report():
    """A column or row of held-out success names its split (and the split's size where it gives one), and figures
    labelled with the final split are those of the report of the environment the label names."""
    config = load_config(ABLATION_CONFIG, [], environ={})
    reports = (ABLATION_REPORT, WORKPLACE_REPORT)
    finals = {report: _final_split_results(report) for report in reports}
    final_sizes = {report: _final_split_size(report) for report in reports}
    unnamed: list[tuple[str, str]] = []
    wrong: list[tuple[str, ...]] = []
    quoted: list[tuple[str, str]] = []
    for page in doc_pages():
        for table in tables(page):
            labels = [(cell, table.column(i)) for i, cell in enumerate(table.header) if table.header[0] == "arm"]
            arms = [re.sub(r"\+l\.$", CURRICULUM_SUFFIX, cell) for cell in table.header[1:]]
            labels += [(row[0], dict(zip(arms, row[1:], strict=False))) for row in table.rows]
            for label, values in labels:
                if "held-out success" not in label.lower():
                    continue
                split = next((s for s in SPLITS if s in label), None)
                size = re.search(r"\(([\d,]+) tasks", label)
                report = _quoted_report(label)
                sizes = {"final split": final_sizes[report], "per-round split": config.rollout.heldout_tasks}
                if split is None:
                    unnamed.append((page.name, label))
                elif size and int(size[1].replace(",", "")) != sizes[split]:
                    wrong.append((page.name, label))
                final = finals[report]
                if split == "final split" and set(values) & set(final):
                    quoted.append((page.name, report.name))
                    wrong += [
                        (page.name, label, arm)
                        for arm in final
                        if arm in values and values[arm].split()[:1] != [final[arm]]
                    ]
    assert unnamed == [] and wrong == []
    assert {("README.md", ABLATION_REPORT.name), ("README.md", WORKPLACE_REPORT.name)} <= set(quoted)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_reaches_its_file_and_heading():
    """A link between the project's pages (README, docs/, the READMEs beside the code, the lab notes) names a file
    that exists and, after #, one of its headings: moving a section or a page breaks no link silently."""
    broken = []
    for page in [*command_pages(), LAB_NOTES]:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append((page.relative_to(REPO).as_posix(), target))
            elif anchor and linked.suffix == ".md":
                headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", prose(linked), re.M)}
                if anchor not in headings:
                    broken.append((page.relative_to(REPO).as_posix(), target))
    assert broken == []


@pytest.mark.parametrize("report", list(REPORT_DATA), ids=lambda p: p.name)
def test_a_committed_report_is_what_coevolve_report_writes_from_its_committed_outcomes(report, tmp_path):
    """Every table of the report (every test, p-value, Holm adjustment, per-run and mechanism row) comes back the
    same from the outcome files committed beside it, as `coevolve report <folder> [<folder> ...]` writes them."""
    runs = merge_results({folder.name: read_results(folder) for folder in REPORT_DATA[report]})
    written = write_report(runs, tmp_path, "recomputed", power_draws=2)
    recomputed = tables(Path(written["report"]))
    committed = [(t.header, t.rows) for t in tables(report)]
    assert any({"ckpt 0", "final"} <= set(t.header) for t in recomputed)  # the tests against checkpoint 0
    assert [(t.header, t.rows) for t in recomputed if (t.header, t.rows) not in committed] == []


def test_each_committed_part_of_the_ten_seed_ablation_is_its_documented_design_and_the_parts_join():
    """Every part in docs/ablation10_data plays the documented command's arms for each of its seeds, each run at
    least 100 optimizer steps and tested on the planned final split; experiments.md names every part in its join
    command; and the parts join into one ablation (no run twice, one split, one checkpoint 0)."""
    design = _section(EXPERIMENTS, "### Sizing the ten-seed ablation: a difference of 0.03 between two arms")
    arms = re.search(r"--arms (\S+)", design)[1].split(",")  # type: ignore[index]
    final_tasks = int(re.search(r"rollout\.final_heldout_tasks=(\d+)", design)[1])  # type: ignore[index]
    parts = {folder.name: read_results(folder) for folder in sorted(TEN_SEED_PARTS.iterdir()) if folder.is_dir()}
    assert parts
    for name, runs in parts.items():
        seeds = sorted({run["seed"] for run in runs})
        assert f"docs/ablation10_data/{name}" in design
        assert sorted((run["arm"], run["seed"]) for run in runs) == sorted((a, s) for a in arms for s in seeds), name
        assert all(run["heldout_size"] == final_tasks and run.get("heldout_outcomes") for run in runs), name
        assert min(run_total(run, "optimizer_steps") for run in runs) >= 100, name
    joined = merge_results(parts)
    assert len(joined) == sum(len(runs) for runs in parts.values())
