"""``azure-openai:DEPLOYMENT`` through the openai SDK's AsyncAzureOpenAI against the simulated server's Azure paths
(simserver/azure.py): answers and usage, the key or an Entra ID token, the settings it cannot go without, the memo,
a budget, a report, kill -9 and resume online and in batch mode, the Batch API, the pre-flight probe and its
sentences, the cache identity and the price."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from runner.engine.checks import build_providers
from runner.engine.run import execute
from runner.errors import AuthError, BadRequest, JobFileError, ModelSetupError, RateLimited, TransientError
from runner.providers.azure_openai import AzureOpenAIProvider
from runner.providers.base import ProviderSettings, provider_class
from runner.providers.batching import BatchLine
from runner.providers.openai_chat import OpenAIChatProvider
from runner.providers.pricing import Pricing
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server
from simserver.azure import set_deployments
from tests.helpers import free_port, run_cli, runner_cmd, sim_stats, write_rows

KEY = "azure-test-key"
VERSION = "2024-10-21"
MODEL = "azure-openai:gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "Which is a fruit? A. carrot B. apple"}]


@pytest.fixture(autouse=True)
def _azure_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_AD_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", KEY)
    # the API version as the SDK reads it (a job file's providers.azure-openai.api_version wins over it)
    monkeypatch.setenv("OPENAI_API_VERSION", VERSION)


@pytest.fixture
async def server():
    async with await start_server(SimConfig(api_key=KEY, batch_delay=0.2)) as srv:
        yield srv


def resource(root: str) -> str:
    """The SDK's base URL of the simulated resource (``{endpoint}/openai``)."""
    return root.removesuffix("/v1") + "/openai"


def provider(srv: SimServer, **options: object) -> AzureOpenAIProvider:
    settings = {"base_url": resource(srv.root_url), "api_version": VERSION, "timeout": 5, **options}
    return AzureOpenAIProvider(ProviderSettings.model_validate(settings))


def write_job(folder: Path, root: str, *, rows: int = 6, models: tuple[str, ...] = (MODEL,), mode: str = "online",
              azure: dict | None = None, **extra: object) -> Path:
    dataset = write_rows(folder / "rows.jsonl", rows)
    job = {
        "name": "azurejob", "output_dir": str(folder / "results"), "models": list(models), "mode": mode,
        "providers": {"azure-openai": {"base_url": resource(root), "timeout": 10,
                                       **(azure or {})}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 60},
        "batch": {"poll_interval": 0.05, "max_requests": 1000},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": "Answer with one letter.", "user": "{{ question }}\n{{ options_block }}"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}],
        **extra,
    }
    path = folder / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def answers(path: Path) -> list[tuple[str, str]]:
    return sorted((row["id"], row["response"]) for row in map(json.loads, path.read_text().splitlines()))


# -- the provider ----------------------------------------------------------------------------------------


def test_it_is_registered_with_its_batch_api_and_genai_prices_azure_id():
    cls = provider_class("azure-openai")
    assert cls is AzureOpenAIProvider and cls.supports_batch and cls.price_id == "azure"


async def test_an_answer_comes_back_with_its_usage_and_the_model_behind_the_deployment(server: SimServer):
    set_deployments(server, {"prod-mini": "gpt-4o-mini"})
    azure = provider(server)
    await azure.start()
    try:
        completion = await azure.execute("prod-mini", MESSAGES, {"max_tokens": 20, "temperature": 0})
    finally:
        await azure.aclose()
    assert completion.text and completion.input_tokens > 0 and 0 < completion.output_tokens <= 20
    assert completion.raw["model"] == "gpt-4o-mini"
    assert server.stats()["by_route"]["azure-openai"] == 1


async def test_azures_remaining_only_rate_headers_reach_the_limiter_as_windows(server: SimServer):
    server.configure(rpm=5)
    azure = provider(server)
    await azure.start()
    try:
        completion = await azure.execute("gpt-4o-mini", MESSAGES, {"max_tokens": 5})
    finally:
        await azure.aclose()
    assert completion.rate is not None
    assert completion.rate["requests"].remaining == 4 and completion.rate["requests"].limit is None


