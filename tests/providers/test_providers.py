"""The cloud providers through their official SDKs (openai, anthropic, google-genai) against the simulated
server, which speaks each wire format: answers and usage, and every error class of the taxonomy.

Each test runs a real job through the whole runner (plan, dispatcher, limits, retries, store) with the
provider's base URL pointed at the simulated server on 127.0.0.1.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from runner.cli import main
from runner.engine.run import execute
from runner.errors import ModelSetupError
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import Store, open_store
from simserver import SimConfig, SimServer, simulated_reply, start_server
from tests.helpers import write_job, write_rows

KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
MODELS = {"openai": "openai:gpt-4o-mini", "anthropic": "anthropic:claude-haiku-4-5",
          "gemini": "gemini:gemini-2.0-flash"}
PROVIDERS = list(MODELS)


def base_url(srv: SimServer, provider: str) -> str:
    return srv.url if provider == "openai" else srv.root_url


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (*KEYS.values(), "GOOGLE_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    for variable in KEYS.values():
        monkeypatch.setenv(variable, "test-key-" + variable.lower())


def make_job(tmp_path: Path, srv: SimServer, provider: str, rows: int, *, seeds: str = "[0]",
             settings: str = "timeout: 1", retry: str = "", name: str = "job", model: str | None = None):
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    extra = f"providers: {{{provider}: {{base_url: {json.dumps(base_url(srv, provider))}, {settings}}}}}"
    if retry:
        extra += f"\nretry: {{{retry}}}"
    model = f"{provider}:{model}" if model else MODELS[provider]
    path = write_job(tmp_path / f"{name}.yaml", dataset, models=[model], extra=extra, seeds=seeds,
                     name=name)
    if retry:  # the later retry: line wins over write_job's default one
        text = path.read_text().splitlines()
        default = next(i for i, line in enumerate(text) if line.startswith("retry:"))
        path.write_text("\n".join(text[:default] + text[default + 1:]) + "\n")
    return load_job(path)


def statuses(store: Store, run_id: str) -> dict[str, int]:
    return dict(Counter(task["status"] for task in store.tasks(run_id)))


def error_classes(store: Store, run_id: str) -> dict[str, int]:
    return dict(Counter(task["error_class"] for task in store.tasks(run_id, status="failed")))


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_fifty_requests_complete_with_the_right_text_and_usage(tmp_path, provider):
    async with await start_server() as srv:
        job = make_job(tmp_path, srv, provider, 50)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "completed"
    assert stats["received"] == 50 and stats["by_route"][provider] == 50
    rows = [(r["request_json"], r["response_text"], r["input_tokens"], r["output_tokens"]) for r in store.responses()]
    seen = 0
    for request_json, text, input_tokens, output_tokens in rows:
        request = json.loads(request_json)
        params = request["params"]
        expected, _ = simulated_reply(request["model"], request["messages"], params.get("temperature"),
                                      params.get("max_tokens"), params.get("top_p"), params.get("stop"),
                                      params.get("seed"))
        assert text == expected
        assert input_tokens > 0 and output_tokens > 0
        seen += 1
    assert seen == 50
    built = report.build(store, outcome.run_id)
    assert built["totals"]["sent"] == 50 and built["totals"]["failed"] == 0
    assert built["totals"]["input_tokens"] > 0 and built["totals"]["output_tokens"] > 0


async def test_the_same_job_gets_the_same_answers_in_every_format(tmp_path):
    answers = {}
    async with await start_server() as srv:
        for provider in PROVIDERS:
            job = make_job(tmp_path, srv, provider, 10, name=f"same-{provider}", model="one-model")
            outcome = await execute(job, open_store(tmp_path / f"{provider}.sqlite"))
            lines = [json.loads(line) for line in outcome.results["mc"].read_text().splitlines()]
            answers[provider] = sorted((r["id"], r["seed"], r["response"]) for r in lines)
    assert answers["openai"] == answers["anthropic"] == answers["gemini"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refused_key_stops_the_endpoint_after_one_request(tmp_path, provider):
    async with await start_server(SimConfig(fault_401=1.0)) as srv:
        job = make_job(tmp_path, srv, provider, 50)  # default concurrency: the first request goes alone
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert stats["received"] == 1
    assert statuses(store, outcome.run_id) == {"failed": 50}
    assert error_classes(store, outcome.run_id) == {"auth": 50}
    message = store.tasks(attempts=1)[0]["error"]
    assert KEYS[provider] in message and "test-key" not in message
    assert report.build(store, outcome.run_id)["totals"]["failed"] == 50


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_429_storm_is_ridden_out(tmp_path, provider):
    async with await start_server(SimConfig(fault_429=0.6, retry_after=0.02, seed=3)) as srv:
        job = make_job(tmp_path, srv, provider, 50)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "completed"
    assert statuses(store, outcome.run_id) == {"done": 50}
    assert stats["by_status"]["429"] > 20
    assert outcome.stats.totals().retries == stats["by_status"]["429"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("fault", ["fault_500", "fault_503", "fault_malformed"])
async def test_server_errors_and_malformed_answers_are_retried(tmp_path, provider, fault):
    async with await start_server(SimConfig(**{fault: 0.4}, seed=5)) as srv:
        job = make_job(tmp_path, srv, provider, 20)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "completed"
    assert statuses(store, outcome.run_id) == {"done": 20}
    assert stats["received"] == 20 + outcome.stats.totals().retries > 20


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_timeout_is_retried(tmp_path, provider):
    async with await start_server(SimConfig(fault_timeout=0.3, hang_seconds=5, seed=2)) as srv:
        job = make_job(tmp_path, srv, provider, 8, settings="timeout: 0.3")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    assert outcome.status == "completed"
    assert statuses(store, outcome.run_id) == {"done": 8}
    assert outcome.stats.totals().retries > 0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_quota_exhausted_stops_the_whole_run(tmp_path, provider):
    async with await start_server(SimConfig(fault_quota=1.0)) as srv:
        job = make_job(tmp_path, srv, provider, 50)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "failed"
    assert "quota" in outcome.message or "credit" in outcome.message
    assert stats["received"] == 1
    assert error_classes(store, outcome.run_id) == {"quota": 1}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_filtered_content_fails_the_item_without_a_retry(tmp_path, provider):
    async with await start_server(SimConfig(fault_filter=1.0)) as srv:
        job = make_job(tmp_path, srv, provider, 10)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert stats["received"] == 10
    assert error_classes(store, outcome.run_id) == {"refused": 10}
    assert report.build(store, outcome.run_id)["rows"][0]["errors"] == {"refused": 10}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_rejected_request_fails_its_item_without_a_retry(tmp_path, provider):
    # A request larger than the server's whole token-per-minute limit can never be served: every format
    # answers it 400 (invalid request), which no retry can fix.
    async with await start_server(SimConfig(tpm=10, itpm=10)) as srv:
        job = make_job(tmp_path, srv, provider, 6)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert stats["received"] == 6 and stats["by_status"] == {"400": 6}
    assert error_classes(store, outcome.run_id) == {"bad_request": 6}
    assert max(task["attempts"] for task in store.tasks()) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_permanently_failing_endpoint_ends_in_bounded_time(tmp_path, provider):
    async with await start_server(SimConfig(fault_500=1.0)) as srv:
        job = make_job(tmp_path, srv, provider, 20,
                       retry="max_attempts: 3, backoff_initial: 0.01, backoff_max: 0.02, max_elapsed: 5")
        store = open_store(tmp_path / "s.sqlite")
        started = time.monotonic()
        outcome = await execute(job, store)
        elapsed = time.monotonic() - started
        stats = srv.stats()
    assert elapsed < 10
    assert stats["received"] == 20 * 3  # every item tried exactly max_attempts times
    assert error_classes(store, outcome.run_id) == {"server_error": 20}
    assert report.build(store, outcome.run_id)["totals"]["failed"] == 20


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_server_that_is_not_there_fails_every_item_as_a_connection_error(tmp_path, provider):
    async with await start_server() as srv:
        job = make_job(tmp_path, srv, provider, 5,
                       retry="max_attempts: 2, backoff_initial: 0.01, backoff_max: 0.02, max_elapsed: 5")
    # the server is closed now: its port refuses connections
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert error_classes(store, outcome.run_id) == {"connection": 5}
    attempts = [task["attempts"] for task in store.tasks()]
    assert (min(attempts), max(attempts)) == (2, 2)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_missing_key_stops_the_job_before_any_request(tmp_path, provider, monkeypatch, capsys):
    monkeypatch.delenv(KEYS[provider])
    async with await start_server() as srv:
        job = make_job(tmp_path, srv, provider, 3)
        with pytest.raises(ModelSetupError, match=KEYS[provider]):
            await execute(job, open_store(tmp_path / "s.sqlite"))
        assert srv.stats()["received"] == 0
        assert open_store(tmp_path / "s.sqlite").list_runs() == []


def test_a_missing_key_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    dataset = write_rows(tmp_path / "rows.jsonl", 2)
    path = write_job(tmp_path / "job.yaml", dataset, models=[MODELS["anthropic"]])
    monkeypatch.setattr(sys, "argv", ["runner", "submit", str(path), "--db", str(tmp_path / "s.sqlite")])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"Error: {MODELS['anthropic']} needs an API key: export ANTHROPIC_API_KEY (no request was sent)"
    assert all(line.startswith("warning: ") for line in err[:-1])  # e.g. that no budget caps the spend
