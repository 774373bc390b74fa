"""Two processes start rounds of the same run at once: one proceeds, the other stops at once and says why."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow


def test_a_second_process_on_a_running_run_stops_with_the_lock_message(tiny_config, cli, tmp_path) -> None:
    # A long SFT keeps the first round inside its lock while the second one starts.
    config = tiny_config(tmp_path / "state", policy={"sft_steps": 20000})
    config_file = cli.write_config_file(config, tmp_path / "config.yaml")
    owner = config.run_dir() / "round.owner"
    first = cli.start_round(config_file, config.state_dir, 0, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 300
        while not owner.exists():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first round never took the lock"
            time.sleep(0.2)
        second = cli.start_round(
            config_file, config.state_dir, 1, tmp_path / "second.log", prefect_home=tmp_path / "prefect-2"
        )
        assert second.wait(timeout=300) == 2
        message = (tmp_path / "second.log").read_text()
        assert "error: Run 'e2e' is already running a round in another process" in message
        assert first.poll() is None, "the first round must still be running"
        assert f"pid={first.pid} round=0" in owner.read_text()
    finally:
        cli.kill_group(first)