async def test_an_entra_id_token_from_the_environment_is_sent_as_a_bearer_token(server: SimServer, monkeypatch):
    monkeypatch.delenv("AZURE_OPENAI_API_KEY")
    monkeypatch.setenv("AZURE_OPENAI_AD_TOKEN", KEY)  # the server takes this string from either header
    azure = provider(server)
    azure.check_key("gpt-4o-mini")
    await azure.start()
    try:
        assert (await azure.execute("gpt-4o-mini", MESSAGES, {"max_tokens": 5})).text
    finally:
        await azure.aclose()
    server.configure(api_key="another")
    azure = provider(server)
    await azure.start()
    try:
        with pytest.raises(AuthError, match="AZURE_OPENAI_AD_TOKEN") as info:
            await azure.execute("gpt-4o-mini", MESSAGES, {"max_tokens": 5})
    finally:
        await azure.aclose()
    assert KEY not in str(info.value)


def test_the_settings_it_cannot_go_without_are_each_one_sentence(monkeypatch):
    monkeypatch.delenv("OPENAI_API_VERSION")
    def check(**settings: object) -> str:
        with pytest.raises(ModelSetupError) as info:
            AzureOpenAIProvider(ProviderSettings.model_validate(settings)).check_key("gpt-4o")
        message = str(info.value)
        assert message.count(".") <= 3 and "\n" not in message and "(no request was sent)" in message
        return message

    assert "endpoint" in check(api_version=VERSION) and "AZURE_OPENAI_ENDPOINT" in check(api_version=VERSION)
    assert "api_version" in check(endpoint="https://x.openai.azure.com")
    assert "OPENAI_API_VERSION" in check(endpoint="https://x.openai.azure.com")
    monkeypatch.delenv("AZURE_OPENAI_API_KEY")
    assert "AZURE_OPENAI_API_KEY" in check(endpoint="https://x.openai.azure.com", api_version=VERSION)
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://x.openai.azure.com")
    monkeypatch.setenv("OPENAI_API_VERSION", VERSION)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", KEY)
    AzureOpenAIProvider(ProviderSettings()).check_key("gpt-4o")  # all three from the environment, as the SDK reads


async def test_auth_entra_gets_its_token_from_the_default_azure_credential_chain(server: SimServer, monkeypatch):
    """DefaultAzureCredential finds App Service's managed identity (the simulated server's identity endpoint) and
    the provider sends its token for the Cognitive Services scope; no key variable is read."""
    for variable in ("AZURE_OPENAI_API_KEY", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID",
                     "AZURE_FEDERATED_TOKEN_FILE", "MSI_ENDPOINT", "IDENTITY_SERVER_THUMBPRINT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("IDENTITY_ENDPOINT", server.root_url + "/sim/azure/identity")
    monkeypatch.setenv("IDENTITY_HEADER", "sim-identity-header")
    azure = provider(server, auth="entra")
    azure.check_key("gpt-4o-mini")
    await azure.start()
    try:
        assert (await azure.execute("gpt-4o-mini", MESSAGES, {"max_tokens": 5})).text
        await azure.probe("gpt-4o-mini")
    finally:
        await azure.aclose()
    assert server.stats()["by_status"]["200"] == 1


def test_auth_entra_needs_no_key_but_azure_identity(monkeypatch):
    monkeypatch.delenv("AZURE_OPENAI_API_KEY")
    azure = AzureOpenAIProvider(ProviderSettings.model_validate(
        {"endpoint": "https://x.openai.azure.com", "api_version": VERSION, "auth": "entra"}))
    azure.check_key("gpt-4o")
    azure.check_sdk("gpt-4o")  # azure-identity is installed in the test environment
    monkeypatch.setattr("runner.providers.azure_openai._importable", lambda module: module != "azure.identity")
    with pytest.raises(ModelSetupError, match=r"pip install 'llm-job-runner\[azure\]'"):
        azure.check_sdk("gpt-4o")


def test_a_missing_key_is_one_line_from_the_cli_and_sends_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("AZURE_OPENAI_API_KEY")
    path = write_job(tmp_path, f"http://127.0.0.1:{free_port()}")
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"))
    assert code == 1
    assert err.strip().splitlines()[-1] == (f"Error: {MODEL} needs an API key: export AZURE_OPENAI_API_KEY or "
                                            "AZURE_OPENAI_AD_TOKEN (no request was sent)")


def test_a_missing_api_version_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_VERSION")
    path = write_job(tmp_path, f"http://127.0.0.1:{free_port()}")
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"))
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"Error: {MODEL} needs an API version") and "OPENAI_API_VERSION" in last


