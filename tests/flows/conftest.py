"""A real Prefect API for flow tests: Prefect's own test harness (a temporary database and server)."""

import pytest


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny_config():
    return make_tiny_config


def make_tiny_config(state_dir, **overrides):
    """A round that finishes in about a minute on two cores, with every stage real."""
    from coevolve.config import load_config

    values = {
        "state_dir": str(state_dir),
        "run_id": "e2e",
        "seed": 3,
        "policy": {"sft_tasks": 16, "sft_steps": 40, "hidden_size": 32, "num_layers": 1, "vocab_size": 600, "sft_batch_size": 8},
        "pool": {"seed_size": 12},
        "rollout": {"tasks_per_round": 4, "group_size": 2, "max_new_tokens": 40, "heldout_tasks": 4},
        "environment": {"max_steps": 6},
        "signals": {"rare_min_total": 1, "rare_theta": 60, "max_signals_per_round": 4},
        "synthesis": {"explorations_per_signal": 2},
        "training": {"steps_per_round": 1},
    }
    for key, value in overrides.items():
        values.setdefault(key, {}).update(value) if isinstance(value, dict) else values.__setitem__(key, value)
    return load_config(data=values, environ={})
