"""The simulated server's Batch APIs (OpenAI Files + Batches, Anthropic Message Batches, Gemini batch mode),
through the official openai, anthropic and google-genai SDKs over 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from simserver import SimConfig, SimServer
from simserver import cli as simserver_cli
from tests.helpers import make_claude, make_gemini, make_openai

pytestmark = pytest.mark.asyncio(loop_scope="module")
MC = "Which is a fruit?\nA. carrot\nB. apple\nC. potato\nAnswer:"


def picked(salt: str, ids: list[str], fraction: float) -> set[str]:
    """The ids the documented hash rule picks (simserver.batches: sha256(salt NUL id) / 2**64 < fraction)."""
    return {i for i in ids
            if int.from_bytes(hashlib.sha256(f"{salt}\0{i}".encode()).digest()[:8], "big") / 2**64 < fraction}


def chat_bodies(n: int) -> list[dict[str, Any]]:
    bodies = [{"model": "sim-a", "messages": [{"role": "user", "content": MC}], "temperature": 0},
              {"model": "sim-a", "messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Say something."}], "max_tokens": 5},
              {"model": "sim-a", "messages": [{"role": "user", "content": "Tell me more."}], "stop": ["e"]}]
    return [bodies[i] if i < len(bodies) else
            {"model": "sim-a", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(n)]


async def openai_batch(oa: openai.AsyncOpenAI, bodies: dict[str, dict[str, Any]],
                       endpoint: str = "/v1/chat/completions") -> openai.types.Batch:
    data = "".join(json.dumps({"custom_id": cid, "method": "POST", "url": endpoint, "body": body}) + "\n"
                   for cid, body in bodies.items())
    upload = await oa.files.create(file=("input.jsonl", data.encode()), purpose="batch")
    return await oa.batches.create(input_file_id=upload.id, endpoint=endpoint,  # type: ignore[arg-type]
                                   completion_window="24h", metadata={"run": "test"})


async def jsonl(oa: openai.AsyncOpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    content = await oa.files.content(file_id)
    return {item["custom_id"]: item for item in map(json.loads, content.text.splitlines())}


def same_answer(batch_body: dict[str, Any], online: dict[str, Any], *drop: str) -> None:
    """Equal apart from the random ids and timestamps."""
    keep = lambda d: {k: v for k, v in d.items() if k not in drop}  # noqa: E731
    assert keep(batch_body) == keep(online)


async def sim_post(srv: SimServer, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(srv.root_url + path) as resp:
        return resp.status, await resp.json()


# -- OpenAI -------------------------------------------------------------------------------------------------------


async def test_openai_batch_answers_equal_the_online_answers(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    bodies = {f"req-{i}": body for i, body in enumerate(chat_bodies(4))}
    created = await openai_batch(oa, bodies)
    assert created.status == "validating" and created.endpoint == "/v1/chat/completions"
    assert created.metadata == {"run": "test"} and created.request_counts and created.request_counts.total == 4
    done = await oa.batches.retrieve(created.id)  # batch_delay 0: done at the first look
    assert done.status == "completed" and done.completed_at and done.error_file_id is None
    assert done.request_counts and (done.request_counts.completed, done.request_counts.failed) == (4, 0)
    out = await jsonl(oa, done.output_file_id)
    assert list(out) == list(bodies)
    for cid, body in bodies.items():
        line = out[cid]
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
        online = await oa.chat.completions.create(**body)
        same_answer(line["response"]["body"], online.model_dump(mode="json", exclude_unset=True), "id", "created")
    answered = [line["response"]["body"]["usage"] for line in out.values()]
    usage = done.model_dump(mode="json").get("usage")  # a typed field in newer openai SDKs, an extra key in 1.98
    assert usage and usage["input_tokens"] == sum(u["prompt_tokens"] for u in answered)
    assert usage["output_tokens"] == sum(u["completion_tokens"] for u in answered)


async def test_openai_completions_batch_equals_online(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    bodies = {"a": {"model": "sim-lm", "prompt": "The cat sat", "max_tokens": 0, "echo": True, "logprobs": 1},
              "b": {"model": "sim-lm", "prompt": ["One", "Two"], "max_tokens": 3}}
    created = await openai_batch(oa, bodies, "/v1/completions")
    out = await jsonl(oa, (await oa.batches.retrieve(created.id)).output_file_id)
    for cid, body in bodies.items():
        online = await oa.completions.create(**body)
        same_answer(out[cid]["response"]["body"], online.model_dump(mode="json", exclude_unset=True), "id",
                    "created")


async def test_openai_delay_statuses(srv: SimServer, oa: openai.AsyncOpenAI, now: list[float]) -> None:
    srv.configure(batch_delay=10)
    created = await openai_batch(oa, {"x": chat_bodies(1)[0]})
    seen = (await oa.batches.retrieve(created.id))
    assert seen.status == "in_progress" and seen.output_file_id is None and seen.in_progress_at
    assert seen.request_counts and seen.request_counts.completed == 0
    now[0] += 9.5
    assert (await oa.batches.retrieve(created.id)).status == "finalizing"
    now[0] += 0.5
    done = await oa.batches.retrieve(created.id)
    assert done.status == "completed" and done.output_file_id and done.finalizing_at


async def test_openai_real_time_delay(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    srv.configure(batch_delay=1.0)  # long enough that a loaded machine still retrieves it in progress
    created = await openai_batch(oa, {"x": chat_bodies(1)[0]})
    assert (await oa.batches.retrieve(created.id)).status == "in_progress"
    await asyncio.sleep(1.05)
    assert (await oa.batches.retrieve(created.id)).status == "completed"


async def test_openai_line_errors_and_expiry(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    ids = [f"row-{i}" for i in range(12)]
    expired, errored = picked("expire", ids, 0.3), picked("error", ids, 0.4) - picked("expire", ids, 0.3)
    assert expired and errored and len(expired | errored) < len(ids)
    srv.configure(batch_expire=0.3, batch_line_errors=0.4)
    outcomes = []
    for _ in range(2):  # the same custom ids pick the same lines
        done = await oa.batches.retrieve((await openai_batch(oa, dict(zip(ids, chat_bodies(12), strict=True)))).id)
        assert done.status == "expired" and done.expired_at and done.completed_at is None
        assert done.request_counts and done.request_counts.failed == len(errored)
        assert done.request_counts.completed == len(ids) - len(expired) - len(errored)
        out, err = await jsonl(oa, done.output_file_id), await jsonl(oa, done.error_file_id)
        assert set(out) == set(ids) - expired - errored and set(err) == expired | errored
        for cid in expired:
            assert err[cid]["response"] is None and err[cid]["error"]["code"] == "batch_expired"
        for cid in errored:
            assert err[cid]["error"] is None and err[cid]["response"]["status_code"] == 500
            assert err[cid]["response"]["body"]["error"]["type"] == "server_error"
        outcomes.append((set(out), set(err)))
    assert outcomes[0] == outcomes[1]


async def test_openai_invalid_line_body_is_an_errored_line(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    done = await oa.batches.retrieve((await openai_batch(oa, {"ok": chat_bodies(1)[0], "bad": {"model": "sim-a"}})).id)
    assert done.status == "completed" and done.request_counts and done.request_counts.failed == 1
    bad = (await jsonl(oa, done.error_file_id))["bad"]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "messages"


async def test_openai_cancel_keeps_the_lines_done(srv: SimServer, oa: openai.AsyncOpenAI, now: list[float]) -> None:
    srv.configure(batch_delay=8)
    created = await openai_batch(oa, {f"c{i}": body for i, body in enumerate(chat_bodies(4))})
    now[0] += 4  # lines are done at 2, 4, 6 and 8 seconds
    assert (await oa.batches.cancel(created.id)).status == "cancelling"
    done = await oa.batches.retrieve(created.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    assert set(await jsonl(oa, done.output_file_id)) == {"c0", "c1"}
    err = await jsonl(oa, done.error_file_id)
    assert set(err) == {"c2", "c3"} and err["c2"]["error"]["code"] == "batch_cancelled"
    with pytest.raises(openai.ConflictError):
        await oa.batches.cancel(created.id)


async def test_openai_forced_expiry(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    srv.configure(batch_delay=60)
    created = await openai_batch(oa, {"e0": chat_bodies(1)[0], "e1": chat_bodies(2)[1]})
    assert await sim_post(srv, f"/sim/batches/{created.id}/expire") == (200, {"id": created.id, "end": "expired"})
    done = await oa.batches.retrieve(created.id)
    assert done.status == "expired" and done.output_file_id is None
    err = await jsonl(oa, done.error_file_id)
    assert {line["error"]["code"] for line in err.values()} == {"batch_expired"} and len(err) == 2
    assert (await sim_post(srv, "/sim/batches/batch_nope/expire"))[0] == 404


async def test_openai_malformed_input_file_fails_the_batch(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": chat_bodies(1)[0]})
    wrong_url = good.replace('"custom_id": "a"', '"custom_id": "b"').replace("/v1/chat/completions", "/v1/x")
    upload = await oa.files.create(file=("bad.jsonl", f"{good}\nnot json\n{good}\n{wrong_url}\n".encode()),
                                   purpose="batch")
    created = await oa.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
    failed = await oa.batches.retrieve(created.id)
    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    assert failed.errors and failed.errors.data
    assert [(e.code, e.line) for e in failed.errors.data] == [
        ("invalid_json_line", 2), ("duplicate_custom_id", 3), ("mismatched_url", 4)]
    with pytest.raises(openai.NotFoundError):
        await oa.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions",
                                completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        await oa.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        await oa.batches.retrieve("batch_missing")


async def test_openai_files_and_listing(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    upload = await oa.files.create(file=("notes.jsonl", b'{"a": 1}\n'), purpose="batch")
    assert (upload.filename, upload.bytes, upload.purpose, upload.status) == ("notes.jsonl", 9, "batch", "processed")
    assert (await oa.files.retrieve(upload.id)).id == upload.id
    assert (await oa.files.content(upload.id)).content == b'{"a": 1}\n'
    assert [f.id async for f in oa.files.list(purpose="batch")] == [upload.id]
    deleted = await oa.files.delete(upload.id)
    assert deleted.deleted and deleted.id == upload.id
    with pytest.raises(openai.NotFoundError):
        await oa.files.retrieve(upload.id)
    first = await openai_batch(oa, {"a": chat_bodies(1)[0]})
    second = await openai_batch(oa, {"b": chat_bodies(1)[0]})
    assert [b.id async for b in oa.batches.list(limit=1)] == [second.id, first.id]  # newest first, paged


# -- Anthropic ----------------------------------------------------------------------------------------------------


def claude_params(i: int) -> dict[str, Any]:
    return {"model": "sim-a", "max_tokens": 12 + i, "messages": [{"role": "user", "content": f"Tell me {i}"}],
            **({"system": "Be brief."} if i % 2 else {})}


async def test_anthropic_batch_answers_equal_the_online_answers(srv: SimServer,
                                                                claude: anthropic.AsyncAnthropic) -> None:
    requests = [{"custom_id": f"q{i}", "params": claude_params(i)} for i in range(3)]
    created = await claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 3
    done = await claude.messages.batches.retrieve(created.id)
    assert done.processing_status == "ended" and done.ended_at and done.request_counts.succeeded == 3
    assert done.results_url == f"{srv.root_url}/v1/messages/batches/{created.id}/results"
    results = [r async for r in await claude.messages.batches.results(created.id)]
    assert [r.custom_id for r in results] == ["q0", "q1", "q2"]
    for i, result in enumerate(results):
        assert result.result.type == "succeeded"
        online = await claude.messages.create(**claude_params(i))
        same_answer(result.result.message.model_dump(mode="json"), online.model_dump(mode="json"), "id")


async def test_anthropic_delay_errors_and_expiry(srv: SimServer, claude: anthropic.AsyncAnthropic,
                                                 now: list[float]) -> None:
    ids = [f"row-{i}" for i in range(12)]
    expired, errored = picked("expire", ids, 0.3), picked("error", ids, 0.4) - picked("expire", ids, 0.3)
    srv.configure(batch_delay=5, batch_expire=0.3, batch_line_errors=0.4)
    requests = [{"custom_id": cid, "params": claude_params(i)} for i, cid in enumerate(ids)]
    requests[0]["params"] = {"model": "sim-a", "messages": [{"role": "user", "content": "x"}]}  # no max_tokens
    created = await claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    now[0] += 4.9
    assert (await claude.messages.batches.retrieve(created.id)).processing_status == "in_progress"
    with pytest.raises(anthropic.AnthropicError, match="results_url"):
        await claude.messages.batches.results(created.id)
    now[0] += 0.1
    done = await claude.messages.batches.retrieve(created.id)
    assert done.processing_status == "ended"
    by_id = {r.custom_id: r.result async for r in await claude.messages.batches.results(created.id)}
    invalid = {"row-0"} - expired
    counts = done.request_counts
    assert (counts.expired, counts.errored) == (len(expired), len(errored | invalid))
    assert counts.succeeded == 12 - len(expired | errored | invalid) and counts.processing == 0
    for cid, result in by_id.items():
        kind = ("expired" if cid in expired else "errored" if cid in errored | invalid else "succeeded")
        assert result.type == kind, cid
        if result.type == "errored":
            want = "api_error" if cid in errored else "invalid_request_error"
            assert result.error.type == "error" and result.error.error.type == want


async def test_anthropic_cancel_list_delete(srv: SimServer, claude: anthropic.AsyncAnthropic,
                                            now: list[float]) -> None:
    srv.configure(batch_delay=4)
    requests = [{"custom_id": f"c{i}", "params": claude_params(i)} for i in range(4)]
    created = await claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError):
        await claude.messages.batches.delete(created.id)
    now[0] += 2.5  # lines done at 1, 2, 3, 4 seconds
    canceling = await claude.messages.batches.cancel(created.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at
    done = await claude.messages.batches.retrieve(created.id)
    assert done.processing_status == "ended"
    assert (done.request_counts.succeeded, done.request_counts.canceled) == (2, 2)
    types = {r.custom_id: r.result.type async for r in await claude.messages.batches.results(created.id)}
    assert types == {"c0": "succeeded", "c1": "succeeded", "c2": "canceled", "c3": "canceled"}
    other = await claude.messages.batches.create(requests=requests[:1])  # type: ignore[arg-type]
    assert [b.id async for b in claude.messages.batches.list(limit=1)] == [other.id, created.id]
    assert (await claude.messages.batches.delete(created.id)).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        await claude.messages.batches.retrieve(created.id)
    with pytest.raises(anthropic.BadRequestError, match="not unique"):
        await claude.messages.batches.create(requests=requests[:1] * 2)  # type: ignore[arg-type]


# -- Gemini -------------------------------------------------------------------------------------------------------


def gemini_request(i: int, key: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"max_output_tokens": 10 + i, "temperature": 0.0}
    if i % 2:
        config["system_instruction"] = "Be brief."
    request: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": f"Explain {i}"}]}],
                               "config": config}
    if key is not None:
        request["metadata"] = {"key": key}
    return request


def gemini_dump(response: genai_types.GenerateContentResponse) -> dict[str, Any]:
    """The response without its random id and what the SDK adds on its side."""
    drop = {"response_id", "sdk_http_response", "automatic_function_calling_history"}
    return response.model_dump(mode="json", exclude=drop, exclude_none=True)


async def test_gemini_batch_answers_equal_the_online_answers(srv: SimServer, gemini: genai.Client) -> None:
    job = await gemini.aio.batches.create(model="sim-a", src=[gemini_request(i, f"k{i}") for i in range(3)],
                                          config={"display_name": "my-job"})
    assert job.name and job.name.startswith("batches/") and job.state == genai_types.JobState.JOB_STATE_PENDING
    assert job.display_name == "my-job" and job.model == "models/sim-a"
    done = await gemini.aio.batches.get(name=job.name)
    assert done.state == genai_types.JobState.JOB_STATE_SUCCEEDED and done.end_time
    assert done.dest and done.dest.inlined_responses and len(done.dest.inlined_responses) == 3
    for i, item in enumerate(done.dest.inlined_responses):
        assert item.metadata == {"key": f"k{i}"} and item.error is None and item.response
        request = gemini_request(i)
        online = await gemini.aio.models.generate_content(
            model="sim-a", contents=request["contents"], config=genai_types.GenerateContentConfig(**request["config"]))
        assert gemini_dump(item.response) == gemini_dump(online)


async def test_gemini_delay_errors_expiry_and_cancel(srv: SimServer, gemini: genai.Client, now: list[float]) -> None:
    ids = [f"row-{i}" for i in range(12)]
    expired, errored = picked("expire", ids, 0.3), picked("error", ids, 0.4) - picked("expire", ids, 0.3)
    srv.configure(batch_delay=3, batch_expire=0.3, batch_line_errors=0.4)
    job = await gemini.aio.batches.create(model="sim-a", src=[gemini_request(i, cid) for i, cid in enumerate(ids)])
    assert job.name
    running = await gemini.aio.batches.get(name=job.name)
    assert running.state == genai_types.JobState.JOB_STATE_RUNNING and running.dest is None
    now[0] += 3
    done = await gemini.aio.batches.get(name=job.name)
    assert done.state == genai_types.JobState.JOB_STATE_EXPIRED
    assert done.dest and done.dest.inlined_responses
    for cid, item in zip(ids, done.dest.inlined_responses, strict=True):
        assert item.metadata == {"key": cid}
        if cid in expired | errored:
            assert item.response is None and item.error
            assert item.error.code == (4 if cid in expired else 13)
        else:
            assert item.error is None and item.response and item.response.text
    srv.configure(batch_expire=0.0, batch_line_errors=0.0, batch_delay=4)
    job = await gemini.aio.batches.create(model="sim-a", src=[gemini_request(i) for i in range(4)])
    assert job.name
    now[0] += 2  # two of four lines are done
    await gemini.aio.batches.cancel(name=job.name)
    cancelled = await gemini.aio.batches.get(name=job.name)
    assert cancelled.state == genai_types.JobState.JOB_STATE_CANCELLED
    assert cancelled.dest and cancelled.dest.inlined_responses
    assert [bool(r.response) for r in cancelled.dest.inlined_responses] == [True, True, False, False]
    assert cancelled.dest.inlined_responses[3].error and cancelled.dest.inlined_responses[3].error.code == 1
    assert [j.name async for j in await gemini.aio.batches.list()][:2] == [job.name, done.name]
    await gemini.aio.batches.delete(name=job.name)
    with pytest.raises(genai_errors.ClientError) as caught:
        await gemini.aio.batches.get(name=job.name)
    assert caught.value.code == 404


# -- shared ---------------------------------------------------------------------------------------------------


async def test_a_new_client_resolves_batches_by_id(srv: SimServer) -> None:
    first_oa, first_claude, first_gemini = make_openai(srv), make_claude(srv), make_gemini(srv)
    srv.configure(batch_delay=0.2)
    oa_id = (await openai_batch(first_oa, {"x": chat_bodies(1)[0]})).id
    claude_id = (await first_claude.messages.batches.create(
        requests=[{"custom_id": "x", "params": claude_params(0)}])).id  # type: ignore[list-item]
    gemini_name = (await first_gemini.aio.batches.create(model="sim-a", src=[gemini_request(0)])).name
    assert gemini_name
    await first_oa.close()
    await first_claude.close()
    await first_gemini.aio.aclose()
    await asyncio.sleep(0.25)
    second_oa, second_claude, second_gemini = make_openai(srv), make_claude(srv), make_gemini(srv)
    try:
        assert (await second_oa.batches.retrieve(oa_id)).status == "completed"
        assert (await second_claude.messages.batches.retrieve(claude_id)).processing_status == "ended"
        job = await second_gemini.aio.batches.get(name=gemini_name)
        assert job.state == genai_types.JobState.JOB_STATE_SUCCEEDED
    finally:
        await second_oa.close()
        await second_claude.close()
        await second_gemini.aio.aclose()


async def test_stats_rate_limits_keys_and_reset(srv: SimServer, oa: openai.AsyncOpenAI,
                                                claude: anthropic.AsyncAnthropic) -> None:
    assert "batches" not in srv.stats()
    srv.configure(rpm=1, batch_line_errors=0.0)
    created = await openai_batch(oa, {f"r{i}": body for i, body in enumerate(chat_bodies(3))})
    done = await oa.batches.retrieve(created.id)
    assert done.request_counts and done.request_counts.completed == 3  # batch lines ignore the rpm limit
    await claude.messages.batches.retrieve((await claude.messages.batches.create(
        requests=[{"custom_id": "only", "params": claude_params(0)}])).id)  # type: ignore[list-item]
    stats = srv.stats()
    assert stats["received"] == 0 and stats["batches"] == 2 and stats["batch_lines"] == 4
    assert stats["batch_results"] == {"succeeded": 4, "errored": 0, "expired": 0, "canceled": 0}
    assert sum(stats["batch_completed_by_digest"].values()) == 4
    async with aiohttp.ClientSession() as session:
        for path, status in (("/v1/batches", 401), ("/v1/messages/batches", 401), ("/v1beta/batches", 403)):
            async with session.get(srv.root_url + path) as resp:
                assert resp.status == status, path
    srv.reset()
    assert "batches" not in srv.stats()
    with pytest.raises(openai.NotFoundError):
        await oa.batches.retrieve(created.id)


async def test_batch_knobs_are_config_fields_and_flags(srv: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ({"batch_expire": 1.5}, {"batch_line_errors": -0.1}, {"batch_delay": -1}):
        with pytest.raises(ValueError):
            SimConfig(**bad)
    async with aiohttp.ClientSession() as session, session.post(
            srv.root_url + "/sim/config", json={"batch_delay": 2.5, "batch_expire": 0.25}) as resp:
        assert resp.status == 200 and (await resp.json())["batch_delay"] == 2.5
    assert (srv.config.batch_delay, srv.config.batch_expire) == (2.5, 0.25)
    seen: list[SimConfig] = []
    monkeypatch.setattr(simserver_cli, "serve", lambda host, port, config: seen.append(config))
    simserver_cli.main(["--batch-delay", "1.5", "--batch-expire", "0.1", "--batch-line-errors", "0.2"])
    assert seen == [SimConfig(batch_delay=1.5, batch_expire=0.1, batch_line_errors=0.2)]


async def test_openai_a_file_with_two_models_fails_naming_the_lines(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    """OpenAI's batch guide: "each input file can only include requests to a single model"; its validation fails
    the batch, and ``errors.data`` names each line (from 1) that breaks the rule, with the parameter."""
    other = {**chat_bodies(2)[1], "model": "sim-b"}
    created = await openai_batch(oa, {"a": chat_bodies(1)[0], "b": other, "c": chat_bodies(3)[2]})
    done = await oa.batches.retrieve(created.id)
    assert done.status == "failed" and done.errors and done.errors.data
    [error] = done.errors.data
    assert (error.code, error.line, error.param) == ("mismatched_model", 2, "body.model")
    assert "'sim-b'" in (error.message or "") and "'sim-a'" in (error.message or "")
    assert "batches" in srv.stats() and srv.stats()["batch_lines"] == 0, "nothing of a refused file is run"


async def test_gemini_an_inline_batch_over_20_mb_is_refused(srv: SimServer, gemini: genai.Client) -> None:
    """Inline requests are for batches under 20 MB (Gemini batch mode docs); Google's front end refuses a larger
    body with 400 INVALID_ARGUMENT, its limit in bytes."""
    big = "x" * (7 * 1024 * 1024)
    src: list[Any] = [{"contents": [{"role": "user", "parts": [{"text": f"{i} {big}"}]}]} for i in range(3)]
    with pytest.raises(genai_errors.ClientError) as refused:
        await gemini.aio.batches.create(model="sim-a", src=src)
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
    assert refused.value.message == "Request payload size exceeds the limit: 20971520 bytes."
    assert srv.stats().get("batches", 0) == 0
    job = await gemini.aio.batches.create(model="sim-a", src=src[:2])  # 14 MB: taken
    assert job.name