async def test_a_job_files_api_version_is_taken_and_sent(tmp_path, server: SimServer, monkeypatch):
    monkeypatch.delenv("OPENAI_API_VERSION")
    path = write_job(tmp_path, server.url, rows=2, azure={"api_version": VERSION})
    outcome = await execute(load_job(path), open_store(tmp_path / "s.sqlite"))
    assert outcome.status == "completed", outcome.message
    assert server.stats()["by_route"]["azure-openai"] == 2
    unknown = write_job(tmp_path, server.url, rows=2, azure={"api_version": "1999-01-01"})
    refused = await execute(load_job(unknown), open_store(tmp_path / "s2.sqlite"))
    assert refused.status != "completed"  # the simulated server refuses a version Azure does not serve


async def test_errors_map_as_online_openai_ones(server: SimServer):
    set_deployments(server, {"gpt-4o-mini": "gpt-4o-mini"})
    azure = provider(server)
    await azure.start()
    try:
        with pytest.raises(BadRequest, match="DeploymentNotFound") as info:
            await azure.execute("nope", MESSAGES, {"max_tokens": 5})
        assert info.value.status == 404 and not info.value.retryable
        server.configure(fault_429=1.0, retry_after=0.5)
        with pytest.raises(RateLimited) as limited:
            await azure.execute("gpt-4o-mini", MESSAGES, {"max_tokens": 5})
        assert limited.value.retry_after == pytest.approx(0.5)
    finally:
        await azure.aclose()


def test_the_output_cap_is_sent_under_the_name_the_api_version_knows():
    def body(version: str) -> dict:
        azure = AzureOpenAIProvider(ProviderSettings.model_validate({"base_url": "http://127.0.0.1:1/openai",
                                                                     "api_version": version}))
        return azure.request_body("gpt-4o", MESSAGES, {"max_tokens": 7})

    assert body("2024-06-01")["max_tokens"] == 7 and "max_completion_tokens" not in body("2024-06-01")
    for version in ("2024-10-21", "2024-09-01-preview", "preview"):
        assert body(version)["max_completion_tokens"] == 7 and "max_tokens" not in body(version)


def test_the_cache_identity_differs_from_openai_and_between_resources(monkeypatch):
    from runner.plan.request import cache_key, canonical_request

    def key(provider_name: str) -> str:
        model_id = provider_class(provider_name).model_id("gpt-4o")
        return cache_key(canonical_request(provider_name, model_id, MESSAGES, {"max_tokens": 5}))

    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://east.openai.azure.com")
    east = key("azure-openai")
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://west.openai.azure.com/")
    assert len({east, key("azure-openai"), key("openai")}) == 3
    north = ProviderSettings.model_validate({"endpoint": "https://north.openai.azure.com",
                                             "deployments": {"prod": "gpt-4o"}})
    assert AzureOpenAIProvider.model_behind("prod", north) == "gpt-4o"
    assert AzureOpenAIProvider.model_behind("gpt-4o-mini", north) == "gpt-4o-mini"
    assert AzureOpenAIProvider.model_id("gpt-4o", None, north) == "https://north.openai.azure.com/gpt-4o"


def test_a_deployment_named_after_its_model_is_priced_by_genai_prices(tmp_path):
    pricing = Pricing(load_job(write_job(tmp_path, "http://127.0.0.1:1")))
    azure, openai_rates = pricing.rates(MODEL), pricing.rates("openai:gpt-4o-mini")
    assert azure is not None and openai_rates is not None
    assert (azure.input, azure.output) == (openai_rates.input, openai_rates.output) and "azure" in azure.source


