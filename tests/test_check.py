"""The pre-flight check (runner/preflight.py): ``runner check JOB``, and the probes ``runner submit`` and ``run_job``
make before any paid request (runner/service.py), against the simulated server through the official SDKs.

Each bundled provider's probe (openai, sim, anthropic, gemini: the model lookup; openai-compatible: the models
list) says an unreachable endpoint, a refused key and an unknown model in one sentence naming ``provider:model``;
a probe records nothing and is not a model request."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import preflight, service
from runner.engine.run import execute
from runner.errors import AuthError, ModelSetupError, TransientError
from runner.preflight import PreflightFailed, Probe, probe_models
from runner.providers.base import ProviderSettings, provider_class
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimServer
from tests.helpers import ROOT, free_port, fresh, run_cli, sim_stats, write_job, write_rows

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "RUNNER_SIM_KEY")
RIGHT = "the-right-key"


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in KEYS:
        monkeypatch.setenv(variable, RIGHT)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv(preflight.TIMEOUT_VARIABLE, raising=False)


@pytest.fixture
def keyed_server() -> Iterator[str]:
    """A simulated server in its own process (the CLI runs its own event loop here) that takes only RIGHT and knows
    only the models ``sim-model``, ``claude-haiku-4-5`` and ``gemini-2.0-flash``; yields its root URL."""
    proc = subprocess.Popen([sys.executable, "-m", "simserver", "--port", "0", "--api-key", RIGHT,
                             "--models", "sim-model,claude-haiku-4-5,gemini-2.0-flash"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield line.rsplit(" ", 1)[-1].strip().removesuffix("/v1")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def job_file(tmp_path: Path, root: str, models: list[str], *, rows: int = 3, name: str = "job") -> Path:
    """A job whose providers all point at the simulated server at ``root``, and whose endpoint ``down`` at a port
    nothing listens on."""
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    extra = "\n".join([
        "providers:",
        f"  openai: {{base_url: '{root}/v1'}}",
        f"  sim: {{base_url: '{root}/v1'}}",
        f"  anthropic: {{base_url: '{root}'}}",
        f"  gemini: {{base_url: '{root}'}}",
        "endpoints:",
        f"  down: {{base_url: 'http://127.0.0.1:{free_port()}/v1'}}",
    ])
    return write_job(tmp_path / f"{name}.yaml", dataset, models=models, extra=extra, name=name)


# -- runner check --------------------------------------------------------------------------------------------------

def test_check_says_a_stopped_endpoint_a_refused_key_and_an_unknown_model_in_three_sentences_within_seconds(
        tmp_path, monkeypatch, capsys, keyed_server):
    monkeypatch.setenv("OPENAI_API_KEY", "a-wrong-key")
    job = job_file(tmp_path, keyed_server, ["openai-compatible:down/m", "openai:gpt-4o-mini", "sim:no-such-model",
                                            "gemini:gemini-2.0-flash"])
    started = time.monotonic()
    code, out, err = run_cli(monkeypatch, capsys, "check", str(job))
    elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert len(lines) == 4, out
    by_model = {line.split()[1].rstrip(":"): line for line in lines}
    down = by_model["openai-compatible:down/m"]
    assert down.startswith("failed  openai-compatible:down/m: endpoint down (http://127.0.0.1:")
    assert "connection failed" in down and down.endswith("is the server running?")
    assert by_model["openai:gpt-4o-mini"] == (
        f"failed  openai:gpt-4o-mini: openai at {keyed_server}/v1: the key was refused (401); check the variable "
        "OPENAI_API_KEY")
    assert by_model["sim:no-such-model"] == (
        f"failed  sim:no-such-model is not a model sim at {keyed_server}/v1 knows (404 invalid_request_error "
        "model_not_found: The model `no-such-model` does not exist or you do not have access to it.): check the "
        "model id")
    assert by_model["gemini:gemini-2.0-flash"] == "ok      gemini:gemini-2.0-flash"
    assert "a-wrong-key" not in out and RIGHT not in out  # keys are never echoed
    assert sim_stats(keyed_server)["received"] == 0  # lookups are not model requests
    assert not (tmp_path / "cache.sqlite").exists()  # the check opens no store


def test_check_of_a_good_job_prints_ok_lines_and_exits_0(tmp_path, monkeypatch, capsys, keyed_server):
    job = job_file(tmp_path, keyed_server, ["sim:sim-model", "anthropic:claude-haiku-4-5", "gemini:gemini-2.0-flash"])
    code, out, err = run_cli(monkeypatch, capsys, "check", str(job))
    assert (code, err) == (0, "")
    assert out.splitlines() == ["ok      anthropic:claude-haiku-4-5", "ok      gemini:gemini-2.0-flash",
                                "ok      sim:sim-model"]


def test_check_names_a_missing_key_as_the_run_would(tmp_path, monkeypatch, capsys, keyed_server):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    job = job_file(tmp_path, keyed_server, ["anthropic:claude-haiku-4-5", "sim:sim-model"])
    code, out, _ = run_cli(monkeypatch, capsys, "check", str(job))
    assert code == 1
    assert out.splitlines() == [
        "failed  anthropic:claude-haiku-4-5 needs an API key: export ANTHROPIC_API_KEY (no request was sent)",
        "ok      sim:sim-model"]


@pytest.mark.parametrize("value, said", [("0", "must be more than 0 seconds"), ("soon", "must be a number")])
def test_a_bad_timeout_is_one_sentence(tmp_path, monkeypatch, capsys, value, said):
    monkeypatch.setenv(preflight.TIMEOUT_VARIABLE, value)
    job = job_file(tmp_path, "http://127.0.0.1:9", ["sim:m"])
    code, _, err = run_cli(monkeypatch, capsys, "check", str(job))
    assert code == 1 and err.startswith("Error: ") and said in err and err.count("\n") == 1


# -- submit and run_job --------------------------------------------------------------------------------------------

def test_submit_stops_before_any_request_when_a_probe_fails_and_no_check_goes_on(tmp_path, monkeypatch, capsys,
                                                                                 keyed_server):
    job = job_file(tmp_path, keyed_server, ["sim:sim-model", "sim:unlisted", "gemini:gemini-nope"], rows=4)
    db = str(tmp_path / "s.sqlite")
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(job), "--db", db)
    assert code == 1
    said = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert said == [
        f"gemini:gemini-nope is not a model gemini at {keyed_server} knows (404 NOT_FOUND: models/gemini-nope is not "
        "found for API version v1beta.): check the model id",
        f"sim:unlisted is not a model sim at {keyed_server}/v1 knows (404 invalid_request_error model_not_found: The "
        "model `unlisted` does not exist or you do not have access to it.): check the model id",
        "Error: 2 of 3 model(s) failed the pre-flight check, so no request was sent (--no-check skips the check)"]
    assert "started" not in out
    assert sim_stats(keyed_server)["received"] == 0
    assert open_store(db).list_runs() == []  # no run row, no memo, no ledger

    code, out, err = run_cli(monkeypatch, capsys, "submit", str(job), "--db", db, "--no-check")
    assert code == 0, err
    assert sim_stats(keyed_server)["received"] == 3 * 4  # the model routes answer whatever the model
    assert [run["status"] for run in open_store(db).list_runs()] == ["completed"]


def test_a_job_the_memo_answers_wholly_needs_no_endpoint(tmp_path, monkeypatch, capsys):
    proc = subprocess.Popen([sys.executable, "-m", "simserver", "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        root = proc.stdout.readline().rsplit(" ", 1)[-1].strip().removesuffix("/v1")
        job = job_file(tmp_path, root, ["sim:sim-model"])
        assert run_cli(monkeypatch, capsys, "submit", str(job))[0] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # the server is gone: the same job again is all cache hits, so nothing is probed and the run completes
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job), "--replan")
    assert code == 0, err
    # one item more is a request to send: the probe stops it
    write_rows(tmp_path / "job.jsonl", 4)
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job))
    assert code == 1 and err.splitlines()[-1].startswith("Error: sim:sim-model: sim at ")


def test_one_failure_is_one_error_line(tmp_path, monkeypatch, capsys):
    job = job_file(tmp_path, "http://127.0.0.1:9", ["sim:m"])
    monkeypatch.setattr(preflight, "DEFAULT_TIMEOUT", 1.0)
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job))
    assert code == 1
    line = err.splitlines()[-1]
    assert line.startswith("Error: sim:m: sim at http://127.0.0.1:9/v1: connection failed (")
    assert line.endswith("is the server running?; no request was sent (--no-check skips the check)")


async def test_the_run_service_probes_a_new_run_only_and_says_the_apis_setting(tmp_path):
    job = load_job(job_file(tmp_path, "http://127.0.0.1:9", ["sim:m"]))
    store = open_store(tmp_path / "s.sqlite")
    with pytest.raises(PreflightFailed, match=r"check=False skips the check\)$") as info:
        await service.run(job, store, wording=service.API)
    assert isinstance(info.value, ModelSetupError) and len(info.value.problems) == 1
    assert store.list_runs() == []
    # without the check the run starts and each item fails on its own: the per-item path is unchanged
    outcome = await service.run(job, store, check=False)
    assert [run["id"] for run in store.list_runs()] == [outcome.run_id]
    assert {task["error_class"] for task in store.tasks(outcome.run_id)} == {"connection"}


async def test_the_checks_that_need_no_request_come_first(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNNER_SIM_KEY")
    monkeypatch.setattr("runner.providers.openai_servers.SimProvider.api_key", lambda self: "")
    job = load_job(job_file(tmp_path, "http://127.0.0.1:9", ["sim:m"]))
    with pytest.raises(ModelSetupError, match="needs an API key: export RUNNER_SIM_KEY") as info:
        await service.run(job, open_store(tmp_path / "s.sqlite"))
    assert not isinstance(info.value, PreflightFailed)


# -- each provider's probe -----------------------------------------------------------------------------------------

PROBED = {"openai": "gpt-4o-mini", "sim": "sim-model", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.0-flash"}


async def probe_one(folder: Path, provider: str, model: str, root: str, timeout: float = 3.0) -> Probe:
    """The probe of ``provider:model`` with the provider's base URL at the server whose root URL is ``root``."""
    url = f"{root}/v1" if provider in ("openai", "sim") else root
    dataset = write_rows(folder / "probe.jsonl", 1)
    job = load_job(write_job(folder / "probe.yaml", dataset, models=[f"{provider}:{model}"],
                             extra=f"providers: {{{provider}: {{base_url: '{url}'}}}}"))
    [result] = await probe_models(job, timeout=timeout)
    return result


