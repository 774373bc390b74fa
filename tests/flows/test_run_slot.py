"""The run's slot on a Prefect server (flows/stage.run_slot): one round of a run at a time across machines.

With ``placement.round_concurrency: fail`` a second round is refused as soon as the server answers that the
slot is held (423 Locked), and a slow answer is not taken for a held slot: the server is given up to
FAIL_FAST_TIMEOUT_S to answer. A real Prefect API (the session's test harness) holds the limit.
"""

from __future__ import annotations

import pytest
from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError
from prefect.settings import PREFECT_API_URL

from coevolve.errors import RoundLockedError
from flows.stage import run_slot


@pytest.fixture
def fail_config(prefect_api, tiny_config, tmp_path, monkeypatch):
    # run_slot guards only rounds that talk to a Prefect server through PREFECT_API_URL, as placed rounds do.
    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    return tiny_config(tmp_path, run_id="slot", placement={"round_concurrency": "fail"})


def test_a_second_round_is_refused_by_the_servers_answer_naming_the_run(fail_config) -> None:
    with run_slot(fail_config, 0):
        with pytest.raises(RoundLockedError, match="Run 'slot' is already running a round") as refused:
            with run_slot(fail_config, 1):
                pass
    # Refused because the server said the slot is held, not because the wait for its answer ran out.
    assert isinstance(refused.value.__cause__, ConcurrencySlotAcquisitionError)


def test_the_slot_is_free_again_once_the_round_that_held_it_ends(fail_config) -> None:
    with run_slot(fail_config, 0):
        pass
    with run_slot(fail_config, 1):
        pass
