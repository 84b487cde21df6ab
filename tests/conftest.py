from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import pytest_asyncio
from google import genai

from runner.providers import base
from scripts import slow_by_time
from simserver import SimConfig, SimServer, start_server
from tests import prefork
from tests.helpers import (
    LLAMA_LAUNCHER,
    LLAMA_START_TIMEOUT,
    ROOT,
    LlamaServer,
    free_port,
    fresh,
    make_claude,
    make_gemini,
    make_openai,
    tail,
)


def _compiled_once() -> None:
    """Compiled bytecode kept for the test processes and the processes they start, in one folder outside the tree.

    Where PYTHONDONTWRITEBYTECODE is set (this project's machines and CI set it), every ``runner`` process a test
    starts compiled the project from source (0.2 s of CPU each, hundreds of processes a run) and pytest rewrote every
    test module's asserts again in every worker. Set here, before the workers start, so they and their children
    inherit it."""
    if not sys.dont_write_bytecode and not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or str(Path(tempfile.gettempdir()) /
                                                          f"llm-job-runner-pycache-{os.getuid()}")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix


_compiled_once()
prefork.install()
# One llama.cpp thread per embedded model in the suite: its test processes keep both cores busy, and two threads
# spend about a third more CPU for the same answers (bench/RESULTS.md). Inherited by the workers and what they start.
os.environ.setdefault("RUNNER_LOCAL_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    """A bug in the CLI run in this process raises with its traceback instead of printing one line. The embedded
    model's threads sleep while they wait, as the provider sets before it loads llama_cpp: set here too, because a
    test may import llama_cpp itself before any provider does."""
    import runner.cli
    from runner.cli.common import import_now
    from runner.providers.local_llama import sleeping_openmp_threads

    import_now()  # the command line's lazily imported modules, loaded before any test's threads

    runner.cli.RAISE_UNEXPECTED = True
    sleeping_openmp_threads()
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "numprocesses", None):
        prefork.start_shared()  # one prefork server for every test process (tests/prefork.py), before they start


#: test processes ``-n auto`` starts at most: each holds 0.6-0.9 GB (the SDKs, the embedded model) and a
#: PostgreSQL connection or more
MAX_TEST_PROCESSES = 8


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many test processes ``-n auto`` (pyproject's addopts) starts: twice the cores and one more for a run with
    the slow tests, which spend much of their time waiting (on 2 cores, the whole suite took 469 and 488 s with five
    against 522 and 548 s with four, alternated on 2026-12-01, and 728 s with four against 790 s with three before);
    one more than the cores for a run without them, which keeps the cores busy, where a further process costs more
    CPU to collect the suite than it saves (271 s with three against 290 s with four). None (pytest-xdist's own
    count) when PYTEST_XDIST_AUTO_NUM_WORKERS says. At most MAX_TEST_PROCESSES on a larger machine."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0))
    without_slow = "not slow" in (config.option.markexpr or "")
    return min(cores + 1 if without_slow else 2 * cores + 1, MAX_TEST_PROCESSES)


#: the slow test modules whose tests mostly wait (a worker stopped past its lease, a store stalled for seconds, a Ray
#: cluster): under half a core each (a run's per-test CPU, bench/RESULTS.md). Started together, four of them left the
#: cores a third idle for the first four minutes; each is started beside a busy slow test instead.
MOSTLY_WAITING = ("tests/engine/test_workers.py", "tests/engine/test_store_stall.py",
                  "tests/engine/test_token_budget_workers.py", "tests/cluster/test_ray_workers.py")
#: the slow test modules with the longest tests (a minute or more of CPU each), started first of the busy ones so that
#: none of them starts last and keeps one test process busy after the others have finished
LONGEST_SLOW = ("tests/test_chaos.py", "tests/recipes/test_winodict_eval.py", "tests/recipes/test_paper_jobs.py")
#: after the slow tests, the test modules whose tests take longest in the fast path (``--durations``: the embedded
#: model, thousands of random requests) run first, for the same reason
LONGEST_FIRST = ("tests/test_quickstart.py", "tests/providers/test_token_bounds.py",
                 "tests/providers/test_loglikelihood_providers.py")


#: the tests the fast path leaves to the whole suite for their time alone (tests/slow_by_time.txt, written by
#: scripts/slow_by_time.py, which runs them with RUNNER_TEST_SLOW_BY_TIME=0 to measure them again)
SLOW_BY_TIME = slow_by_time.listed() if os.environ.get("RUNNER_TEST_SLOW_BY_TIME") != "0" else set()


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test of tests/slow_by_time.txt is marked ``slow`` as it is collected, before ``-m`` selects."""
    if item.nodeid in SLOW_BY_TIME:
        item.add_marker(pytest.mark.slow)


#: the tests of this process that ``--dist loadgroup`` should have grouped and did not (see below)
UNGROUPED: set[str] = set()


def _path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _longest_first(items: list[pytest.Item], longest: tuple[str, ...]) -> list[pytest.Item]:
    """``items`` with those of the ``longest`` modules first, in that order; the rest in their order."""
    return sorted(items, key=lambda item: longest.index(_path(item)) if _path(item) in longest else len(longest))


def _interleaved(busy: list[pytest.Item], waiting: list[pytest.Item]) -> list[pytest.Item]:
    """One of ``busy``, one of ``waiting``, in turn, until both are used up."""
    merged: list[pytest.Item] = []
    for pair in itertools.zip_longest(busy, waiting):
        merged.extend(item for item in pair if item is not None)
    return merged


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which gives a grouped test's id its ``@group``
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, the busy ones (longest first) and the mostly waiting ones in turn, then the fast tests,
    the longest modules' first, everything else in its order (the same in every test process: pytest-xdist hands
    them out in this order, one at a time, to whichever process is free; the tests of an ``xdist_group`` go first).
    In a test process of ``--dist loadgroup``, the tests marked ``xdist_group`` whose ids did not get their group
    are noted, and fail (pytest_runtest_setup)."""
    if getattr(config.option, "loadgroup", False):
        UNGROUPED.update(item.nodeid for item in items
                         if item.get_closest_marker("xdist_group") and "@" not in item.nodeid)
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    busy = _longest_first([item for item in slow if _path(item) not in MOSTLY_WAITING], LONGEST_SLOW)
    waiting = [item for item in slow if _path(item) in MOSTLY_WAITING]
    items[:] = _interleaved(busy, waiting) + _longest_first(fast, LONGEST_FIRST)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test grouping failed for fails before it starts: the tests of a group share a costly thing (a Ray cluster,
    statsmodels' import) that each test process would otherwise pay for (pytest 9.2 with pytest-xdist 3.8 loses
    every group silently: pyproject.toml)."""
    if item.nodeid in UNGROUPED:
        pytest.fail("pytest-xdist's --dist loadgroup did not put this test in its xdist_group: install the pytest "
                    "and pytest-xdist versions constraints/ci.txt names", pytrace=False)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own store, results folder, memo of prices and memo of checked keys (each starts without
    one); no test reads a user's cache.sqlite or ~/.cache."""
    monkeypatch.setenv("RUNNER_DB", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(tmp_path / "genai-prices-rates.json"))
    monkeypatch.setenv("RUNNER_KEY_MEMO", str(tmp_path / "validated-keys.json"))
    monkeypatch.setenv("RUNNER_PROGRESS_INTERVAL", "0.5")
    monkeypatch.delenv("RUNNER_SIM_URL", raising=False)


