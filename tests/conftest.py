from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from runner.providers import base
from simserver import SimConfig, SimServer, start_server

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """A bug in the CLI run in this process raises with its traceback instead of printing one line."""
    import runner.cli

    runner.cli.RAISE_UNEXPECTED = True


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own store and results folder; no test reads a user's cache.sqlite."""
    monkeypatch.setenv("RUNNER_DB", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("RUNNER_PROGRESS_INTERVAL", "0.5")
    monkeypatch.delenv("RUNNER_SIM_URL", raising=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One throwaway PostgreSQL server for the whole session (tests/pg.py); skips when its binaries are missing."""
    from tests import pg

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


def write_rows(path: Path, count: int, *, start: int = 0) -> Path:
    """A multiple-choice JSONL dataset with ``count`` distinct rows."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(start, start + count):
            row = {"question": f"Question number {i}: which is right?",
                   "choices": [f"first {i}", f"second {i}", f"third {i}", f"fourth {i}"], "gold": i % 4}
            out.write(json.dumps(row) + "\n")
    return path


def write_job(path: Path, dataset: Path, *, models: list[str], extra: str = "", stage_extra: str = "",
              seeds: str = "[0]", name: str = "testjob") -> Path:
    lines = [
        f"name: {name}",
        f"models: {json.dumps(models)}",
        "params: {temperature: 0, max_tokens: 5}",
        f"output_dir: {json.dumps(str(path.parent / 'results'))}",
        "retry: {max_attempts: 10, backoff_initial: 0.01, backoff_max: 0.05, max_elapsed: 60}",
        extra,
        "stages:",
        "  - name: mc",
        f"    dataset: {{path: {json.dumps(str(dataset))}}}",
        "    prompt:",
        "      system: Answer with one letter.",
        "      user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"",
        f"    choices: {{seeds: {seeds}, gold: gold}}",
        "    parse: letter",
        stage_extra,
    ]
    path.write_text("\n".join(line for line in lines if line) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def sim_server(request) -> Iterator[str]:
    """The simulated server in its own process (latency from ``indirect`` parametrization, default 20 ms);
    yields its base URL."""
    latency = getattr(request, "param", 0.02)
    proc = subprocess.Popen(
        [sys.executable, "-m", "simserver", "--port", "0", "--latency", str(latency)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield line.rsplit(" ", 1)[-1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def sim_stats(url: str) -> dict:
    """The simulated server's counters (``/sim/stats``): what it received and completed."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/stats", timeout=5) as response:
        return json.load(response)


def runner_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "runner.cli", *args]


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``runner ARGS`` in this process: (exit code, stdout, stderr)."""
    from runner.cli import main

    monkeypatch.setattr(sys, "argv", ["runner", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_srv() -> AsyncIterator[SimServer]:
    """One in-process simulated server for a whole test module (its tests run in the module's event loop:
    ``pytestmark = pytest.mark.asyncio(loop_scope="module")``); each test's ``srv`` resets it with :func:`fresh`."""
    async with await start_server() as server:
        yield server


@pytest.fixture
def srv(shared_srv: SimServer) -> SimServer:
    """The module's server with the default config, the real clock, no batches and zeroed counters (a module that
    needs more, a script or a key, defines its own)."""
    return fresh(shared_srv)


def fresh(server: SimServer, **config: Any) -> SimServer:
    """A shared simulated server as new: the default config (with ``config`` over it), the real clock, no
    batches or files, counters zeroed."""
    server.configure(**{**dataclasses.asdict(SimConfig()), **config})
    server.clock = time.monotonic
    server.reset()
    return server


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
