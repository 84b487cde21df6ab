"""The engine with a scripted in-process provider: memo, retries, pauses, error classes, interrupts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from runner.engine.run import execute
from runner.errors import AuthError, BadRequest, QuotaExceeded, RateLimited, TransientError
from runner.providers.base import Completion, ProviderSettings
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import Store, open_store
from tests.helpers import run_cli, write_job, write_rows


def _job(tmp_path: Path, rows: int = 12, **kwargs):
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    return load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"], **kwargs))


def _tasks(store: Store, run_id: str) -> list[tuple]:
    """(item, status, attempts, error_class, cache_hit) of a run's tasks, by item."""
    columns = ("item", "status", "attempts", "error_class", "cache_hit")
    return sorted((tuple(t[c] for c in columns) for t in store.tasks(run_id)), key=lambda t: t[0])


async def test_fresh_run_then_every_request_is_a_cache_hit(tmp_path, fake_provider):
    job = _job(tmp_path)
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    assert first.status == "completed"
    assert len(fake_provider.history) == 12
    lines = first.results["mc"].read_text().splitlines()
    assert len(lines) == 12 and {json.loads(x)["id"] for x in lines} == {str(i) for i in range(1, 13)}

    second = await execute(job, store)
    assert second.status == "completed"
    assert len(fake_provider.history) == 12, "a re-submit sent requests again"
    totals = report.build(store, second.run_id)["totals"]
    assert totals["cache_hits"] == 12 and totals["sent"] == 0 and totals["cache_hit_rate"] == 1.0
    again = [json.loads(x) for x in second.results["mc"].read_text().splitlines()]
    assert all(r["cache_hit"] for r in again)
    assert [r["response"] for r in again] == [json.loads(x)["response"] for x in lines]


async def test_results_map_the_letter_back_through_the_permutation(tmp_path, fake_provider):
    job = _job(tmp_path, rows=8, seeds="[0, 1, 2]")
    fake_provider.behaviour = lambda *a: Completion(text="The answer is B.", input_tokens=5, output_tokens=3)
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    rows = [json.loads(x) for x in outcome.results["mc"].read_text().splitlines()]
    assert len(rows) == 24
    for r in rows:
        assert r["answer_letter"] == "B"
        assert r["parsed"] == r["permutation"][1]
        assert r["inverse"][r["parsed"]] == 1
        assert r["score"] == (1.0 if r["parsed"] == r["gold"] else 0.0)
        assert r["seed"] in (0, 1, 2) and len(r["cache_key"]) == 64


async def test_transient_errors_are_retried_with_bounded_attempts(tmp_path, fake_provider):
    job = _job(tmp_path, rows=4)
    calls: dict[str, int] = {}

    def flaky(model, messages, params, n):
        key = messages[-1]["content"]
        calls[key] = calls.get(key, 0) + 1
        return TransientError("boom", status=500) if calls[key] <= 2 else None

    fake_provider.behaviour = flaky
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    assert all(t[1] == "done" and t[2] == 3 for t in _tasks(store, outcome.run_id))
    assert outcome.stats.totals().retries == 8


async def test_permanent_failure_ends_in_bounded_time_and_is_counted(tmp_path, fake_provider):
    job = _job(tmp_path, rows=5, extra="")
    job.retry.max_attempts = 3
    fake_provider.behaviour = lambda *a: TransientError("always down", status=503)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await asyncio.wait_for(execute(job, store), timeout=10)
    # a run whose every request failed has not completed anything: it ends failed, with the errors named
    assert outcome.status == "failed"
    assert outcome.message.startswith("every one of its 5 requests failed (5 server_error)")
    assert len(fake_provider.history) == 15
    row = report.build(store, outcome.run_id)["rows"][0]
    assert row["failed"] == 5 and row["errors"] == {"server_error": 5}
    failed = [json.loads(x) for x in outcome.results["mc"].read_text().splitlines()]
    assert all(r["status"] == "failed" and r["error_class"] == "server_error" for r in failed)


async def test_a_429_pauses_the_whole_endpoint_for_retry_after(tmp_path, fake_provider):
    job = _job(tmp_path, rows=6)
    job.providers["fake"] = ProviderSettings(concurrency=3)
    fake_provider.latency = 0.01
    first = []

    def limited(model, messages, params, n):
        if not first:
            first.append(asyncio.get_running_loop().time())
            return RateLimited("slow down", retry_after=0.4)
        return None

    fake_provider.behaviour = limited
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert outcome.status == "completed"
    started = [h[3] for h in fake_provider.history]
    # Requests that started after the 429 came back waited out the pause, whichever task sent them.
    later = [t for t in started if t > first[0]]
    assert later and all(t >= first[0] + 0.4 for t in later)


async def test_bad_request_fails_the_item_without_retry(tmp_path, fake_provider):
    job = _job(tmp_path, rows=4)
    fake_provider.behaviour = lambda m, msgs, p, n: BadRequest("nope", status=400) if "number 2" in msgs[-1][
        "content"] else None
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    assert len(fake_provider.history) == 4
    statuses = {t[0].split("|")[0]: (t[1], t[3]) for t in _tasks(store, outcome.run_id)}
    assert statuses["3"] == ("failed", "bad_request")
    assert sum(1 for s in statuses.values() if s[0] == "done") == 3