def _children_of(pid: int) -> list[int]:
    """Process ``pid``'s children, from each of its threads' ``/proc/PID/task/TID/children`` (a few hundred
    microseconds, where reading every process's stat took 7-13 ms after each of the suite's tests)."""
    children: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for thread in threads:
        with contextlib.suppress(OSError):
            children.extend(int(child) for child in Path(f"/proc/{pid}/task/{thread}/children").read_text().split())
    return children


def _runner_processes_of(pid: int) -> list[int]:
    """The `runner` processes (``-m runner.cli``) descended from process ``pid``, read from /proc."""
    found, frontier = [], [pid]
    while frontier:
        for child in _children_of(frontier.pop()):
            frontier.append(child)
            try:
                if b"runner.cli" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
            except OSError:
                continue
    return found + (prefork.runner_forks() if pid == os.getpid() else [])


@pytest.fixture(autouse=True)
def _no_runner_left_behind() -> Iterator[None]:
    """A test's `runner` processes end with it: one a failed test left running (stopped, or still sending) would
    send its requests to the simulated server the next test of this process is given (tests/conftest.py reuses
    it), and fail that test too."""
    yield
    for pid in _runner_processes_of(os.getpid()):
        for signal_ in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal_)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One throwaway PostgreSQL server for the whole session (devservers/postgres.py); skips when its binaries are
    missing."""
    from devservers import postgres as pg

    server = pg.start_server()
    if server is None:
        pytest.skip("no PostgreSQL server binary: install Debian's postgresql")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """The URL of a fresh, empty PostgreSQL store (its own schema) for one test."""
    return pg_server.new_schema()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store every process of a test shares (several workers of one run): a SQLite file, made before the
    processes start so that they only open it, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        path = tmp_path / "store.sqlite"
        from runner.store import open_store

        open_store(path).close()
        return str(path)
    return request.getfixturevalue("pg_url")


@pytest.fixture
def fake_provider() -> Iterator[type]:
    """Register tests.fakes.FakeProvider as provider ``fake`` for one test, then unregister it."""
    from tests.fakes import FakeProvider

    FakeProvider.reset()
    base.register(FakeProvider)
    try:
        yield FakeProvider
    finally:
        base.unregister("fake")
        FakeProvider.reset()


class _SimProcesses:
    """The simulated servers in their own processes, one per latency, started once per test process and reset
    for each test (a process costs 0.8 s of CPU to start, and some fifty tests take one)."""

    #: how long a reused server may take to finish the last test's requests (a killed client's, still waiting out
    #: the latency) before it is replaced by a new process instead (a hang of hang_seconds, say)
    DRAIN_S = 3.0

    def __init__(self) -> None:
        self.running: dict[float, tuple[subprocess.Popen[str], str]] = {}

    def fresh(self, latency: float) -> str:
        """The base URL of a server with latency ``latency``, as a new process would be: default config, zero
        counters, no batch, file or request of an earlier test."""
        held = self.running.get(latency)
        if held is not None and not (held[0].poll() is None and self._drained(held[1])):
            self._stop(held[0])
            held = None
        if held is None:
            held = self.running[latency] = self._start(latency)
        root = held[1].removesuffix("/v1")
        # every field, so a test's /sim/config changes end with it (a new seed also restarts the fault dice)
        config = dataclasses.asdict(SimConfig(latency=latency))
        for path, body in (("/sim/config", config), ("/sim/reset", {})):
            request = urllib.request.Request(root + path, data=json.dumps(body).encode(), method="POST",
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                answer.read()
        return held[1]

    @staticmethod
    def _start(latency: float) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "simserver", "--port", "0", "--latency", str(latency)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "listening on" in line, line
        return proc, line.rsplit(" ", 1)[-1].strip()

    def _drained(self, url: str) -> bool:
        deadline = time.monotonic() + self.DRAIN_S
        while True:
            try:
                with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/in_flight", timeout=5) as answer:
                    if json.load(answer)["in_flight"] == 0:
                        return True
            except (OSError, ValueError):
                return False
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    @staticmethod
    def _stop(proc: subprocess.Popen[str]) -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for proc, _ in self.running.values():
            self._stop(proc)
        self.running.clear()


@pytest.fixture(scope="session")
def _sim_processes() -> Iterator[_SimProcesses]:
    processes = _SimProcesses()
    try:
        yield processes
    finally:
        processes.stop_all()


@pytest.fixture
def sim_server(request: pytest.FixtureRequest, _sim_processes: _SimProcesses) -> str:
    """The simulated server in its own process (latency from ``indirect`` parametrization, default 20 ms), as
    fresh as a new one; its base URL."""
    return _sim_processes.fresh(float(getattr(request, "param", 0.02)))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_srv() -> AsyncIterator[SimServer]:
    """One in-process simulated server for a whole test module (its tests run in the module's event loop:
    ``pytestmark = pytest.mark.asyncio(loop_scope="module")``); each test's ``srv`` resets it with :func:`fresh`."""
    async with await start_server() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def oa(shared_srv: SimServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official openai SDK's client for the module's simulated server (one per module: each SDK client loads
    certificate bundles when built, ~50 ms apiece)."""
    sdk = make_openai(shared_srv)
    yield sdk
    await sdk.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def claude(shared_srv: SimServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """The official anthropic SDK's client for the module's simulated server."""
    sdk = make_claude(shared_srv)
    yield sdk
    await sdk.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gemini(shared_srv: SimServer) -> AsyncIterator[genai.Client]:
    """The official google-genai client for the module's simulated server."""
    sdk = make_gemini(shared_srv)
    yield sdk
    await sdk.aio.aclose()


@pytest.fixture
def srv(shared_srv: SimServer) -> SimServer:
    """The module's server with the default config, the real clock, no batches and zeroed counters (a module that
    needs more, a script or a key, defines its own)."""
    return fresh(shared_srv)


@pytest.fixture
def now(srv: SimServer) -> list[float]:
    """The test module's server's clock, stepped by the test: ``now[0] += 5``."""
    clock = [1000.0]
    srv.clock = lambda: clock[0]
    return clock


@pytest.fixture
def provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cloud providers' key variables set to a test key (the simulated server takes any key), and
    GOOGLE_API_KEY unset (google-genai would prefer it to GEMINI_API_KEY)."""
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, "test-key")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-cpp-python's own OpenAI-compatible server serving the embedded SmolLM2 GGUF on 127.0.0.1, one per test
    module (see tests/providers/test_llama_server.py for why it is started through a launcher)."""
    from runner.providers.local_weights import locate_gguf

    folder = tmp_path_factory.mktemp("llama-server")
    port = free_port()
    log = folder / "server.log"
    command = [
        sys.executable, "-c", LLAMA_LAUNCHER,
        "--model", str(locate_gguf()), "--model_alias", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", "2048", "--verbose", "False",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # access-log lines reach the file as they happen
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + LLAMA_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode} while starting:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as answer:
                    if answer.status == 200 and json.load(answer)["data"]:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer GET /v1/models within {LLAMA_START_TIMEOUT:g} s:\n"
                            f"{tail(log)}")
            time.sleep(0.2)
        yield LlamaServer(url, log)
        assert proc.poll() is None, f"llama_cpp.server died during the tests ({proc.returncode}):\n{tail(log)}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