@pytest.fixture
async def server() -> Iterator[SimServer]:
    from simserver import start_server

    async with await start_server() as srv:
        yield srv


@pytest.mark.parametrize("provider", list(PROBED))
async def test_each_probe_says_unknown_model_refused_key_and_unreachable(provider, server, tmp_path):
    fresh(server, models=PROBED[provider], api_key=RIGHT)
    assert (await probe_one(tmp_path, provider, PROBED[provider], server.root_url)).ok
    unknown = await probe_one(tmp_path, provider, "not-a-model", server.root_url)
    assert unknown.problem.startswith(f"{provider}:not-a-model is not a model {provider} at ")
    assert unknown.problem.endswith("check the model id")
    fresh(server, api_key="another-key")
    refused = (await probe_one(tmp_path, provider, PROBED[provider], server.root_url)).problem
    assert refused.startswith(f"{provider}:{PROBED[provider]}: ") and "the key was refused" in refused
    assert "check the variable" in refused and RIGHT not in refused
    gone = (await probe_one(tmp_path, provider, PROBED[provider], f"http://127.0.0.1:{free_port()}")).problem
    assert gone.startswith(f"{provider}:{PROBED[provider]}: ") and "connection failed" in gone
    assert gone.endswith("is the server running?")
    assert server.stats()["received"] == 0


