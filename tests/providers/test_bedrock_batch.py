"""Bedrock batch inference through boto3 (the ``bedrock`` control plane and ``s3``) against the simulated server, and
the S3 staging functions against moto's S3 server (a server this project did not write): the client's submit,
status, results by record id, find, cancel, expiry and idempotent create; whole runs with ``mode: batch`` (answers
as online at the batch price, the memo, a budget, a stage too small for a job, kill -9 and resume, an intent adopted)
and the settings it cannot go without."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from runner.engine.run import execute
from runner.errors import BadRequest, ModelSetupError
from runner.providers.base import ProviderSettings
from runner.providers.batching import CANCELLED, EXPIRED, BatchLine
from runner.providers.bedrock import BedrockProvider
from runner.providers.bedrock_batch import job_name
from runner.providers.s3_files import S3Files
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, start_server
from tests.helpers import free_port, isolated_aws, killed_after_submit, run_cli, runner_cmd, sim_stats, write_rows

ACCESS_KEY = "AKIDSIMULATEDBEDROCK"
MODEL = "amazon.nova-pro-v1:0"
CLAUDE = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
FOLDER = "s3://runner-batches/tests"
ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"
#: USD per million tokens, the batch price half the online one
PRICES = {"input": 0.8, "output": 3.2, "batch_input": 0.4, "batch_output": 1.6}
ROWS = 120


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS credentials from the environment only (tests/helpers.py)."""
    isolated_aws(monkeypatch, tmp_path, ACCESS_KEY, "simulated-secret-never-shown")


def provider(url: str, **options: object) -> BedrockProvider:
    settings = {"base_url": url, "timeout": 5, "batch_folder": FOLDER, "batch_role_arn": ROLE, **options}
    return BedrockProvider(ProviderSettings.model_validate({k: v for k, v in settings.items() if v is not None}))


def batch_lines(count: int, prefix: str = "r") -> list[BatchLine]:
    return [BatchLine(f"{prefix}{i}", [{"role": "system", "content": "Answer briefly."},
                                       {"role": "user", "content": f"question {prefix} {i}"}],
                      {"max_tokens": 5, "temperature": 0}) for i in range(count)]


def label(digest: str = "d" * 32) -> str:
    return f"run1/mc/bedrock:{MODEL} r0 #{digest}"


# -- settings ----------------------------------------------------------------------------------------------


def test_an_endpoint_batches_only_with_its_folder_and_role():
    assert BedrockProvider.supports_batch and BedrockProvider.batch_min_lines == 100
    assert provider("http://127.0.0.1:1").supports_batch
    assert not provider("http://127.0.0.1:1", batch_role_arn=None).supports_batch
    assert provider("http://127.0.0.1:1").batch_unavailable(MODEL) is None
    sentence = provider("http://127.0.0.1:1", batch_folder=None).batch_unavailable(MODEL)
    assert "batch_folder: s3://BUCKET/PREFIX" in sentence and "batch_role_arn: arn:aws:iam::" in sentence
    assert "(batch_folder missing)" in sentence and ". " not in sentence
    for bad in ({"batch_folder": "s3://Not_A_Bucket/x"}, {"batch_folder": "/tmp/here"},
                {"batch_role_arn": "arn:aws:iam::123:user/me"}):
        with pytest.raises(ModelSetupError, match=f"providers: bedrock: {next(iter(bad))} .*(S3 folder|IAM role)"):
            provider("http://127.0.0.1:1", **bad)


def test_a_job_name_keeps_the_digest_whole_within_the_service_models_pattern():
    import re

    name = job_name(f"{'a-very-long-run-id' * 4}/stage one/bedrock:{CLAUDE} r2 #{'f' * 32}")
    assert len(name) <= 63 and name.endswith("-" + "f" * 32)
    assert re.fullmatch(r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}", name)


