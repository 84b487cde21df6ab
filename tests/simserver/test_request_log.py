"""The simulated server's request log (GET /sim/log): off by default; once on, every model request with the model
asked, its messages' digest, its status and outcome and whether a provider would bill it, and every batch and batch
line; emptied by a reset. The seeded fault simulation (scripts/chaos.py) checks the runner against it."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from simserver.answers import message_digest
from tests.helpers import fresh

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "Which is right?\nA. one\nB. two\nAnswer:"}]


async def _ask(session: aiohttp.ClientSession, url: str, messages: list = MESSAGES) -> int:
    async with session.post(url + "/chat/completions", json={"model": "m1", "messages": messages, "max_tokens": 5},
                            headers={"Authorization": "Bearer k"}) as answer:
        await answer.read()
        return answer.status


async def _log(url: str, after: int = 0) -> dict:
    async with aiohttp.ClientSession() as session, session.get(url.removesuffix("/v1") + f"/sim/log?after={after}"
                                                               ) as answer:
        return await answer.json()


async def test_nothing_is_logged_until_it_is_turned_on(shared_srv):
    srv = fresh(shared_srv)
    async with aiohttp.ClientSession() as session:
        assert await _ask(session, srv.url) == 200
    assert await _log(srv.url) == {"on": False, "entries": []}


async def test_each_request_is_logged_with_its_outcome_and_whether_it_is_billed(shared_srv):
    srv = fresh(shared_srv, log_requests=True)
    digest = message_digest(MESSAGES)
    async with aiohttp.ClientSession() as session:
        assert await _ask(session, srv.url) == 200
        srv.configure(fault_500=1.0)
        assert await _ask(session, srv.url) == 500
        srv.configure(fault_500=0.0, fault_malformed=1.0)
        assert await _ask(session, srv.url) == 200
        srv.configure(fault_malformed=0.0, latency=0.5)
        with pytest.raises(TimeoutError):  # the client leaves while the answer is made, as a killed process does
            async with asyncio.timeout(0.1):
                await _ask(session, srv.url)
    while srv.in_flight:
        await asyncio.sleep(0.02)
    entries = (await _log(srv.url))["entries"]
    assert [(e["n"], e["kind"], e["model"], e["digest"]) for e in entries] == [
        (n, "request", "m1", digest) for n in range(1, 5)]
    assert [(e["status"], e["outcome"], e["billed"]) for e in entries] == [
        (200, "answered", True), (500, "refused", False), (200, "malformed", False), (499, "abandoned", True)]
    assert (await _log(srv.url, after=3))["entries"] == entries[3:]
    srv.reset()
    assert (await _log(srv.url))["entries"] == []


async def test_batches_and_their_lines_are_logged_when_they_end(shared_srv, oa):
    srv = fresh(shared_srv, log_requests=True, batch_expire=0.5)
    lines = [{"custom_id": f"k{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m1", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 5}}
             for i in range(8)]
    upload = await oa.files.create(file=("in.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                                   purpose="batch")
    batch = await oa.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    await oa.batches.retrieve(batch.id)
    made, *ended = (await _log(srv.url))["entries"]
    assert made == {"n": 1, "kind": "batch", "provider": "openai", "batch": batch.id, "lines": 8}
    assert [e["custom_id"] for e in ended] == [f"k{i}" for i in range(8)]
    answered = [e for e in ended if e["outcome"] == "succeeded"]
    expired = [e for e in ended if e["outcome"] == "expired"]
    assert answered and expired and len(answered) + len(expired) == 8
    assert all(e["billed"] and e["model"] == "m1" for e in answered) and not any(e["billed"] for e in expired)
    assert {e["digest"] for e in answered} == {
        message_digest(lines[int(e["custom_id"][1:])]["body"]["messages"]) for e in answered}
