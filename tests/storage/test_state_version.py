"""The state folder's stamp (storage/state_version.py): a folder or run made with other versions than this code's
is refused before anything is written, with a way on that works; a folder this code made continues.

The folder of tests/fixtures/state-9079251 was made by commit 9079251 (its README has the command): one finished
round of the schedule before ``training.batches_per_round``, with no stamp.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coevolve.config import load_config
from coevolve.errors import DataError
from coevolve.records import RoundSummary
from storage.catalog import record_time
from storage.layouts import LATEST_RECORDS, LATEST_SCHEDULE, LATEST_VERSION
from storage.state_version import STATE_FILE, check_state, current_versions, finished_round_notice
from storage.warehouse import Warehouse

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "state-9079251"
CURRENT = {"layout": LATEST_VERSION, "records": LATEST_RECORDS, "schedule": LATEST_SCHEDULE}


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: what "nothing was written" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def config_for(state_dir: Path, **values: object):
    return load_config(data={"state_dir": str(state_dir), "run_id": "e2e", **values}, environ={})


def old_state_folder(tmp_path: Path) -> Path:
    """A copy of the folder commit 9079251 made (its warehouse: the only part any check reads)."""
    state = tmp_path / "old-state"
    shutil.copytree(FIXTURE / "warehouse", state / "warehouse")
    return state


def stamp(state: Path) -> dict[str, object]:
    return json.loads((state / STATE_FILE).read_text())


def assert_one_line_naming_a_new_state_folder(error: DataError, state: Path) -> None:
    message = str(error)
    assert "\n" not in message and str(state) in message
    assert "--set state_dir=NEW_FOLDER" in message and f"nothing in {state} was changed" in message


def test_the_current_versions_are_the_latest_of_each_list():
    assert current_versions() == CURRENT


def test_a_state_folder_made_by_9079251_is_refused_before_anything_is_written(tmp_path):
    state = old_state_folder(tmp_path)
    before = tree(state)
    with pytest.raises(DataError) as caught:
        check_state(config_for(state))
    assert_one_line_naming_a_new_state_folder(caught.value, state)
    assert "holds run 'e2e'" in str(caught.value) and "training schedule 1 (one batch a round" in str(caught.value)
    assert f"training schedule {LATEST_SCHEDULE}" in str(caught.value)
    assert tree(state) == before and not (state / STATE_FILE).exists()


def test_every_run_id_is_refused_in_that_folder_since_the_folder_holds_the_old_run(tmp_path):
    state = old_state_folder(tmp_path)
    with pytest.raises(DataError, match="holds run 'e2e'"):
        check_state(config_for(state, run_id="another"))
    assert not (state / STATE_FILE).exists()


def test_a_finished_round_of_that_folder_is_refused_too_not_reported_finished(tmp_path):
    state = old_state_folder(tmp_path)
    with pytest.raises(DataError, match="training schedule 1"):
        finished_round_notice(config_for(state), 0)


def test_following_the_refusal_a_new_state_folder_is_accepted_and_stamped(tmp_path):
    state = old_state_folder(tmp_path)
    with pytest.raises(DataError):
        check_state(config_for(state))
    new = tmp_path / "NEW_FOLDER"
    check_state(config_for(new))  # the fix the message names; tests/flows/test_finished_round.py runs a round there
    assert {k: v for k, v in stamp(new).items() if k != "stamped_at"} == CURRENT
    check_state(config_for(new))  # and it stays accepted


def test_with_a_warehouse_uri_the_refusal_names_a_new_warehouse_too_and_that_works(tmp_path):
    old = old_state_folder(tmp_path)
    uri = (old / "warehouse").as_uri()
    with pytest.raises(DataError) as caught:
        check_state(config_for(tmp_path / "state", warehouse={"uri": uri}))
    message = str(caught.value)
    assert "\n" not in message
    assert "--set state_dir=NEW_FOLDER --set warehouse.uri=NEW_URI" in message
    with pytest.raises(DataError):  # why the warehouse is named: a new state folder alone finds the old run again
        check_state(config_for(tmp_path / "NEW_FOLDER", warehouse={"uri": uri}))
    new_uri = (tmp_path / "NEW_URI").as_uri()
    check_state(config_for(tmp_path / "NEW_FOLDER", warehouse={"uri": new_uri}))
    assert stamp(tmp_path / "NEW_FOLDER")["schedule"] == LATEST_SCHEDULE


def _unstamped_folder_of_this_code(tmp_path: Path) -> Path:
    """A finished round 0 recorded as the code before the stamp recorded it: a run record without versions."""
    state = tmp_path / "state"
    config = config_for(state)
    with Warehouse(config.warehouse_path) as wh:
        record = {"run_id": "e2e", "created_at": record_time(), "config": config.model_dump(mode="json")}
        wh.catalog.put(wh.catalog.run_path("e2e"), record)
        wh.start_round("e2e", 0, "flow-run", {"rollout.group_size": 6, "training.batches_per_round": 3})
        wh.finish_round("e2e", 0, RoundSummary("e2e", 0, 12, 144, 0.3, {}, 1, 0, 0.2))
    return state


def test_an_unstamped_folder_made_by_this_code_continues_and_is_stamped(tmp_path):
    state = _unstamped_folder_of_this_code(tmp_path)
    config = config_for(state)
    check_state(config)
    assert {k: v for k, v in stamp(state).items() if k != "stamped_at"} == CURRENT
    check_state(config)


@pytest.mark.parametrize(
    ("found", "says"), [(1, "(one batch a round"), (LATEST_SCHEDULE + 1, "(newer than this code knows)")]
)
def test_a_stamp_of_another_schedule_is_refused_and_left_as_it_is(tmp_path, found, says):
    state = _unstamped_folder_of_this_code(tmp_path)
    (state / STATE_FILE).write_text(json.dumps({**CURRENT, "schedule": found}))
    before = tree(state)
    with pytest.raises(DataError) as caught:
        check_state(config_for(state))
    assert_one_line_naming_a_new_state_folder(caught.value, state)
    assert f"was stamped with training schedule {found} {says}" in str(caught.value)
    assert tree(state) == before


def test_a_run_that_joined_a_stamped_folder_with_another_schedule_is_refused(tmp_path):
    state = _unstamped_folder_of_this_code(tmp_path)
    config = config_for(state)
    check_state(config)
    with Warehouse(config.warehouse_path) as wh:
        record = wh.catalog.get(wh.catalog.run_path("e2e")) or {}
        wh.catalog.put(wh.catalog.run_path("e2e"), {**record, "versions": {"records": LATEST_RECORDS, "schedule": 1}})
    with pytest.raises(DataError) as caught:
        check_state(config)
    assert_one_line_naming_a_new_state_folder(caught.value, state)


def test_a_run_record_is_stamped_with_the_versions_it_is_made_with(tmp_path):
    with Warehouse(tmp_path / "warehouse") as wh:
        wh.ensure_run("r", {"seed": 3})
        wh.ensure_run("r", {"seed": 3})  # a second call keeps the stamp
        versions = (wh.catalog.get(wh.catalog.run_path("r")) or {})["versions"]
    assert versions == {"records": LATEST_RECORDS, "schedule": LATEST_SCHEDULE}


@pytest.mark.parametrize("content", [b"", b"{", b'{"layout": 3}', b"[1, 2]"])
def test_a_damaged_stamp_names_itself_and_moving_it_aside_stamps_the_folder_again(tmp_path, content):
    state = _unstamped_folder_of_this_code(tmp_path)
    path = state / STATE_FILE
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        check_state(config_for(state))
    message = str(caught.value)
    assert "\n" not in message and f"mv {path} {path}.damaged" in message
    assert path.read_bytes() == content
    path.rename(f"{path}.damaged")  # the fix the message names
    check_state(config_for(state))
    assert stamp(state)["schedule"] == LATEST_SCHEDULE


def test_a_finished_round_is_told_by_its_record_and_a_running_one_is_not(tmp_path):
    state = _unstamped_folder_of_this_code(tmp_path)
    config = config_for(state)
    notice = finished_round_notice(config, 0)
    assert notice is not None and notice.startswith("round 0 of run 'e2e' finished at ") and "\n" not in notice
    with Warehouse(config.warehouse_path) as wh:
        wh.start_round("e2e", 1, "flow-run", {"rollout.group_size": 6, "training.batches_per_round": 3})
    assert finished_round_notice(config, 1) is None
    assert finished_round_notice(config, 2) is None
    assert finished_round_notice(config_for(tmp_path / "new"), 0) is None