def test_two_resources_named_in_job_files_never_share_answers(tmp_path):
    from runner.plan.stage import StagePlan

    def key(endpoint: str) -> str:
        folder = tmp_path / endpoint.split("//")[1].split(".")[0]
        folder.mkdir()
        path = write_job(folder, "http://127.0.0.1:1", rows=1, azure={"endpoint": endpoint})
        text = json.loads(path.read_text())
        text["providers"]["azure-openai"].pop("base_url")  # the resource only from the job's endpoint
        path.write_text(json.dumps(text))
        job = load_job(path)
        return next(iter(StagePlan(job, job.stages[0]))).key

    assert key("https://east.openai.azure.com") != key("https://west.openai.azure.com")


def test_a_deployment_named_otherwise_is_priced_and_shaped_as_the_model_its_deployments_entry_names(tmp_path):
    deployments = {"deployments": {"prod": "gpt-4o-mini", "thinker": "o3-mini"}}
    bare = Pricing(load_job(write_job(tmp_path, "http://127.0.0.1:1", models=("azure-openai:prod",))))
    assert bare.rates("azure-openai:prod") is None, "an unknown deployment name has no price of its own"
    named = load_job(write_job(tmp_path, "http://127.0.0.1:1", models=("azure-openai:prod",), azure=deployments))
    prod, mini = Pricing(named).rates("azure-openai:prod"), Pricing(named).rates("openai:gpt-4o-mini")
    assert prod is not None and mini is not None and (prod.input, prod.output) == (mini.input, mini.output)
    # o3-mini takes no temperature (the stage sends 0): the deployment behind "thinker" is refused as o3-mini is
    with pytest.raises(JobFileError, match="azure-openai:thinker takes no temperature"):
        load_job(write_job(tmp_path, "http://127.0.0.1:1", models=("azure-openai:thinker",), azure=deployments))
    load_job(write_job(tmp_path, "http://127.0.0.1:1", models=("azure-openai:thinker",)))  # unknown: sent as given


# -- the pre-flight probe ---------------------------------------------------------------------------------


async def test_the_probe_names_each_problem_in_one_sentence(server: SimServer):
    set_deployments(server, {"gpt-4o-mini": "gpt-4o-mini"})

    async def probe(azure: AzureOpenAIProvider, model: str = "gpt-4o-mini") -> None:
        await azure.start()
        try:
            await azure.probe(model)
        finally:
            await azure.aclose()

    started = time.monotonic()
    await probe(provider(server))
    with pytest.raises(ModelSetupError, match="no deployment named 'gpt-5-prod'"):
        await probe(provider(server), "gpt-5-prod")
    with pytest.raises(ModelSetupError, match="API version '2023-01-01'"):
        await probe(provider(server, api_version="2023-01-01"))
    server.configure(api_key="another")
    with pytest.raises(AuthError, match="refused the credential; check the variable AZURE_OPENAI_API_KEY"):
        await probe(provider(server))
    stopped = AzureOpenAIProvider(ProviderSettings.model_validate(
        {"base_url": f"http://127.0.0.1:{free_port()}/openai", "api_version": VERSION, "timeout": 2}))
    with pytest.raises(TransientError, match="cannot be reached"):
        await probe(stopped)
    assert time.monotonic() - started < 5
    stats = server.stats()
    # one probe reached a deployment (the unknown one was turned away before it): refused, so nothing was billed
    assert stats["received"] == 1 and stats["by_status"] == {"400": 1} and not stats["completed_by_digest"]


# -- runs -------------------------------------------------------------------------------------------------


async def test_a_second_run_is_answered_from_the_memo_and_the_report_names_the_model(tmp_path, server: SimServer):
    path = write_job(tmp_path, server.url, rows=8)
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(load_job(path), store)
    assert first.status == "completed", first.message
    sent = server.stats()["received"]
    assert sent == 8
    second = await execute(load_job(path), store)
    assert second.status == "completed" and server.stats()["received"] == sent, "the memo answered the rerun"
    assert answers(first.results["mc"]) == answers(second.results["mc"])
    data = report.build(store, second.run_id)
    assert data["totals"]["cache_hits"] == 8 and data["totals"]["cost"] == 0
    assert MODEL in report.render(report.build(store, first.run_id), "text")
    assert report.build(store, first.run_id)["totals"]["cost"] > 0, "priced by genai-prices"


