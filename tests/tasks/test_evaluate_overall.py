"""The multi-turn overall is computed as bfcl-eval's leaderboard computes it."""

from __future__ import annotations

import ast
from pathlib import Path

import bfcl_eval
import pytest

from coevolve.config import EnvironmentConfig
from envs.bfcl.official import multi_turn_overall
from tasks.evaluate import official_overall


def _bfcl_unweighted_accuracy():
    """bfcl-eval's own calculate_unweighted_accuracy, compiled alone from its module's source: importing
    the module pulls every API client bfcl-eval supports (anthropic, google, ...), which are not installed."""
    source = Path(bfcl_eval.__file__).parent / "eval_checker" / "eval_runner_helper.py"
    tree = ast.parse(source.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "calculate_unweighted_accuracy"]
    namespace: dict = {}
    code = compile(ast.Module(body=[node], type_ignores=[]), str(source), "exec")
    exec(code, namespace)  # noqa: S102 -- bfcl-eval's own installed source, never model output
    return namespace["calculate_unweighted_accuracy"]


def _bfcl_overall(accuracies: dict[str, float]) -> float:
    calculate_unweighted_accuracy = _bfcl_unweighted_accuracy()
    categories = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
    scores = [
        {"accuracy": accuracies[c], "total_count": 200, "display_accuracy": accuracies[c]}
        if c in accuracies
        else {"accuracy": 0, "total_count": 0, "display_accuracy": "N/A"}
        for c in categories
    ]
    return calculate_unweighted_accuracy(scores, display_na_if_category_missing=False)["accuracy"]


@pytest.mark.parametrize(
    "accuracies",
    [
        {
            "multi_turn_base": 0.63,
            "multi_turn_miss_func": 0.4,
            "multi_turn_miss_param": 0.35,
            "multi_turn_long_context": 0.5,
        },
        {"multi_turn_base": 0.265, "heldout": 0.9},
    ],
)
def test_overall_matches_bfcl_evals_unweighted_mean(accuracies):
    assert multi_turn_overall(accuracies) == pytest.approx(_bfcl_overall(accuracies))
    # The evaluation flow's overall for the BFCL environment is that one, under the leaderboard's name.
    name, overall = official_overall(EnvironmentConfig(), accuracies)
    assert name == "multi_turn_overall" and overall == pytest.approx(_bfcl_overall(accuracies))


def test_no_multi_turn_category_means_no_overall():
    assert multi_turn_overall({"heldout": 0.5, "dev": 0.2}) is None
    assert official_overall(EnvironmentConfig(), {"heldout": 0.5, "dev": 0.2}) is None