async def test_auth_error_stops_the_endpoint_after_one_request(tmp_path, fake_provider):
    job = _job(tmp_path, rows=10)
    job.providers["fake"] = ProviderSettings(concurrency=1)
    fake_provider.behaviour = lambda *a: AuthError("key refused", status=401)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert len(fake_provider.history) == 1
    tasks = _tasks(store, outcome.run_id)
    assert len(tasks) == 10 and all(t[1] == "failed" and t[3] == "auth" for t in tasks)


async def test_insufficient_quota_stops_the_run(tmp_path, fake_provider):
    job = _job(tmp_path, rows=30)
    job.providers["fake"] = ProviderSettings(concurrency=1)
    fake_provider.behaviour = lambda *a: QuotaExceeded("insufficient quota", status=429)
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert outcome.status == "failed" and "quota" in (outcome.message or "")
    assert len(fake_provider.history) == 1


async def test_identical_requests_in_flight_are_sent_once(tmp_path, fake_provider):
    dataset = tmp_path / "dup.jsonl"
    row = {"question": "Same?", "choices": ["a", "b", "c", "d"], "gold": 0}
    dataset.write_text("\n".join(json.dumps(row) for _ in range(5)) + "\n")
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"], stage_extra="    # dup"))
    job.stages[0].choices.shuffle = False
    fake_provider.latency = 0.05
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert len(fake_provider.history) == 1
    rows = [json.loads(x) for x in outcome.results["mc"].read_text().splitlines()]
    assert len(rows) == 5 and sum(r["cache_hit"] for r in rows) == 4


async def test_first_interrupt_lets_in_flight_requests_finish_and_resume_completes(tmp_path, fake_provider):
    job = _job(tmp_path, rows=40)
    job.providers["fake"] = ProviderSettings(concurrency=4)
    fake_provider.latency = 0.1
    store = open_store(tmp_path / "s.sqlite")
    loop = asyncio.get_running_loop()
    loop.call_later(0.25, os.kill, os.getpid(), signal.SIGINT)
    outcome = await execute(job, store)
    assert outcome.status == "interrupted"
    sent = len(fake_provider.history)
    assert 0 < sent < 40
    # Every request that was sent finished and was recorded: nothing in flight was lost.
    assert len(_tasks(store, outcome.run_id)) == sent
    assert store.get_run(outcome.run_id)["status"] == "interrupted"

    resumed = await execute(job, store, run_id=outcome.run_id)
    assert resumed.status == "completed"
    assert len(fake_provider.history) == 40, "a request that had finished was sent again"
    lines = resumed.results["mc"].read_text().splitlines()
    assert sorted(json.loads(x)["id"] for x in lines) == sorted(str(i) for i in range(1, 41))


async def test_second_interrupt_abandons_in_flight_requests(tmp_path, fake_provider):
    job = _job(tmp_path, rows=8)
    fake_provider.latency = 30
    store = open_store(tmp_path / "s.sqlite")
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
    loop.call_later(0.4, os.kill, os.getpid(), signal.SIGINT)
    outcome = await asyncio.wait_for(execute(job, store), timeout=10)
    assert outcome.status == "interrupted"
    assert _tasks(store, outcome.run_id) == []


async def test_a_repeat_after_the_answer_came_but_before_it_was_committed_is_not_resent(tmp_path, fake_provider):
    # Rows A, B, A with one request at a time: A is answered while B waits for the slot; when the second A
    # is planned, its answer is not in the store yet (same chunk, writer not run) and not in flight.
    dataset = tmp_path / "aba.jsonl"
    a = {"question": "A?", "choices": ["a", "b", "c", "d"], "gold": 0}
    b = {"question": "B?", "choices": ["a", "b", "c", "d"], "gold": 0}
    dataset.write_text("\n".join(json.dumps(r) for r in (a, b, a)) + "\n")
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"]))
    job.stages[0].choices.shuffle = False
    job.providers["fake"] = ProviderSettings(concurrency=1)
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert len(fake_provider.history) == 2
    rows = [json.loads(x) for x in outcome.results["mc"].read_text().splitlines()]
    assert [r["cache_hit"] for r in sorted(rows, key=lambda r: r["id"])] == [False, False, True]


async def test_a_run_with_some_answers_and_some_failures_completes(tmp_path, fake_provider):
    job = _job(tmp_path, rows=4, extra="")
    job.retry.max_attempts = 1
    # the first row's request fails every attempt; the others are answered
    fake_provider.behaviour = lambda model, messages, params, n: (
        TransientError("down for this one", status=503) if "number 1:" in messages[-1]["content"] else None)
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert outcome.status == "completed" and outcome.stats.totals().errors == 1


def test_a_run_whose_every_request_failed_exits_non_zero_from_the_cli(tmp_path, monkeypatch, capsys, fake_provider):
    fake_provider.behaviour = lambda *a: TransientError("always down", status=503)
    job = _job(tmp_path, rows=2)
    code, out, err = run_cli(monkeypatch, capsys, "submit", job.path, "--db", str(tmp_path / "s.sqlite"))
    assert code == 1
    assert "failed (every one of its 2 requests failed (2 server_error)" in out
    assert err.splitlines()[-1].startswith("Error: run ") and "Traceback" not in err