@pytest.mark.parametrize("provider", ["sim", "gemini"])
async def test_an_endpoint_that_never_answers_is_said_within_the_timeout(provider, tmp_path):
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        started = time.monotonic()
        result = await probe_one(tmp_path, provider, "m", f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
        elapsed = time.monotonic() - started
    assert elapsed < 3, elapsed
    assert result.problem.startswith(f"{provider}:m: ") and result.problem.endswith("is the server running?")
    assert "timed out after 0.5 s" in result.problem or "no answer within 0.5 s" in result.problem


async def test_openai_compatible_endpoints_are_probed_by_their_models_list(server, tmp_path):
    fresh(server, models="served-a,served-b,llama3:latest")
    endpoints = {"mine": ProviderSettings(base_url=server.url)}
    provider = provider_class("openai-compatible")(ProviderSettings(), endpoints)
    await provider.start()
    try:
        for model in ("mine/served-a", "mine/llama3", "mine/llama3:latest"):
            await provider.probe(model)
        with pytest.raises(ModelSetupError) as info:
            await provider.probe("mine/other")
        assert str(info.value) == (f"openai-compatible:mine/other: endpoint mine ({server.url}) does not serve "
                                   "other (it lists served-a, served-b, llama3:latest): name one of those")
        fresh(server, models="the-only-one")  # a llama.cpp server answers any name with its one model
        await provider.probe("mine/whatever")
        fresh(server, api_key="another-key")
        with pytest.raises(AuthError):
            await provider.probe("mine/served-a")
    finally:
        await provider.aclose()
    gone = provider_class("openai-compatible")(ProviderSettings(), {
        "gone": ProviderSettings(base_url=f"http://127.0.0.1:{free_port()}/v1")})
    await gone.start()
    try:
        with pytest.raises(TransientError, match="connection failed"):
            await gone.probe("gone/m")
    finally:
        await gone.aclose()
    assert server.stats()["received"] == 0


async def test_a_probe_touches_no_budget_memo_or_store(tmp_path, server):
    fresh(server)
    path = job_file(tmp_path, server.root_url, ["sim:sim-model"], rows=3)
    path.write_text(path.read_text() + "prices: {sim:sim-model: {input: 1000, output: 1000}}\nbudget: {usd: 1}\n")
    job = load_job(path)
    store = open_store(tmp_path / "s.sqlite")
    assert [probe.ok for probe in await probe_models(job)] == [True]
    assert store.list_runs() == [] and list(store.responses()) == []
    outcome = await execute(job, store)  # the run after it sends every request: nothing was served from a probe
    assert outcome.status == "completed" and server.stats()["received"] == 3


def test_run_job_probes_first_and_check_false_goes_on(tmp_path, keyed_server):
    from runner.api import run_job
    from runner.errors import RunnerError

    job = job_file(tmp_path, keyed_server, ["sim:sim-model", "sim:unlisted"], rows=2)
    db = tmp_path / "api.sqlite"
    with pytest.raises(RunnerError, match=r"sim:unlisted is not a model .*\(check=False skips the check\)"):
        run_job(str(job), db=db)
    assert sim_stats(keyed_server)["received"] == 0
    run = run_job(str(job), db=db, check=False)
    assert run.status == "completed" and sim_stats(keyed_server)["received"] == 2 * 2


def test_runner_sim_models_makes_the_others_unknown(tmp_path, monkeypatch, capsys):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "sim", "--port", str(port), "--models", "sim-model"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "listening on" in proc.stdout.readline()
        job = job_file(tmp_path, f"http://127.0.0.1:{port}", ["sim:sim-model", "sim:other"])
        code, out, _ = run_cli(monkeypatch, capsys, "check", str(job))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert code == 1 and "sim:other is not a model" in out and "ok" in out