async def test_a_budget_stops_a_priced_deployment_within_it(tmp_path, server: SimServer):
    model = "azure-openai:dear"
    path = write_job(tmp_path, server.url, rows=30, models=(model,), budget={"usd": 0.5},
                     prices={model: {"input": 2000.0, "output": 8000.0}})
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "budget_exhausted", outcome.message
    spent = sum(row["amount"] for row in store.ledger(outcome.run_id, kind="charge"))
    assert 0 < spent <= 0.5 + 1e-9
    assert 0 < server.stats()["received"] < 30


async def test_a_batch_run_answers_as_an_online_run(tmp_path, server: SimServer):
    (tmp_path / "online").mkdir()
    (tmp_path / "batch").mkdir()
    online = await execute(load_job(write_job(tmp_path / "online", server.url)),
                           open_store(tmp_path / "online" / "s.sqlite"))
    before = server.stats()["received"]
    store = open_store(tmp_path / "batch" / "s.sqlite")
    batched = await execute(load_job(write_job(tmp_path / "batch", server.url, mode="batch")), store)
    assert online.status == batched.status == "completed", batched.message
    stats = server.stats()
    assert stats["batches"] == 1 and stats["batch_lines"] == 6 and stats["received"] == before, "nothing online"
    assert answers(batched.results["mc"]) == answers(online.results["mc"])
    totals = report.build(store, batched.run_id)["totals"]
    assert totals["batched"] == 6 and totals["done"] == 6


async def test_the_batch_client_reads_results_by_custom_id_and_finds_a_batch_by_label(server: SimServer):
    azure = provider(server)
    await azure.start()
    try:
        batches = azure.batches()
        lines = [BatchLine(f"c{i}", [{"role": "user", "content": f"question {i}"}], {"max_tokens": 5})
                 for i in range(3)]
        since = time.time()
        batch_id = await batches.submit("gpt-4o-mini", lines, label="run/mc/gpt r0 #d1g3st")
        assert (await batches.find("run/mc/gpt r0 #d1g3st", ["c0", "c1", "c2"], since=since)).batch_id == batch_id
        assert (await batches.find("run/mc/gpt r0 #d1g3st", [], since=since, known=[batch_id])).batch_id is None
        await asyncio.sleep(0.25)
        results = await batches.results(batch_id)
        online = [await azure.execute("gpt-4o-mini", line.messages, line.params) for line in lines]
    finally:
        await azure.aclose()
    assert [r.custom_id for r in results] == ["c0", "c1", "c2"]
    assert [r.completion.text for r in results if r.completion] == [c.text for c in online]


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _count(db: Path, what: str) -> int:
    store = open_store(db)
    try:
        if what == "tasks":
            return len(store.tasks())
        return sum(len(store.batches(run["id"])) for run in store.list_runs())
    finally:
        store.close()


def _kill_then_resume(tmp_path: Path, job: Path, db: Path, until: str, count: int) -> tuple[str, list[str]]:
    """Submit, SIGKILL once ``count`` of ``until`` are in the store, resume: (the run, the digests of the messages
    whose answers were stored before the kill)."""
    open_store(db).close()  # migrated before the runner starts, so the polls below only read
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: _count(db, until) >= count or proc.poll() is not None, 60, f"{count} {until}")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    stored = [_digest(json.loads(r["request_json"])["messages"]) for r in store.responses()]
    store.close()
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout
    return run_id, stored


