"""Verdict agreement with bfcl-eval's own checker on perturbed official answers.

For every entry of the four multi-turn categories the official answer is perturbed four ways
(drop a call, change an argument, add a call, move a call to another turn). Each perturbed call
sequence is scored twice: by BfclEnvironment (each turn's calls as one message, then "done") and
by bfcl_eval's ``multi_turn_checker`` on the same call strings, exactly as bfcl's evaluation
pipeline calls it (its multi-turn runner imports ``multi_turn_irrelevance_checker`` but never calls
it). The two must agree on every sequence: valid or not, and for a failure, its error type.

bfcl's checker executes the call strings with ``eval``. That is acceptable only here: the inputs
are this file's own perturbations of official answers, never model output.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from typing import Any

import pytest
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

import envs.bfcl.api as bfcl_api
from envs.bfcl.environment import BfclEnvironment
from envs.bfcl.official import CATEGORIES, official_tasks

# Check-specific model names keep bfcl's per-(model, entry) instances apart; this prefix finds them again.
MODEL_PREFIX = "agreementcheck"
KINDS = ("drop", "change", "add", "move")


def _entries(category: str) -> list[tuple[dict[str, Any], list[list[str]]]]:
    entries = bfcl_api.load_jsonl(bfcl_api.DATA_DIR / f"BFCL_v4_{category}.json")
    answers = bfcl_api.load_jsonl(bfcl_api.DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json")
    by_id = {a["id"]: a["ground_truth"] for a in answers}
    return [(entry, by_id[entry["id"]]) for entry in entries]


# -- perturbations ---------------------------------------------------------------------------------
def _changed(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([1, -1, 7])
    if isinstance(value, float):
        return value + rng.choice([0.5, -1.25, 10.0])
    if isinstance(value, str):
        return rng.choice([value + "_x", value.upper() if value != value.upper() else value + "2", "", "other"])
    if isinstance(value, list):
        return value[:-1] if value and rng.random() < 0.5 else value + ["extra"]
    if isinstance(value, dict):
        return {**value, "extra": 1} if not value or rng.random() < 0.5 else dict(list(value.items())[:-1])
    return "x"


def change_argument(call: str, rng: random.Random) -> str | None:
    """The call with one literal argument changed; None when it has no argument."""
    node = ast.parse(call, mode="eval").body
    slots = [("pos", i) for i in range(len(node.args))] + [("kw", i) for i in range(len(node.keywords))]
    if not slots:
        return None
    kind, index = rng.choice(slots)
    holder = node.args if kind == "pos" else [kw.value for kw in node.keywords]
    new = ast.parse(repr(_changed(ast.literal_eval(holder[index]), rng)), mode="eval").body
    if kind == "pos":
        node.args[index] = new
    else:
        node.keywords[index].value = new
    return ast.unparse(node)


def perturb(answer: list[list[str]], kind: str, rng: random.Random) -> list[list[str]] | None:
    """One perturbed copy of ``answer``, or None when ``kind`` does not apply to it."""
    turns = [list(turn) for turn in answer]
    spots = [(t, i) for t, turn in enumerate(turns) for i in range(len(turn))]
    if not spots:
        return None
    t, i = rng.choice(spots)
    if kind == "drop":
        del turns[t][i]
    elif kind == "change":
        options = [(t, i) for t, i in spots if change_argument(turns[t][i], random.Random(0)) is not None]
        if not options:
            return None
        t, i = rng.choice(options)
        turns[t][i] = change_argument(turns[t][i], rng)
    elif kind == "add":
        target = rng.randrange(len(turns))
        turns[target].insert(rng.randint(0, len(turns[target])), turns[t][i])
    elif kind == "move":
        if len(turns) < 2:
            return None
        call = turns[t].pop(i)
        target = rng.choice([k for k in range(len(turns)) if k != t])
        turns[target].insert(rng.randint(0, len(turns[target])), call)
    return turns


# -- the two scorers -------------------------------------------------------------------------------
def environment_verdict(env: BfclEnvironment, task, sequence: list[list[str]]) -> tuple[bool, str | None]:
    env.reset(task)
    for calls in sequence:
        if calls:
            env.step("[" + ", ".join(calls) + "]")
        if env.step("done").done:
            break
    _, success, details = env.score()
    return success, None if success else details["error_type"]


def bfcl_verdict(
    entry: dict, answer: list[list[str]], sequence: list[list[str]], model_name: str
) -> tuple[bool, str | None]:
    # bfcl's decoder drops empty steps, so a turn without calls is an empty list of steps.
    decoded = [[calls] if calls else [] for calls in sequence]
    result = multi_turn_checker(decoded, answer, entry, entry["id"].rsplit("_", 1)[0], model_name)
    return result["valid"], None if result["valid"] else result["error_type"]


@pytest.fixture
def clean_bfcl_globals():
    """Removes the instances bfcl's executor leaves in its module globals for this file's model names."""
    yield
    for name in [n for n in vars(multi_turn_utils) if n.startswith(MODEL_PREFIX)]:
        delattr(multi_turn_utils, name)


@pytest.mark.slow
def test_verdicts_agree_with_bfcl_checker_on_perturbed_official_answers(clean_bfcl_globals):
    env = BfclEnvironment()
    checked: Counter[tuple[str, bool]] = Counter()
    disagreements: list[tuple[str, str, Any, Any]] = []
    number = 0
    for category in CATEGORIES:
        tasks = {t.description: t for t in official_tasks(category)}
        for entry, answer in _entries(category):
            rng = random.Random(entry["id"])
            for kind in KINDS:
                sequence = perturb(answer, kind, rng)
                if sequence is None:
                    continue
                number += 1
                ours = environment_verdict(env, tasks[entry["id"]], sequence)
                theirs = bfcl_verdict(entry, answer, sequence, f"{MODEL_PREFIX}{number}")
                checked[(kind, theirs[0])] += 1
                if ours != theirs:
                    disagreements.append((entry["id"], kind, ours, theirs))
    assert sum(checked.values()) >= 2000
    # Both verdicts occur for every kind, so agreement is not trivially all-fail.
    assert all(checked[(kind, False)] > 0 for kind in KINDS)
    assert sum(n for (kind, valid), n in checked.items() if valid) > 0
    # Same verdict and, for failures, the same bfcl error type.
    assert disagreements == []


def test_unperturbed_answers_are_valid_for_both_scorers(clean_bfcl_globals):
    env = BfclEnvironment()
    for category in CATEGORIES:
        tasks = {t.description: t for t in official_tasks(category, limit=5)}
        for entry, answer in _entries(category)[:5]:
            assert environment_verdict(env, tasks[entry["id"]], answer) == (True, None)
            assert bfcl_verdict(entry, answer, answer, f"{MODEL_PREFIX}gt_{entry['id']}") == (True, None)
