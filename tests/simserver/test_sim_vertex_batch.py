"""The simulated server's Vertex AI batch prediction and the Cloud Storage subset it reads and writes, through the
official SDKs (google-genai in Vertex mode, google-cloud-storage) with an access token the server issued: objects
written, listed, read and deleted; jobs created, got, listed by filter and cancelled; each line answered as its
online route answers it, refusals as Vertex refuses them; the batch counters in /sim/stats."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from google.cloud import storage
from google.genai import errors as genai_errors
from google.genai import types
from google.oauth2.credentials import Credentials

from simserver import SimServer, start_server
from simserver.batch_vertex import parse_filter
from simserver.gcs import objects_of
from simserver.vertex import issue_token
from tests.simserver.test_sim_vertex import LOCATION, PROJECT, gemini_client

BUCKET = "sim-bucket"
GEMINI_LINE = {"request": {"contents": [{"role": "user", "parts": [{"text": "Which is a fruit?"}]}],
                           "generationConfig": {"maxOutputTokens": 5}}}
CLAUDE_LINE = {"custom_id": "q1", "request": {"messages": [{"role": "user", "content": "Which is a fruit?"}],
                                              "max_tokens": 5, "anthropic_version": "vertex-2023-10-16"}}


@pytest.fixture
async def srv():
    async with await start_server() as server:
        yield server


def token() -> Credentials:
    return Credentials(token=issue_token())


def gcs(srv: SimServer) -> storage.Client:
    return storage.Client(project=PROJECT, credentials=token(), client_options={"api_endpoint": srv.root_url})


def put(srv: SimServer, name: str, rows: list[object]) -> str:
    data = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    objects_of(srv).put(BUCKET, name, data.encode(), "application/jsonl")
    return f"gs://{BUCKET}/{name}"


def output_rows(srv: SimServer, job) -> list[dict]:
    directory = job.output_info.gcs_output_directory
    assert directory.startswith(f"gs://{BUCKET}/out/prediction-model-")
    name = directory.removeprefix(f"gs://{BUCKET}/") + "/predictions.jsonl"
    return [json.loads(row) for row in objects_of(srv).get(BUCKET, name).data.splitlines()]


async def create(srv: SimServer, model: str, src: str, name: str = "job"):
    client = gemini_client(srv, token())
    return client, await client.aio.batches.create(model=model, src=src, config={"dest": f"gs://{BUCKET}/out",
                                                                                   "display_name": name})


async def test_cloud_storage_takes_uploads_lists_reads_and_deletes_through_its_sdk(srv: SimServer):
    def work() -> tuple:
        bucket = gcs(srv).bucket(BUCKET)
        bucket.blob("a/one.jsonl").upload_from_string(b"1\n", content_type="application/jsonl")
        bucket.blob("a/two.jsonl").upload_from_string(b"2" * (9 * 1024 * 1024))  # over 8 MB: a resumable upload
        bucket.blob("b/three.jsonl").upload_from_string(b"3\n")
        listed = [b.name for b in gcs(srv).list_blobs(BUCKET, prefix="a/", max_results=1, page_size=1)]
        paged = [b.name for b in gcs(srv).list_blobs(BUCKET, page_size=1)]
        meta = bucket.get_blob("a/one.jsonl")
        read = bucket.blob("a/two.jsonl").download_as_bytes()
        bucket.blob("a/one.jsonl").delete()
        return listed, paged, meta, read, bucket.get_blob("a/one.jsonl")

    listed, paged, meta, read, gone = await asyncio.to_thread(work)
    assert listed == ["a/one.jsonl"] and paged == ["a/one.jsonl", "a/two.jsonl", "b/three.jsonl"]
    assert meta.size == 2 and meta.content_type == "application/jsonl" and meta.md5_hash
    assert read == b"2" * (9 * 1024 * 1024) and gone is None


async def test_cloud_storage_takes_only_a_token_the_server_issued(srv: SimServer):
    url = f"{srv.root_url}/storage/v1/b/{BUCKET}/o"
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": "Bearer ya29.forged"}):
            async with session.get(url, headers=headers) as answer:
                assert answer.status == 401 and (await answer.json())["error"]["code"] == 401
        async with session.get(url, headers={"Authorization": f"Bearer {issue_token()}"}) as answer:
            assert answer.status == 200 and (await answer.json())["items"] == []


@pytest.mark.parametrize("model, line", [("gemini-2.0-flash", GEMINI_LINE),
                                         ("publishers/anthropic/models/claude-3-5-haiku@20241022", CLAUDE_LINE)])
async def test_a_job_answers_each_line_as_its_online_route_and_writes_the_output(srv: SimServer, model, line):
    src = put(srv, "in/input.jsonl", [line, "not json", {"no": "request"}])
    client, job = await create(srv, model, src)
    assert job.state == types.JobState.JOB_STATE_PENDING and job.name.startswith(
        f"projects/{PROJECT}/locations/{LOCATION}/batchPredictionJobs/")
    job = await client.aio.batches.get(name=job.name)
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.display_name == "job"
    assert (job.completion_stats.successful_count, job.completion_stats.failed_count) == (1, 2)
    rows = output_rows(srv, job)
    answered = [row for row in rows if not row["status"]]
    assert len(rows) == 3 and len(answered) == 1 and answered[0]["request"] == line["request"]
    if "custom_id" in line:
        assert answered[0]["custom_id"] == "q1"
    online_url = (f"{srv.root_url}/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/"
                  + ("anthropic/models/claude-3-5-haiku@20241022:rawPredict" if "custom_id" in line
                     else "google/models/gemini-2.0-flash:generateContent"))
    async with aiohttp.ClientSession() as session, session.post(
            online_url, json=line["request"], headers={"Authorization": f"Bearer {issue_token()}"}) as answer:
        online = await answer.json()
    text = (lambda r: r["content"][0]["text"]) if "custom_id" in line else \
        (lambda r: r["candidates"][0]["content"]["parts"][0]["text"])
    assert text(answered[0]["response"]) == text(online)
    for row in rows:
        if row["status"]:
            assert row["status"].startswith("Bad Request: ")
            error = json.loads(row["status"].removeprefix("Bad Request: "))["error"]
            assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    stats = srv.stats()
    assert stats["batches"] == 1 and stats["batch_lines"] == 3 and len(stats["batch_completed_by_digest"]) == 1
    assert stats["batch_results"] == {"succeeded": 1, "errored": 2, "expired": 0, "canceled": 0}


async def test_a_line_the_online_route_refuses_strictly_is_an_errored_line(srv: SimServer):
    srv.configure(strict=True)
    bad = {"request": {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                       "generationConfig": {"temprature": 0}}}
    client, job = await create(srv, "gemini-2.0-flash", put(srv, "in/strict.jsonl", [bad]))
    job = await client.aio.batches.get(name=job.name)
    [row] = output_rows(srv, job)
    assert 'Unknown name \\"temprature\\"' in row["status"] or 'Unknown name "temprature"' in row["status"]


async def test_a_gemini_line_may_carry_vertex_labels_of_vertex_form(srv: SimServer):
    good = {"request": {**GEMINI_LINE["request"], "labels": {"runner_line": "0", "team": ""}}}
    bad = {"request": {**GEMINI_LINE["request"], "labels": {"Runner Line": "0"}}}
    client, job = await create(srv, "gemini-2.0-flash", put(srv, "in/labels.jsonl", [good, bad]))
    rows = {json.dumps(row["request"]["labels"]): row for row in output_rows(srv, await client.aio.batches.get(
        name=job.name))}
    assert rows[json.dumps(good["request"]["labels"])]["status"] == ""
    assert "GenerateContentRequest.labels" in rows[json.dumps(bad["request"]["labels"])]["status"]


async def test_the_job_refuses_what_vertex_refuses(srv: SimServer):
    srv.configure(models="gemini-2.0-flash")
    client = gemini_client(srv, token())
    with pytest.raises(genai_errors.ClientError) as missing:
        await client.aio.batches.create(model="gemini-2.0-flash", src=f"gs://{BUCKET}/nowhere.jsonl",
                                        config={"dest": f"gs://{BUCKET}/out"})
    assert missing.value.code == 400 and "nowhere.jsonl" in missing.value.message
    src = put(srv, "in/input.jsonl", [GEMINI_LINE])
    with pytest.raises(genai_errors.ClientError) as unknown:
        await client.aio.batches.create(model="gemini-9-pro", src=src, config={"dest": f"gs://{BUCKET}/out"})
    assert unknown.value.code == 404 and "gemini-9-pro" in unknown.value.message
    url = f"{srv.root_url}/v1/projects/{PROJECT}/locations/{LOCATION}/batchPredictionJobs"
    body = {"model": "publishers/google/models/gemini-2.0-flash",
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [src]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": "s3://x"}}}
    async with aiohttp.ClientSession() as session, session.post(
            url, json=body, headers={"Authorization": f"Bearer {issue_token()}"}) as answer:
        assert answer.status == 400 and "outputUriPrefix" in (await answer.json())["error"]["message"]
    assert "batches" not in srv.stats()


async def test_jobs_are_listed_by_filter_and_page(srv: SimServer):
    src = put(srv, "in/input.jsonl", [GEMINI_LINE])
    client = gemini_client(srv, token())
    names = []
    for label in ("run/a r0 #1", "run/b r0 #2", "run/a r0 #1"):
        job = await client.aio.batches.create(model="gemini-2.0-flash", src=src,
                                              config={"dest": f"gs://{BUCKET}/out", "display_name": label})
        names.append(job.name)

    async def listed(**config) -> list[str]:
        return [job.name async for job in await client.aio.batches.list(config=config)]

    assert await listed(page_size=1) == names[::-1], "newest first, one page at a time"
    assert await listed(filter='display_name="run/a r0 #1"') == [names[2], names[0]]
    assert await listed(filter='display_name="run/a r0 #1" AND create_time>="2000-01-01T00:00:00Z"') == \
        [names[2], names[0]]
    assert await listed(filter='create_time<"2000-01-01T00:00:00Z"') == []
    with pytest.raises(genai_errors.ClientError) as refused:
        await listed(filter='state="JOB_STATE_RUNNING"')
    assert refused.value.code == 400
    assert parse_filter('display_name = "a \\" b"') == [("display_name", "=", 'a " b')]


async def test_a_cancel_and_an_expiry_leave_the_unfinished_lines_out_of_the_output(srv: SimServer):
    srv.configure(batch_delay=1.0)
    now = [1000.0]
    srv.clock = lambda: now[0]  # the server's clock, stepped: lines 0 and 1 are done at 0.25 and 0.5 s, 2 at 0.75 s
    src = put(srv, "in/input.jsonl", [{"request": {**GEMINI_LINE["request"],
                                                   "contents": [{"role": "user", "parts": [{"text": f"q{i}"}]}]}}
                                      for i in range(4)])
    client, job = await create(srv, "gemini-2.0-flash", src)
    _, other = await create(srv, "gemini-2.0-flash", src, name="other")
    now[0] += 0.6
    await client.aio.batches.cancel(name=job.name)
    cancelled = await client.aio.batches.get(name=job.name)
    assert cancelled.state == types.JobState.JOB_STATE_CANCELLED
    assert len(output_rows(srv, cancelled)) == 2 and cancelled.completion_stats.incomplete_count == 2
    with pytest.raises(genai_errors.ClientError) as again:
        await client.aio.batches.cancel(name=job.name)
    assert again.value.code == 400 and again.value.status == "FAILED_PRECONDITION"
    assert srv.expire_batch(other.name.rpartition("/")[2])
    expired = await client.aio.batches.get(name=other.name)
    assert expired.state == types.JobState.JOB_STATE_EXPIRED and len(output_rows(srv, expired)) == 2
    assert srv.stats()["batch_results"] == {"succeeded": 4, "errored": 0, "expired": 2, "canceled": 2}