def _digest(messages: list) -> str:
    """The simulated server's digest of a request's messages (its ``completed_by_digest`` keys)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


@pytest.mark.slow  # a provider's kill and resume in new processes (the engine's stays in the fast path): 6 s
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_kill_9_then_resume_sends_nothing_twice(tmp_path, sim_server, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "any")  # the subprocess server takes any key
    job = write_job(tmp_path, sim_server, rows=40, azure={"concurrency": 2})
    db = tmp_path / "s.sqlite"
    run_id, stored = _kill_then_resume(tmp_path, job, db, "tasks", 10)
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert 10 <= len(stored) < 40 and len(completed) == 40
    assert all(completed[digest] == 1 for digest in stored), "a request with a stored answer was sent again"
    assert len(open_store(db).tasks(run_id, status="done")) == 40


@pytest.mark.slow  # a provider's batch killed and resumed (the engine's stays in the fast path): 6.5 s
def test_a_batch_run_killed_while_polling_resumes_without_submitting_twice(tmp_path, sim_server, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "any")
    request = urllib.request.Request(sim_server.removesuffix("/v1") + "/sim/config",
                                     data=json.dumps({"batch_delay": 2.0}).encode(), method="POST")
    urllib.request.urlopen(request, timeout=5).read()
    job = write_job(tmp_path, sim_server, rows=12, mode="batch")
    db = tmp_path / "s.sqlite"
    run_id, stored = _kill_then_resume(tmp_path, job, db, "batches", 1)
    assert not stored, "killed before the batch ended"
    stats = sim_stats(sim_server)
    # the pre-flight probes of submit and resume reach the server, unanswered: no request was answered online
    assert stats["batches"] == 1 and stats["batch_lines"] == 12 and not stats["completed_by_digest"]
    store = open_store(db)
    assert len(store.tasks(run_id, status="done")) == 12
    assert report.build(store, run_id)["totals"]["batched"] == 12


def test_build_providers_checks_the_endpoint_before_anything_is_sent(tmp_path):
    job = load_job(write_job(tmp_path, "http://127.0.0.1:1"))
    job.providers["azure-openai"] = ProviderSettings.model_validate({"api_version": VERSION})
    with pytest.raises(ModelSetupError, match="endpoint: https://NAME.openai.azure.com"):
        build_providers(job)
    assert issubclass(AzureOpenAIProvider, OpenAIChatProvider)


def test_a_job_names_the_resource_its_auth_and_its_deployments_or_is_told_the_endpoint_is_missing(
        tmp_path, monkeypatch, capsys):
    path = write_job(tmp_path, "http://127.0.0.1:1")
    job = json.loads(path.read_text())
    job["providers"]["azure-openai"] = {"endpoint": "https://res.openai.azure.com", "auth": "key",
                                        "deployments": {"gpt-4o-mini": "gpt-4o-mini"}}
    path.write_text(json.dumps(job))
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 0, err
    job["providers"]["azure-openai"] = {"auth": "password"}
    path.write_text(json.dumps(job))
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"))
    assert code != 0 and "providers: azure-openai: auth" in err.strip().splitlines()[-1], err
    job["providers"]["azure-openai"] = {}
    path.write_text(json.dumps(job))
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"))
    last = err.strip().splitlines()[-1]
    assert code == 1 and last.startswith(f"Error: {MODEL} needs its resource's endpoint")
    assert "AZURE_OPENAI_ENDPOINT" in last and "(no request was sent)" in last


def test_a_reasoning_deployment_on_an_api_version_without_reasoning_models_is_refused_naming_the_version(
        tmp_path, monkeypatch):
    """Issue 37: Azure serves the o-series and gpt-5 (and reasoning_effort) from API version 2024-12-01-preview on;
    the GA 2024-10-21 has neither, and the README's own example paired an o3-mini deployment with it. Refused when
    the job is read, whatever drop_unsupported says (the model is not served there; there is no setting to drop),
    from the job's api_version or OPENAI_API_VERSION; a version that has them, or a model that does not reason,
    passes."""
    thinker = {"deployments": {"thinker": "o3-mini"}}

    def job(version: str | None, model: str = "azure-openai:thinker") -> Path:
        azure = {**thinker, **({"api_version": version} if version else {})}
        return write_job(tmp_path, "http://127.0.0.1:1", models=(model,), azure=azure, drop_unsupported=True)

    expected = ("azure-openai:thinker is a reasoning model, which Azure OpenAI serves from API version "
                "2024-12-01-preview on, not 2024-10-21: set providers: azure-openai: api_version: (or "
                "OPENAI_API_VERSION) to 2024-12-01-preview or later")
    with pytest.raises(JobFileError) as refused:
        load_job(job("2024-10-21"))
    assert expected in str(refused.value)
    monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
    with pytest.raises(JobFileError, match="serves from API version 2024-12-01-preview on, not 2024-10-21"):
        load_job(job(None))
    for version in ("2024-12-01-preview", "2025-04-01-preview", "preview"):
        load_job(job(version))
    load_job(job("2024-10-21", "azure-openai:gpt-4o-mini"))  # not a reasoning model
