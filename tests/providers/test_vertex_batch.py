"""Vertex AI batch prediction (``vertex:`` in ``mode: batch``) through google-genai's batches in Vertex mode and
google-cloud-storage, against the simulated server: the client (submit, status, results by custom id, find, cancel,
expired and failed lines), the Cloud Storage staging against gcp-storage-emulator (a server this project did not
write), whole runs (the batch price, the memo, a budget), kill -9 while polling then resume, an intent adopted by its
label, and ``mode: batch`` without a folder.

No test reaches Google: the credentials are a service-account key file whose ``token_uri`` is the simulated
server's ``/token`` (tests/providers/test_vertex.py's fixtures), and every connection must go to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import BadRequest, ModelSetupError, TransientError
from runner.providers.answer_bounds import AnswerBounds
from runner.providers.base import ProviderSettings
from runner.providers.batching import CANCELLED, EXPIRED, BatchLine
from runner.providers.gcs_files import Staging, parse_folder
from runner.providers.pricing import Pricing
from runner.providers.vertex import VertexProvider
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server
from simserver.gcs import objects_of
from tests.helpers import killed_after_submit, one_error, run_cli, runner_cmd, sim_stats, write_rows
from tests.providers.test_vertex import CLOUD_VARIABLES, _local_only, credentials_file, private_key  # noqa: F401

GEMINI = "gemini-2.0-flash"
CLAUDE = "claude-3-5-haiku@20241022"
FOLDER = "gs://runner-batches/runs"
#: USD per million tokens; genai-prices has no batch price for these on Vertex, so the job gives one (half)
PRICES = {"input": 2000.0, "output": 8000.0, "batch_input": 1000.0, "batch_output": 4000.0}
ROWS = 12


@pytest.fixture
async def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_key: str):  # noqa: F811
    async with await start_server(SimConfig(batch_delay=0.2)) as server:
        path = credentials_file(tmp_path, server.root_url + "/token", private_key)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
        yield server


async def started(server: SimServer, **options: object) -> VertexProvider:
    provider = VertexProvider(ProviderSettings.model_validate(
        {"base_url": server.root_url, "timeout": 5, "project": "sim-project", "location": "us-east5",
         "batch_folder": FOLDER, **options}))
    await provider.start()
    return provider


def lines_of(n: int, **params: object) -> list[BatchLine]:
    return [BatchLine(f"c{i}", [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": f"question {i}"}], {"max_tokens": 5, **params})
            for i in range(n)]


# -- the client ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
async def test_the_client_submits_finds_and_reads_results_by_custom_id_as_online(srv: SimServer, model: str):
    vertex = await started(srv)
    try:
        batches = vertex.batches()
        lines = lines_of(5)
        since = time.time()
        label = f"run/mc/vertex:{model} r0 #0123456789abcdef"
        batch_id = await batches.submit(model, lines, label=label)
        assert batch_id.startswith("projects/sim-project/locations/us-east5/batchPredictionJobs/")
        assert (await batches.status(batch_id)).state == "running"
        with pytest.raises(BadRequest, match="has not ended"):
            await batches.results(batch_id)
        assert (await batches.find(label, [], since=since)).batch_id == batch_id
        assert (await batches.find(label, [], since=since, known=[batch_id])).batch_id is None
        assert (await batches.find(label.replace("r0", "r1"), [], since=since)).batch_id is None
        await asyncio.sleep(0.25)
        status = await batches.status(batch_id)
        results = await batches.results(batch_id)
        online = [await vertex.execute(model, line.messages, line.params) for line in lines]
    finally:
        await vertex.aclose()
    assert (status.state, status.provider_state, status.total, status.succeeded) == \
        ("ended", "JOB_STATE_SUCCEEDED", 5, 5)
    assert [r.custom_id for r in results] == [line.custom_id for line in lines]
    assert [r.completion.text for r in results if r.completion] == [c.text for c in online]
    assert all(r.completion.input_tokens > 0 for r in results if r.completion)
    # the staged input is one object under the folder, named by the label's digest; the output is read back
    names = sorted(name for _, name in objects_of(srv).objects)
    assert names[:2] == ["runs/0123456789abcdef/custom_ids.json", "runs/0123456789abcdef/input.jsonl"]
    assert names[2].startswith("runs/0123456789abcdef/output/prediction-model-")
    output = [json.loads(row) for row in objects_of(srv).get("runner-batches", names[2]).data.splitlines()]
    assert len(output) == 5


def _snake(value):
    """``value`` re-encoded as a protobuf echo may be: snake_case keys, floats as float32 prints them."""
    import re
    import struct

    if isinstance(value, dict):
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    if isinstance(value, float):
        return struct.unpack("f", struct.pack("f", value))[0]
    return value


@pytest.mark.parametrize("echo", ["reordered", "unlabelled"])
async def test_an_output_in_another_order_is_matched_by_its_label_or_its_echoed_request(srv: SimServer, echo: str):
    vertex = await started(srv)
    try:
        batches = vertex.batches()
        lines = lines_of(8, temperature=0.7)
        batch_id = await batches.submit(GEMINI, lines, label="run/mc/g r0 #aaaa")
        await asyncio.sleep(0.25)
        await batches.status(batch_id)
        [(key, stored)] = [(k, o) for k, o in objects_of(srv).objects.items() if "/output/" in k[1]]
        rows = [json.loads(row) for row in stored.data.splitlines()][::-1]  # the order Vertex does not promise
        assert all(row["request"]["labels"]["runner_line"].isdigit() for row in rows)
        if echo == "unlabelled":  # an echo without the label, re-encoded: matched by the request itself
            rows = [{**row, "request": _snake({k: v for k, v in row["request"].items() if k != "labels"})}
                    for row in rows]
            assert rows[0]["request"]["generation_config"]["temperature"] != 0.7
        objects_of(srv).put(*key, "".join(json.dumps(row) + "\n" for row in rows).encode())
        results = await batches.results(batch_id)
        online = [await vertex.execute(GEMINI, line.messages, line.params) for line in lines]
    finally:
        await vertex.aclose()
    assert [r.custom_id for r in results] == [line.custom_id for line in lines]
    assert [r.completion.text for r in results if r.completion] == [c.text for c in online]


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
async def test_refused_failed_and_expired_lines_map_as_online(srv: SimServer, model: str):
    srv.configure(batch_expire=0.3, batch_line_errors=0.3)
    vertex = await started(srv)
    try:
        batches = vertex.batches()
        lines = lines_of(16)
        # what the online route refuses: Gemini takes at most 5 stop sequences, Claude a conversation of one message
        refused = BatchLine("refused", [{"role": "user", "content": "x"}], {"max_tokens": 5, "stop": ["a"] * 9}) \
            if model == GEMINI else BatchLine("refused", [{"role": "system", "content": "no question"}], {})
        lines.append(refused)
        batch_id = await batches.submit(model, lines, label="run/mc/m r0 #bbbb")
        await asyncio.sleep(0.25)
        status = await batches.status(batch_id)
        results = {r.custom_id: r for r in await batches.results(batch_id)}
    finally:
        await vertex.aclose()
    counts = srv.stats()["batch_results"]
    assert status.provider_state == "JOB_STATE_EXPIRED" and counts["expired"] > 0 and counts["errored"] > 1
    expired = [r for r in results.values() if r.error is not None and r.error.error_class == EXPIRED]
    server_errors = [r for r in results.values() if isinstance(r.error, TransientError) and r.error.status == 500]
    assert len(expired) == counts["expired"] and all(r.retry for r in expired)
    assert server_errors and all(r.retry for r in server_errors)
    assert len(expired) + len(server_errors) + 1 + counts["succeeded"] == 17
    refused = results["refused"]
    assert isinstance(refused.error, BadRequest) and not refused.retry and refused.error.status == 400
    assert ("stop_sequences" if model == GEMINI else "messages") in str(refused.error), refused.error


async def test_a_cancel_keeps_the_finished_lines_and_the_rest_go_again(srv: SimServer):
    srv.configure(batch_delay=1.0)
    now = [1000.0]
    srv.clock = lambda: now[0]  # the server's clock, stepped: lines 0 and 1 are done at 0.25 and 0.5 s, 2 at 0.75 s
    vertex = await started(srv)
    try:
        batches = vertex.batches()
        batch_id = await batches.submit(GEMINI, lines_of(4), label="run/mc/g r0 #cccc")
        now[0] += 0.6
        await batches.cancel(batch_id)
        await batches.cancel(batch_id)  # idempotent once it ended
        status = await batches.status(batch_id)
        results = await batches.results(batch_id)
    finally:
        await vertex.aclose()
    assert status.provider_state == "JOB_STATE_CANCELLED"
    assert [r.completion is not None for r in results] == [True, True, False, False]
    assert all(r.retry and r.error.error_class == CANCELLED for r in results[2:])


async def test_a_refused_job_is_one_error_naming_what_vertex_said(srv: SimServer):
    srv.configure(models="gemini-2.0-flash")
    vertex = await started(srv)
    try:
        with pytest.raises(BadRequest, match="not found"):
            await vertex.batches().submit("gemini-9-unknown", lines_of(1), label="run/mc/x r0 #dddd")
    finally:
        await vertex.aclose()


async def test_a_group_is_cut_within_the_lines_and_bytes_a_job_takes(srv: SimServer, monkeypatch):
    from runner.providers import vertex_batch

    vertex = await started(srv)
    try:
        batches = vertex.batches()
        lines = lines_of(5)
        assert batches.chunks(GEMINI, lines) == [lines]
        monkeypatch.setattr(vertex_batch, "MAX_LINES", 2)
        assert [len(part) for part in batches.chunks(GEMINI, lines)] == [2, 2, 1]
        monkeypatch.setattr(vertex_batch, "MAX_LINES", 200_000)
        one = len(batches.jsonl(CLAUDE, lines[:1])[0])
        monkeypatch.setattr(vertex_batch, "MAX_BYTES", one * 3)
        assert [len(part) for part in batches.chunks(CLAUDE, lines)] == [3, 2]
    finally:
        await vertex.aclose()


def test_a_batch_folder_is_a_gs_uri_or_one_sentence():
    with pytest.raises(ModelSetupError, match="batch_folder must be a Cloud Storage folder written gs://BUCKET/"):
        VertexProvider(ProviderSettings.model_validate({"batch_folder": "s3://bucket/runs"}))
    folder = parse_folder("gs://bucket/runs/2026/")
    assert (folder.bucket, folder.prefix, folder.uri("d", "input.jsonl")) == \
        ("bucket", "runs/2026", "gs://bucket/runs/2026/d/input.jsonl")


# -- the staging, against a Cloud Storage server this project did not write -------------------------------------

@pytest.fixture
def emulator():
    from gcp_storage_emulator.server import create_server

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="staging")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


async def test_the_staging_uploads_lists_downloads_and_deletes_on_gcp_storage_emulator(emulator: str):
    from google.auth.credentials import AnonymousCredentials

    staging = Staging(parse_folder("gs://staging/runs"), project="p", credentials=AnonymousCredentials(),
                      endpoint=emulator, timeout=10, where="vertex at emulator")
    big = b'{"request": {}}\n' * 600_000  # 9.6 MB: over the SDK's 8 MB, a resumable upload
    uri = await staging.upload(staging.folder.name("d1", "input.jsonl"), b'{"request": {"a": 1}}\n')
    other = await staging.upload(staging.folder.name("d1", "big.jsonl"), big)
    await staging.upload(staging.folder.name("d2", "input.jsonl"), b"x")
    assert uri == "gs://staging/runs/d1/input.jsonl"
    assert await staging.list("gs://staging/runs/d1/") == [other, uri]
    assert await staging.download(uri) == b'{"request": {"a": 1}}\n'
    assert await staging.download(other) == big
    await staging.delete(uri)
    await staging.delete(uri)  # gone already: nothing to do
    assert await staging.list("gs://staging/runs/d1/") == [other]
    with pytest.raises(BadRequest, match="set providers.vertex.batch_folder"):
        await staging.download(uri)
    await staging.check()
    # a download larger than its bound fails at the bound, as every answer does (answer_bounds.py)
    bounded = Staging(parse_folder("gs://staging/runs"), project="p", credentials=AnonymousCredentials(),
                      endpoint=emulator, timeout=10, where="vertex at emulator",
                      bounds=AnswerBounds(answer_bytes=1 << 20, download_bytes=1 << 20, total_seconds=60))
    with pytest.raises(TransientError, match=r"larger than 1 MiB \(max_download_mb\)") as caught:
        await bounded.download(other)
    assert caught.value.error_class == "answer_too_large"
    bounded.close()
    missing = Staging(parse_folder("gs://no-such-bucket/runs"), project="p", credentials=AnonymousCredentials(),
                      endpoint=emulator, timeout=10, where="vertex at emulator")
    with pytest.raises(BadRequest, match="no gs://no-such-bucket/runs .*set providers.vertex.batch_folder"):
        await missing.check()


async def test_the_staging_against_the_simulated_server_needs_its_token(srv: SimServer):
    from google.oauth2.credentials import Credentials

    from runner.errors import AuthError

    vertex = await started(srv)
    try:
        staging = vertex.batches().staging
        big = b"0123456789" * 1_000_000  # 10 MB: the SDK's resumable upload
        uri = await staging.upload("runs/big.bin", big)
        assert await staging.download(uri) == big and await staging.list("gs://runner-batches/") == [uri]
        await vertex.probe(GEMINI)  # the model lookup, then one list call of the folder
    finally:
        await vertex.aclose()
    stranger = Staging(parse_folder(FOLDER), project="p", credentials=Credentials(token="ya29.not-from-this-server"),
                       endpoint=srv.root_url, timeout=5, where="vertex")
    with pytest.raises(AuthError, match="refused the credentials"):
        await stranger.list(FOLDER + "/")


# -- whole runs --------------------------------------------------------------------------------------------

def write_job(folder: Path, root: str, *, mode: str, name: str = "vjob", rows: int = ROWS,
              models: tuple[str, ...] = (GEMINI, CLAUDE), batch_folder: str | None = FOLDER,
              **extra: object) -> Path:
    dataset = write_rows(folder / f"{name}.jsonl", rows)
    settings: dict[str, object] = {"base_url": root, "timeout": 10, "project": "sim-project", "location": "us-east5"}
    if batch_folder:
        settings["batch_folder"] = batch_folder
    job = {
        "name": name, "output_dir": str(folder / "results"), "models": [f"vertex:{m}" for m in models],
        "providers": {"vertex": settings}, "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 60},
        "prices": {f"vertex:{m}": PRICES for m in models}, "mode": mode,
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


def answers(path: Path) -> list[tuple[str, str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return sorted((row["model"], str(row["id"]), row["response"]) for row in rows)


async def test_a_batch_run_answers_as_online_at_the_batch_price_and_a_second_run_is_memo(tmp_path, srv: SimServer):
    (tmp_path / "online").mkdir()
    (tmp_path / "batch").mkdir()
    online_store = open_store(tmp_path / "online" / "s.sqlite")
    online = await execute(load_job(write_job(tmp_path / "online", srv.root_url, mode="online")), online_store)
    online_cost = report.build(online_store, online.run_id)["totals"]["cost"]
    received = srv.stats()["received"]
    store = open_store(tmp_path / "batch" / "s.sqlite")
    job = load_job(write_job(tmp_path / "batch", srv.root_url, mode="batch"))
    batched = await execute(job, store)
    assert online.status == batched.status == "completed", batched.message
    stats = srv.stats()
    assert stats["batches"] == 2 and stats["batch_lines"] == 2 * ROWS, "one job a model"
    assert stats["received"] == received, "nothing went online"
    assert answers(batched.results["mc"]) == answers(online.results["mc"])
    totals = report.build(store, batched.run_id)["totals"]
    assert totals["batched"] == 2 * ROWS and totals["done"] == 2 * ROWS and totals["failed"] == 0
    assert Pricing(job).batch_rates(f"vertex:{GEMINI}").source.endswith("(batch)")
    assert online_cost > 0 and totals["cost"] == pytest.approx(online_cost / 2)
    assert totals["ledger_charged"] == pytest.approx(totals["cost"])

    again = await execute(job, store)
    assert again.status == "completed"
    assert srv.stats()["batches"] == 2, "the memo answered the second run"
    assert report.build(store, again.run_id)["totals"]["cache_hits"] == 2 * ROWS


async def test_a_budget_stops_a_batch_run_within_it(tmp_path, srv: SimServer):
    job = load_job(write_job(tmp_path, srv.root_url, mode="batch", rows=40, models=(GEMINI,),
                             budget={"usd": 1.0}, batch={"poll_interval": 0.05, "max_requests": 10}))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    spent = sum(row["amount"] for row in store.ledger(outcome.run_id, kind="charge"))
    assert outcome.status == "budget_exhausted", outcome.message
    assert 0 < spent <= 1.0 + 1e-9
    assert 0 < srv.stats()["batch_lines"] < 40


async def test_mode_auto_without_a_folder_sends_online(tmp_path, srv: SimServer):
    job = load_job(write_job(tmp_path, srv.root_url, mode="auto", models=(GEMINI,), batch_folder=None))
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert outcome.status == "completed"
    stats = srv.stats()
    assert stats["by_route"]["vertex-gemini"] == ROWS and "batches" not in stats


def test_mode_batch_without_a_folder_is_one_sentence_and_sends_nothing(tmp_path, monkeypatch, capsys, sim_server):
    root = sim_server.removesuffix("/v1")
    path = write_job(tmp_path, root, mode="batch", models=(GEMINI,), batch_folder=None)
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"),
                           "--no-check")
    assert code != 0
    error = one_error(err)
    assert "mode: batch" in error and f"vertex:{GEMINI}" in error
    stats = sim_stats(root)
    assert stats["received"] == 0 and "batches" not in stats


def test_mode_batch_without_a_folder_names_the_setting(tmp_path, monkeypatch, capsys):
    path = write_job(tmp_path, "http://127.0.0.1:1", mode="batch", models=(GEMINI,), batch_folder=None)
    _, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"), "--no-check")
    assert "set providers.vertex.batch_folder: gs://BUCKET/PREFIX" in one_error(err)


# -- kill -9 and resume ------------------------------------------------------------------------------------

def _configure(root: str, **config: object) -> None:
    import urllib.request

    request = urllib.request.Request(root + "/sim/config", data=json.dumps(config).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=5).read()


def _batches_recorded(db: Path) -> int:
    store = open_store(db)
    try:
        return sum(1 for run in store.list_runs() for b in store.batches(run["id"]) if b["provider_batch_id"])
    finally:
        store.close()


@pytest.fixture
def sub_env(tmp_path: Path, sim_server: str, private_key: str) -> dict[str, str]:  # noqa: F811
    root = sim_server.removesuffix("/v1")
    env = {k: v for k, v in os.environ.items() if k not in CLOUD_VARIABLES}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(credentials_file(tmp_path, root + "/token", private_key))
    env["CLOUDSDK_CONFIG"] = str(tmp_path / "gcloud")
    env["GCE_METADATA_HOST"] = "127.0.0.1:1"  # never a cloud machine's metadata server
    env["RUNNER_CHECK_TIMEOUT"] = "60"
    return env


@pytest.mark.slow  # a provider's batch killed and resumed (the engine's stays in the fast path): 5 s
def test_a_batch_run_killed_while_polling_resumes_without_submitting_twice(tmp_path, sim_server, sub_env):
    root = sim_server.removesuffix("/v1")
    _configure(root, batch_delay=2.0)
    job = write_job(tmp_path, root, mode="batch", models=(GEMINI,))
    db = tmp_path / "s.sqlite"
    open_store(db).close()
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path, env=sub_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while _batches_recorded(db) < 1:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "timed out waiting for the batch's id in the store"
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    assert not store.responses(), "killed before the batch ended"
    store.close()
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, env=sub_env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    stats = sim_stats(root)
    assert stats["batches"] == 1 and stats["batch_lines"] == ROWS and not stats["completed_by_digest"]
    store = open_store(db)
    assert len(store.tasks(run_id, status="done")) == ROWS
    assert report.build(store, run_id)["totals"]["batched"] == ROWS


#: `runner ARGS` whose Vertex batch client dies right after Vertex accepted a job (before the store records its id)
KILLED_AFTER_SUBMIT = killed_after_submit("vertex_batch.VertexBatches")


@pytest.mark.slow  # a provider's batch killed and resumed (the engine's stays in the fast path): 5 s
def test_a_job_accepted_but_not_recorded_is_found_by_its_label_and_adopted(tmp_path, sim_server, sub_env):
    root = sim_server.removesuffix("/v1")
    _configure(root, batch_delay=1.0)
    job = write_job(tmp_path, root, mode="batch", models=(CLAUDE,))
    db = tmp_path / "s.sqlite"
    open_store(db).close()
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_SUBMIT, "submit", str(job), "--db", str(db)],
                            cwd=tmp_path, env=sub_env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert sim_stats(root)["batches"] == 1
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    assert not any(b["provider_batch_id"] for b in store.batches(run_id)), "the store never heard of the job's id"
    store.close()
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, env=sub_env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout
    stats = sim_stats(root)
    assert stats["batches"] == 1 and stats["batch_lines"] == ROWS, "no line submitted twice"
    assert all(count == 1 for count in stats["batch_completed_by_digest"].values())
    store = open_store(db)
    assert len(store.tasks(run_id, status="done")) == ROWS
    [batch] = store.batches(run_id)
    assert batch["state"] == "collected" and batch["provider_batch_id"].startswith("projects/sim-project/")
    assert len(store.ledger(run_id, kind="charge")) == ROWS
