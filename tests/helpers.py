"""What the tests share besides fixtures (those are in conftest.py): paths, datasets and job files written for a
test, the ``runner`` command in this process or its own, the simulated server's counters and reset, and the one
check every error path uses (:func:`one_error`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from devservers import launchers
from simserver import SimConfig, SimServer
from simserver.clock import ScaledClock

#: the project's root (the folder with pyproject.toml)
ROOT = Path(__file__).resolve().parent.parent

#: the frame characters of click's boxed usage errors: a user never sees them
BOX = ("\u256d", "\u2502", "\u2570")


def one_error(err: str, *, only: bool = False) -> str:
    """The one ``Error:`` line of stderr, its last line (its only line with ``only``): no traceback, no bug report
    ("Error: unexpected ..."; the bare word may be a driver's own reason), no click box."""
    assert "Traceback" not in err and "Error: unexpected " not in err, err
    assert not any(ch in err for ch in BOX), err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert not only or len(lines) == 1, err
    return errors[0]


def only_error(err: str) -> str:
    """:func:`one_error` where stderr holds nothing else (the job was refused before the run began)."""
    return one_error(err, only=True)


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


def sim_stats(url: str) -> dict:
    """The simulated server's counters (``/sim/stats``): what it received and completed."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/stats", timeout=5) as response:
        return json.load(response)


def sim_configure(url: str, **config: object) -> None:
    """Change some of the simulated server's settings (``/sim/config``) while it serves, e.g. its latency."""
    request = urllib.request.Request(url.removesuffix("/v1") + "/sim/config", data=json.dumps(config).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        response.read()


def runner_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "runner.cli", *args]


def start_runner(args: list[str], cwd: Path) -> subprocess.Popen:
    """A `runner ARGS` process in ``cwd``, its output piped (text)."""
    return subprocess.Popen(runner_cmd(*args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def printed_run_id(proc: subprocess.Popen) -> str:
    """The run id a `runner submit` started with ``start_runner`` prints when its run starts."""
    for line in proc.stdout:
        if line.startswith("run ") and "started job" in line:
            return line.split()[1].rstrip(":")
    raise AssertionError(f"no run id printed: {proc.stderr.read()}")


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``runner ARGS`` in this process: (exit code, stdout, stderr)."""
    from runner.cli import main

    monkeypatch.setattr(sys, "argv", ["runner", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def fresh(server: SimServer, **config: Any) -> SimServer:
    """A shared simulated server as new: the default config (with ``config`` over it), the real clock, no
    batches or files, counters zeroed."""
    server.configure(**{**dataclasses.asdict(SimConfig()), **config})
    server.clock = ScaledClock(server.config.time_scale)
    server.reset()
    return server


#: how long llama_cpp.server may take to load the model and answer GET /v1/models
LLAMA_START_TIMEOUT = 60.0

#: starts llama_cpp.server under the local provider's patch (see tests/providers/test_llama_server.py)
LLAMA_LAUNCHER = (
    "import runpy\n"
    "from runner.providers.local_llama import without_extra_buffers\n"
    "with without_extra_buffers():\n"
    "    runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n"
)


@dataclass
class LlamaServer:
    """llama-cpp-python's own OpenAI-compatible server, started by the ``llama_server`` fixture."""

    url: str
    log: Path

    def chat_requests(self) -> int:
        """Chat completions the server answered, counted from its own (uvicorn) access log."""
        return len(re.findall(r'"POST /v1/chat/completions HTTP/1\.1" 200', self.log.read_text(errors="replace")))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def make_openai(srv: SimServer, key: str = "test-key", **kwargs: Any) -> openai.AsyncOpenAI:
    """The official openai SDK's client for the simulated server: no retries of its own, aiohttp underneath."""
    return openai.AsyncOpenAI(base_url=srv.url, api_key=key, max_retries=0,
                              http_client=openai.DefaultAioHttpClient(), **kwargs)


def make_claude(srv: SimServer, key: str = "test-key", **kwargs: Any) -> anthropic.AsyncAnthropic:
    """The official anthropic SDK's client for the simulated server: no retries of its own, aiohttp underneath."""
    return anthropic.AsyncAnthropic(base_url=srv.root_url, api_key=key, max_retries=0,
                                    http_client=anthropic.DefaultAioHttpClient(), **kwargs)


def make_gemini(srv: SimServer, key: str = "test-key", version: str = "v1beta", **options: Any) -> genai.Client:
    """The official google-genai client for the simulated server, one attempt per call."""
    return genai.Client(api_key=key, http_options=genai_types.HttpOptions(
        base_url=srv.root_url, api_version=version, retry_options=genai_types.HttpRetryOptions(attempts=1),
        **options))


#: the AWS variables that would point a test at the machine's own AWS set-up (profiles, endpoints, a region default)
AWS_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_CREDENTIAL_EXPIRATION", "AWS_ACCOUNT_ID", "AWS_BEARER_TOKEN_BEDROCK",
                 "AWS_DEFAULT_REGION", "ANTHROPIC_BEDROCK_BASE_URL", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                 "AWS_ENDPOINT_URL_BEDROCK", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME")


def isolated_aws(monkeypatch: pytest.MonkeyPatch, folder: Path, access_key: str, secret: str = "simulated-secret",
                 *, region: str | None = "us-east-1") -> None:
    """AWS credentials (and a region) from the environment only: no shared files, no instance metadata (no
    network), none of the machine's profiles or endpoints."""
    for variable in AWS_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    if region is not None:
        monkeypatch.setenv("AWS_REGION", region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(folder / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-aws-credentials"))


def killed_after_submit(*clients: str) -> str:
    """A script for ``python -c``: ``runner ARGS`` whose Batch API clients (``module.Class`` under
    ``runner.providers``) die right after the provider accepted a batch, before the store records its id (or before
    it is sent, with ``KILL_BEFORE_SUBMIT`` set); devservers/launchers.py."""
    return launchers.launcher(launchers.killed_after_submit(*clients))


def done_tasks(db: str | Path) -> int:
    """How many tasks of every run the store at ``db`` holds as done."""
    from runner.store import open_store

    store = open_store(db)
    try:
        return len(store.tasks(status="done"))
    finally:
        store.close()


def pg_server_processes(pg_server: Any) -> list[int]:
    """The throwaway PostgreSQL server's processes: the postmaster and its children (the backends)."""
    postmaster = int((Path(pg_server.data) / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry))
    return [postmaster, *children]


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@contextlib.asynccontextmanager
async def scripted_server() -> AsyncIterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """An aiohttp server on 127.0.0.1 answering every request, on any path, with ``answer["status"]``,
    ``["body"]`` (bytes), ``["headers"]`` and ``["content_type"]`` (JSON unless said), as the test sets them; each
    request it got (method, path, headers, body) goes into the list. Yields its root URL, ``answer`` and the list."""
    from aiohttp import web

    answer: dict[str, Any] = {}
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.raw_path, "headers": dict(request.headers),
                     "body": await request.read()})
        return web.Response(status=answer["status"], body=answer["body"], headers=answer.get("headers", {}),
                            content_type=answer.get("content_type", "application/json"))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", answer, seen
    finally:
        await runner.cleanup()


def headers_of(request: dict[str, Any]) -> dict[str, str]:
    """A request :func:`scripted_server` got: its headers, their names in lower case."""
    return {name.lower(): value for name, value in request["headers"].items()}


async def provider_outcome(provider: Any, model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> Any:
    """What ``provider`` (started here, closed after) makes of one request: its completion, or the runner's error
    it raised (a ``ProviderError`` or a ``ModelSetupError``), so that a lean path and an SDK path compare alike."""
    from runner.errors import ModelSetupError, ProviderError

    await provider.start()
    try:
        return await provider.execute(model, messages, params)
    except (ProviderError, ModelSetupError) as exc:
        return exc
    finally:
        await provider.aclose()


def submit_lines(job: Path, db: Path) -> str:
    """Python lines that run ``runner submit JOB --db DB`` in the process that runs them (``sys`` imported before),
    leaving its exit code in ``exit_code``."""
    return ("from runner.cli import main\n"
            f"sys.argv = ['runner', 'submit', {str(job)!r}, '--db', {str(db)!r}]\n"
            "exit_code = 0\n"
            "try:\n"
            "    main()\n"
            "except SystemExit as exc:\n"
            "    exit_code = exc.code or 0\n")
