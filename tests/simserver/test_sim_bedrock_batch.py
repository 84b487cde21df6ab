"""The simulated server's Bedrock batch inference and S3 through boto3's ``bedrock`` and ``s3`` clients (raw HTTP where
botocore would refuse the request before sending it): jobs checked against botocore's bedrock service model, the same
clientRequestToken making one job, too few records failing the job, the output's layout and records, the list's
filters and pages, stop and expiry, and S3's objects, listings, errors and key check."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import botocore.exceptions
import pytest
import pytest_asyncio
from botocore.config import Config

from simserver import SimServer, start_server
from simserver.batch_bedrock import MIN_RECORDS
from tests.helpers import fresh, isolated_aws

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOVA = "amazon.nova-pro-v1:0"
ACCESS_KEY = "AKIDSIMULATEDBEDROCK"
ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"
BUCKET = "batches"
SIGNED = {"Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/us-east-1/bedrock/aws4_request, "
                           "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64}


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS credentials from the environment only (tests/helpers.py)."""
    isolated_aws(monkeypatch, tmp_path, ACCESS_KEY, region=None)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[SimServer]:
    async with await start_server() as srv:
        yield srv


@pytest.fixture
def srv(server: SimServer) -> SimServer:
    return fresh(server, api_key=ACCESS_KEY)


def clients(srv: SimServer, key: str = ACCESS_KEY) -> tuple[Any, Any]:
    session = boto3.Session(aws_access_key_id=key, aws_secret_access_key="x", region_name="us-east-1")
    config = Config(retries={"mode": "standard", "total_max_attempts": 1})
    control = session.client("bedrock", endpoint_url=srv.root_url, config=config)
    s3 = session.client("s3", endpoint_url=srv.root_url + "/s3",
                        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))
    return control, s3


def records(count: int, **config: Any) -> bytes:
    return "".join(json.dumps({"recordId": f"r{i:03d}", "modelInput": {
        "messages": [{"role": "user", "content": [{"text": f"question {i}"}]}],
        "inferenceConfig": {"maxTokens": 5, **config}}}) + "\n" for i in range(count)).encode()


def create(control: Any, name: str, key: str = "in/input.jsonl", **extra: Any) -> str:
    response = control.create_model_invocation_job(
        jobName=name, roleArn=ROLE, modelId=NOVA, modelInvocationType="Converse",
        inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{BUCKET}/{key}"}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{BUCKET}/out/"}}, **extra)
    return str(response["jobArn"])


async def run(method: Any, *args: Any, **kwargs: Any) -> Any:
    """A boto3 call off the event loop the in-process server answers on."""
    return await asyncio.to_thread(method, *args, **kwargs)


async def test_a_job_answers_each_record_as_converse_and_writes_the_output_and_manifest(srv):
    control, s3 = clients(srv)
    body = records(MIN_RECORDS) + records(1, temperature=2.0).replace(b'"r000"', b'"bad"')
    await run(s3.put_object, Bucket=BUCKET, Key="in/input.jsonl", Body=body)
    arn = await run(create, control, "job-1")
    job = await run(control.get_model_invocation_job, jobIdentifier=arn)
    job_id = arn.rsplit("/", 1)[-1]
    keys = [o["Key"] for o in (await run(s3.list_objects_v2, Bucket=BUCKET, Prefix="out/"))["Contents"]]
    out = (await run(s3.get_object, Bucket=BUCKET, Key=f"out/{job_id}/input.jsonl.out"))["Body"].read()
    manifest = json.loads((await run(s3.get_object, Bucket=BUCKET, Key=f"out/{job_id}/manifest.json.out"))["Body"]
                          .read())
    assert job["status"] == "Completed" and job["modelInvocationType"] == "Converse"
    assert (job["totalRecordCount"], job["successRecordCount"], job["errorRecordCount"]) == (101, 100, 1)
    assert sorted(keys) == [f"out/{job_id}/input.jsonl.out", f"out/{job_id}/manifest.json.out"]
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert len(lines) == 101 and [x["recordId"] for x in lines] != sorted(x["recordId"] for x in lines)
    good = next(x for x in lines if x["recordId"] == "r007")
    assert good["modelInput"]["messages"][0]["content"][0]["text"] == "question 7"
    assert good["modelOutput"]["stopReason"] in ("end_turn", "max_tokens") and good["modelOutput"]["usage"]
    bad = next(x for x in lines if x["recordId"] == "bad")
    assert bad["error"]["errorCode"] == 400 and "temperature" in bad["error"]["errorMessage"]
    assert manifest["totalRecordCount"] == 101 and manifest["successRecordCount"] == 100
    assert manifest["errorRecordCount"] == 1 and manifest["outputTokenCount"] > 0