def test_a_group_is_cut_into_even_jobs_by_the_record_and_size_quotas(monkeypatch):
    from runner.providers import bedrock_batch

    batches = provider("http://127.0.0.1:1").batches()
    lines = batch_lines(2500)
    monkeypatch.setattr(bedrock_batch, "MAX_RECORDS", 1000)
    assert [len(part) for part in batches.chunks(MODEL, lines)] == [834, 834, 832]
    size = len(batches.input_file(MODEL, lines))
    monkeypatch.setattr(bedrock_batch, "FILE_BUDGET", size // 4 - 1)  # a little under a quarter of the file
    parts = batches.chunks(MODEL, lines)
    assert [len(part) for part in parts] == [500] * 5 and [line for part in parts for line in part] == lines


# -- the client against the simulated server ------------------------------------------------------------------


async def test_submit_status_results_by_record_id_and_find_by_name():
    async with await start_server(SimConfig(api_key=ACCESS_KEY)) as srv:
        bedrock = provider(srv.root_url)
        await bedrock.start()
        try:
            batches = bedrock.batches()
            lines = batch_lines(100)
            since = time.time()
            arn = await batches.submit(MODEL, lines, label=label())
            status = await batches.status(arn)
            results = await batches.results(arn)
            found = await batches.find(label(), [line.custom_id for line in lines], since=since)
            other = await batches.find(label(), [], since=since, known=[arn])
            online = [await bedrock.execute(MODEL, line.messages, line.params) for line in lines[:5]]
        finally:
            await bedrock.aclose()
        stats = srv.stats()
    assert arn.startswith("arn:aws:bedrock:us-east-1:") and ":model-invocation-job/" in arn
    assert (status.state, status.provider_state, status.total, status.succeeded) == ("ended", "Completed", 100, 100)
    # the output's order is not the input's; results come back in the input's order, by record id
    assert [r.custom_id for r in results] == [line.custom_id for line in lines]
    assert [r.completion.text for r in results[:5]] == [c.text for c in online]
    assert all(r.completion.input_tokens > 0 and r.completion.output_tokens > 0 for r in results)
    assert found.batch_id == arn and other.batch_id is None
    assert stats["batches"] == 1 and stats["batch_lines"] == 100 and stats["by_route"].get("bedrock-converse") == 5


async def test_claude_records_go_as_invoke_model_messages_bodies():
    async with await start_server() as srv:
        bedrock = provider(srv.root_url)
        await bedrock.start()
        try:
            batches = bedrock.batches()
            lines = batch_lines(100)
            body = batches.model_input(CLAUDE, lines[0])
            arn = await batches.submit(CLAUDE, lines, label=label("c" * 32))
            results = await batches.results(arn)
            online = await bedrock.execute(CLAUDE, lines[0].messages, lines[0].params)
        finally:
            await bedrock.aclose()
    assert body["anthropic_version"] == "bedrock-2023-05-31" and "model" not in body
    assert body["system"] == "Answer briefly." and body["max_tokens"] == 5
    assert results[0].completion.text == online.text and results[0].raw["modelOutput"]["type"] == "message"


async def test_the_same_create_sent_twice_makes_one_job():
    async with await start_server() as srv:
        bedrock = provider(srv.root_url)
        await bedrock.start()
        try:
            batches = bedrock.batches()
            first = await batches.submit(MODEL, batch_lines(100), label=label())
            again = await batches.submit(MODEL, batch_lines(100), label=label())  # a create whose answer was lost
        finally:
            await bedrock.aclose()
        stats = srv.stats()
    assert first == again and stats["batches"] == 1


async def test_a_cancel_keeps_the_records_that_ran_and_an_expiry_retries_the_rest():
    async with await start_server(SimConfig(batch_delay=10.0)) as srv:
        now = [0.0]
        srv.clock = lambda: now[0]
        bedrock = provider(srv.root_url)
        await bedrock.start()
        try:
            batches = bedrock.batches()
            stopped = await batches.submit(MODEL, batch_lines(100, "s"), label=label("a" * 32))
            expired = await batches.submit(MODEL, batch_lines(100, "e"), label=label("b" * 32))
            now[0] = 4.0  # four tenths of each job have run
            assert (await batches.status(stopped)).provider_state == "InProgress"
            with pytest.raises(BadRequest, match="has not ended"):
                await batches.results(stopped)
            await batches.cancel(stopped)
            assert srv.expire_batch(expired.rsplit("/", 1)[-1])
            states = [(await batches.status(arn)).provider_state for arn in (stopped, expired)]
            kept = await batches.results(stopped)
            lapsed = await batches.results(expired)
            await batches.cancel(stopped)  # already over: nothing to stop, no error
        finally:
            await bedrock.aclose()
    assert states == ["Stopped", "PartiallyCompleted"]
    for results, kind in ((kept, CANCELLED), (lapsed, EXPIRED)):
        ran = [r for r in results if r.completion is not None]
        rest = [r for r in results if r.completion is None]
        assert len(ran) == 40 and len(rest) == 60 and len(results) == 100
        assert all(r.retry and r.error.error_class == kind for r in rest)


async def test_record_errors_map_as_online_and_too_few_records_fail_the_job():
    async with await start_server(SimConfig(batch_line_errors=1.0)) as srv:
        bedrock = provider(srv.root_url)
        await bedrock.start()
        try:
            batches = bedrock.batches()
            broken = await batches.results(await batches.submit(MODEL, batch_lines(100), label=label()))
            small = await batches.submit(MODEL, batch_lines(5, "t"), label=label("e" * 32))
            status = await batches.status(small)
            refused = await batches.results(small)
            bad = batches._record(MODEL, {"recordId": "x1", "error": {"errorCode": 400, "errorMessage": "bad"}})
        finally:
            await bedrock.aclose()
    assert all(r.retry and r.error.status == 500 and "server error" in str(r.error) for r in broken)
    assert status.provider_state == "Failed"
    assert len(refused) == 5 and all(not r.retry and "minimum of 100" in str(r.error) for r in refused)
    assert isinstance(bad.error, BadRequest) and not bad.retry and "bad" in str(bad.error)


async def test_a_missing_object_names_the_setting_and_a_missing_job_is_said_so():
    async with await start_server() as srv:
        bedrock = provider(srv.root_url)
        await bedrock.start()
        try:
            batches = bedrock.batches()
            with pytest.raises(ModelSetupError, match="batch_folder"):
                await batches.files.get("runner-batches", "tests/inputs/none.jsonl")
            with pytest.raises(BadRequest, match="no batch inference job"):
                await batches.status("arn:aws:bedrock:us-east-1:000000000000:model-invocation-job/abcdefabcdef")
        finally:
            await bedrock.aclose()


# -- staging against a server this project did not write --------------------------------------------------------


async def test_s3_staging_puts_lists_gets_and_deletes_on_motos_server():
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        from runner.providers.answer_bounds import bounds_of
        from runner.providers.bounded_boto import bound_client

        bounds = bounds_of(ProviderSettings())  # every answer read by the bounded path, against moto's server
        client = bound_client(boto3.Session().client("s3", region_name="us-east-1",
                                                     endpoint_url=f"http://127.0.0.1:{port}"), bounds)
        client.create_bucket(Bucket="staging")
        bedrock = provider("http://127.0.0.1:1")
        files = S3Files(client, None, lambda: bedrock.map_errors("s3"), bounds)
        for i in range(3):
            await files.put("staging", f"runs/inputs/{i}.jsonl", f'{{"recordId": "r{i}"}}\n'.encode())
        await files.put("staging", "elsewhere/x.jsonl", b"{}\n")
        listed = await files.keys("staging", "runs/")
        read = await files.get("staging", "runs/inputs/1.jsonl")
        await files.delete("staging", "runs/inputs/1.jsonl")
        after = await files.keys("staging", "runs/")
        client.close()
    finally:
        moto.stop()
    assert listed == [f"runs/inputs/{i}.jsonl" for i in range(3)]
    assert read == b'{"recordId": "r1"}\n'
    assert after == ["runs/inputs/0.jsonl", "runs/inputs/2.jsonl"]


# -- whole runs ------------------------------------------------------------------------------------------------


def write_job(folder: Path, url: str, *, mode: str, rows: int = ROWS, name: str = "bedrockjob",
              batch: bool = True, prices: dict | None = None, **extra: object) -> Path:
    dataset = write_rows(folder / f"{name}.jsonl", rows)
    settings: dict[str, object] = {"base_url": url, "timeout": 10}
    if batch:
        settings.update(batch_folder=FOLDER, batch_role_arn=ROLE)
    job = {
        "name": name, "output_dir": str(folder / "results"), "models": [f"bedrock:{MODEL}"],
        "providers": {"bedrock": settings}, "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 60},
        "prices": {f"bedrock:{MODEL}": prices or PRICES}, "mode": mode,
        "batch": {"poll_interval": 0.05, "max_requests": 1000},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": "Answer with one letter.",
                               "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}],
        **extra,
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def answers(path: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return sorted((str(row["id"]), row["response"]) for row in rows)


async def test_a_batch_run_answers_as_online_at_the_batch_price_and_a_second_run_from_the_memo(tmp_path):
    (tmp_path / "online").mkdir()
    (tmp_path / "batch").mkdir()
    async with await start_server(SimConfig(batch_delay=0.2)) as srv:
        online = await execute(load_job(write_job(tmp_path / "online", srv.root_url, mode="online")),
                               open_store(tmp_path / "online" / "s.sqlite"))
        before = srv.stats()["received"]
        path = write_job(tmp_path / "batch", srv.root_url, mode="batch")
        store = open_store(tmp_path / "batch" / "s.sqlite")
        batched = await execute(load_job(path), store)
        after_first = srv.stats()
        again = await execute(load_job(path), store)
        after_second = srv.stats()
    assert online.status == batched.status == again.status == "completed", batched.message
    assert after_first["batches"] == 1 and after_first["batch_lines"] == ROWS
    assert after_first["received"] == before, "nothing was sent online"
    assert answers(batched.results["mc"]) == answers(online.results["mc"])
    rows = store.responses()
    assert len(rows) == ROWS
    for row in rows:
        expected = (row["input_tokens"] * PRICES["batch_input"] + row["output_tokens"] * PRICES["batch_output"]) / 1e6
        assert row["cost"] == pytest.approx(expected) and row["cost"] > 0
    assert report.build(store, batched.run_id)["totals"]["batched"] == ROWS
    assert after_second["batches"] == 1 and after_second["received"] == before, "the second run was the memo's"
    assert report.build(store, again.run_id)["totals"]["cache_hits"] == ROWS


async def test_a_budget_stops_a_batch_run_within_it(tmp_path):
    # one output token a request at 10,000 USD a million batch tokens: each request's worst case and cost is 0.01
    # USD, so 150 fit in the budget; the first job takes them, the 150 left are over it
    prices = {"input": 0.0, "output": 20000.0, "batch_input": 0.0, "batch_output": 10000.0}
    async with await start_server() as srv:
        path = write_job(tmp_path, srv.root_url, mode="batch", rows=300, prices=prices, budget={"usd": 1.5},
                         params={"temperature": 0, "max_tokens": 1})
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        stats = srv.stats()
    spent = sum(row["amount"] for row in store.ledger(outcome.run_id, kind="charge"))
    assert outcome.status == "budget_exhausted", outcome.message
    assert spent == pytest.approx(1.5) and stats["batches"] == 1 and stats["batch_lines"] == 150
    assert stats["received"] == 0 and len(store.tasks(outcome.run_id, status="done")) == 150


async def test_a_stage_too_small_for_a_job_goes_online_with_a_note(tmp_path):
    async with await start_server() as srv:
        outcome = await execute(load_job(write_job(tmp_path, srv.root_url, mode="batch", rows=30)),
                                open_store(tmp_path / "s.sqlite"))
        stats = srv.stats()
    assert outcome.status == "completed", outcome.message
    assert stats["received"] == 30 and "batches" not in stats
    assert any("30 requests" in note and "at least 100" in note for note in outcome.stats.notes)


async def test_mode_auto_without_the_settings_goes_online(tmp_path):
    async with await start_server() as srv:
        outcome = await execute(load_job(write_job(tmp_path, srv.root_url, mode="auto", batch=False)),
                                open_store(tmp_path / "s.sqlite"))
        stats = srv.stats()
    assert outcome.status == "completed" and stats["received"] == ROWS and "batches" not in stats


def test_mode_batch_without_the_settings_is_one_sentence_and_sends_nothing(tmp_path, sim_server, monkeypatch,
                                                                             capsys):
    root = sim_server.removesuffix("/v1")
    path = write_job(tmp_path, root, mode="batch", batch=False)
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"))
    last = err.strip().splitlines()[-1]  # after the warning that no budget is set
    assert code != 0 and last.startswith("Error: ") and f"bedrock:{MODEL} in mode: batch" in last
    assert "batch_folder: s3://BUCKET/PREFIX, batch_role_arn:" in last
    assert "(batch_folder and batch_role_arn missing)" in last
    stats = sim_stats(sim_server)
    assert stats["received"] == 0 and "batches" not in stats


# -- kill -9 and resume ----------------------------------------------------------------------------------------


def _set_delay(sim_server: str, seconds: float) -> None:
    request = urllib.request.Request(sim_server.removesuffix("/v1") + "/sim/config",
                                     data=json.dumps({"batch_delay": seconds}).encode(), method="POST")
    urllib.request.urlopen(request, timeout=5).read()


def _submitted(db: Path) -> bool:
    """Whether a batch of the run has the provider's id in the store (Bedrock accepted it, the store knows)."""
    store = open_store(db)
    try:
        return any(batch["provider_batch_id"] for run in store.list_runs() for batch in store.batches(run["id"]))
    finally:
        store.close()


def _resume(tmp_path: Path, db: Path) -> str:
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    store.close()
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout
    return run_id


def _done(db: Path, run_id: str) -> tuple[int, int]:
    store = open_store(db)
    try:
        return len(store.tasks(run_id, status="done")), report.build(store, run_id)["totals"]["batched"]
    finally:
        store.close()


@pytest.mark.slow  # a provider's batch killed and resumed (the engine's stays in the fast path): 4 s
def test_a_batch_run_killed_while_polling_resumes_without_submitting_twice(tmp_path, sim_server):
    _set_delay(sim_server, 2.0)
    job = write_job(tmp_path, sim_server.removesuffix("/v1"), mode="batch")
    db = tmp_path / "s.sqlite"
    open_store(db).close()
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not _submitted(db):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no batch was submitted"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = _resume(tmp_path, db)
    stats = sim_stats(sim_server)
    assert stats["batches"] == 1 and stats["batch_lines"] == ROWS and not stats["completed_by_digest"]
    assert _done(db, run_id) == (ROWS, ROWS)


#: `runner ARGS` whose Bedrock batch client dies right after Bedrock accepted a job (before the store records it)
KILLED_AFTER_SUBMIT = killed_after_submit("bedrock_batch.BedrockBatches")


@pytest.mark.slow  # a provider's batch killed and resumed (the engine's stays in the fast path): 3.5 s
def test_a_job_accepted_but_not_recorded_is_found_by_its_name_and_adopted(tmp_path, sim_server):
    job = write_job(tmp_path, sim_server.removesuffix("/v1"), mode="batch")
    db = tmp_path / "s.sqlite"
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_SUBMIT, "submit", str(job), "--db", str(db)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    store = open_store(db)
    intents = store.batches(store.list_runs()[0]["id"])
    store.close()
    assert len(intents) == 1 and not intents[0]["provider_batch_id"], "only the intent was recorded"
    run_id = _resume(tmp_path, db)
    stats = sim_stats(sim_server)
    assert stats["batches"] == 1 and stats["batch_lines"] == ROWS, "the job was adopted, not submitted again"
    assert _done(db, run_id) == (ROWS, ROWS)