async def test_the_create_body_is_checked_against_botocores_service_model(srv):
    control, s3 = clients(srv)
    await run(s3.put_object, Bucket=BUCKET, Key="in/input.jsonl", Body=records(MIN_RECORDS))
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        await run(create, control, "not a valid name!")
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "at 'jobName'" in refused.value.response["Error"]["Message"]
    good = {"jobName": "raw", "roleArn": ROLE, "modelId": NOVA,
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": f"s3://{BUCKET}/in/input.jsonl"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{BUCKET}/out/"}}}
    async with aiohttp.ClientSession() as http:
        for body, words in (({**good, "priority": "high"}, "extraneous key [priority]"),
                            ({**good, "timeoutDurationInHours": 10}, "greater than or equal to 24"),
                            ({**good, "roleArn": "arn:aws:iam::1:user/me"}, "at 'roleArn'")):
            async with http.post(srv.root_url + "/model-invocation-job", json=body, headers=SIGNED) as response:
                said = await response.json()
                assert response.status == 400 and response.headers["x-amzn-ErrorType"].startswith("Validation")
                assert words in said["message"]
        async with http.post(srv.root_url + "/model-invocation-job", json=good) as response:
            assert response.status == 403, "a request without SigV4 is refused"
    assert "batches" not in srv.stats()


async def test_the_same_token_returns_its_job_and_a_taken_name_conflicts(srv):
    control, s3 = clients(srv)
    await run(s3.put_object, Bucket=BUCKET, Key="in/input.jsonl", Body=records(MIN_RECORDS))
    first = await run(create, control, "idem", clientRequestToken="runner-abc")
    again = await run(create, control, "idem", clientRequestToken="runner-abc")
    with pytest.raises(botocore.exceptions.ClientError) as conflict:
        await run(create, control, "idem", clientRequestToken="runner-other")
    assert first == again and srv.stats()["batches"] == 1
    assert conflict.value.response["Error"]["Code"] == "ConflictException"


async def test_too_few_records_or_no_input_fail_the_job_in_validation(srv):
    control, s3 = clients(srv)
    await run(s3.put_object, Bucket=BUCKET, Key="in/small.jsonl", Body=records(MIN_RECORDS - 1))
    small = await run(control.get_model_invocation_job, jobIdentifier=await run(create, control, "small",
                                                                                key="in/small.jsonl"))
    missing = await run(control.get_model_invocation_job, jobIdentifier=await run(create, control, "none",
                                                                                  key="in/none.jsonl"))
    assert small["status"] == missing["status"] == "Failed"
    assert f"fewer than the minimum of {MIN_RECORDS}" in small["message"] and "No .jsonl" in missing["message"]


async def test_the_list_filters_by_name_and_time_and_pages(srv):
    control, s3 = clients(srv)
    await run(s3.put_object, Bucket=BUCKET, Key="in/input.jsonl", Body=records(MIN_RECORDS))
    arns = [await run(create, control, f"run-x-{i}-digest{i}") for i in range(3)]
    await run(create, control, "other")
    named = await run(control.list_model_invocation_jobs, nameContains="digest1")
    page = await run(control.list_model_invocation_jobs, nameContains="run-x", maxResults=2)
    rest = await run(control.list_model_invocation_jobs, nameContains="run-x", maxResults=2,
                     nextToken=page["nextToken"])
    import datetime as dt

    later = await run(control.list_model_invocation_jobs, submitTimeAfter=dt.datetime.now(dt.UTC)
                      + dt.timedelta(hours=1))
    assert [j["jobArn"] for j in named["invocationJobSummaries"]] == [arns[1]]
    listed = [j["jobArn"] for j in page["invocationJobSummaries"] + rest["invocationJobSummaries"]]
    assert listed == arns[::-1] and "nextToken" not in rest
    assert later["invocationJobSummaries"] == []


async def test_a_stop_and_an_expiry_end_a_running_job(srv):
    fresh(srv, api_key=ACCESS_KEY, batch_delay=100.0)
    control, s3 = clients(srv)
    await run(s3.put_object, Bucket=BUCKET, Key="in/input.jsonl", Body=records(MIN_RECORDS))
    stopped, expired = await run(create, control, "to-stop"), await run(create, control, "to-expire")
    running = (await run(control.get_model_invocation_job, jobIdentifier=stopped))["status"]
    await run(control.stop_model_invocation_job, jobIdentifier=stopped)
    assert srv.expire_batch(expired.rsplit("/", 1)[-1])
    states = [(await run(control.get_model_invocation_job, jobIdentifier=arn))["status"] for arn in (stopped, expired)]
    with pytest.raises(botocore.exceptions.ClientError) as over:
        await run(control.stop_model_invocation_job, jobIdentifier=stopped)
    assert running == "Validating" and states == ["Stopped", "Expired"]
    assert over.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(botocore.exceptions.ClientError) as unknown:
        await run(control.get_model_invocation_job, jobIdentifier="abcdefabcdef")
    assert unknown.value.response["Error"]["Code"] == "ResourceNotFoundException"


async def test_s3_objects_listings_errors_and_the_key_check(srv):
    _, s3 = clients(srv)
    for i in range(5):
        await run(s3.put_object, Bucket=BUCKET, Key=f"dir/a b {i}.jsonl", Body=b"x" * i)
    head = await run(s3.head_object, Bucket=BUCKET, Key="dir/a b 3.jsonl")
    pages = await asyncio.to_thread(lambda: list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix="dir/", PaginationConfig={"PageSize": 2})))
    await run(s3.delete_object, Bucket=BUCKET, Key="dir/a b 0.jsonl")
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        await run(s3.get_object, Bucket=BUCKET, Key="dir/a b 0.jsonl")
    _, stranger = clients(srv, key="AKIDSOMEONEELSE")
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        await run(stranger.list_objects_v2, Bucket=BUCKET)
    assert head["ContentLength"] == 3
    assert [len(p.get("Contents", [])) for p in pages] == [2, 2, 1]
    assert [o["Key"] for p in pages for o in p["Contents"]] == [f"dir/a b {i}.jsonl" for i in range(5)]
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    assert refused.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    srv.reset()
    assert (await run(s3.list_objects_v2, Bucket=BUCKET)).get("KeyCount") == 0, "a reset forgets the objects"
