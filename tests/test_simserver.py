"""The simulated server, exercised through the official openai SDK over 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion

from providers.simserver import SimConfig, SimServer, simulated_reply, start_server

REPO = Path(__file__).resolve().parents[1]
MC_PROMPT = "Which is a fruit?\nA. carrot\nB. apple\nC. potato\nD. onion\nAnswer:"


def user(text: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def digest(messages: list[dict[str, Any]]) -> str:
    canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def make_client(srv: SimServer, **kwargs: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=srv.url, api_key="test-key", max_retries=0,
                              http_client=openai.DefaultAioHttpClient(), **kwargs)


@pytest.fixture
async def srv() -> AsyncIterator[SimServer]:
    async with await start_server() as server:
        yield server


@pytest.fixture
async def client(srv: SimServer) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = make_client(srv)
    yield sdk
    await sdk.close()


async def ask(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], model: str = "sim-a",
              **params: Any) -> ChatCompletion:
    return await client.chat.completions.create(model=model, messages=messages, **params)  # type: ignore[arg-type]


async def sim_http(srv: SimServer, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
    """Call a /sim/* endpoint (or send a raw body) without the SDK."""
    base = srv.url.removesuffix("/v1")
    data = payload if isinstance(payload, bytes) else None if payload is None else json.dumps(payload)
    async with aiohttp.ClientSession() as session, session.request(
            method, base + path, data=data, headers={"Authorization": "Bearer test-key"}) as resp:
        return resp.status, await resp.json()


async def test_multiple_choice_answer_is_an_offered_letter_and_deterministic(
        srv: SimServer, client: openai.AsyncOpenAI) -> None:
    first = await ask(client, user(MC_PROMPT), temperature=0)
    again = await ask(client, user(MC_PROMPT), temperature=0)
    other_model = await ask(client, user(MC_PROMPT), model="sim-b", temperature=0)
    answer = first.choices[0].message.content
    assert answer in {"A", "B", "C", "D"}
    assert again.choices[0].message.content == answer
    assert other_model.choices[0].message.content in {"A", "B", "C", "D"}
    assert other_model.model == "sim-b"
    assert (answer, "stop") == simulated_reply("sim-a", user(MC_PROMPT), temperature=0)
    # Content given as text parts is read the same way; only the letters offered can come back.
    parts = user([{"type": "text", "text": "Pick one.\n"}, {"type": "text", "text": "X) yes\nY) no\n"}])
    assert (await ask(client, parts)).choices[0].message.content in {"X", "Y"}


async def test_free_text_answer_and_usage_parse_into_sdk_types(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *user("Tell me about the weather.")]
    result = await ask(client, messages)
    choice = result.choices[0]
    content = choice.message.content or ""
    assert 8 <= len(content.split()) <= 30 and content.endswith(".")
    assert choice.finish_reason == "stop" and choice.message.role == "assistant" and choice.index == 0
    assert result.id.startswith("chatcmpl-") and result.object == "chat.completion"
    assert result.system_fingerprint and result.created > 0
    usage = result.usage
    assert isinstance(usage, CompletionUsage)
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0


async def test_max_tokens_truncates_with_finish_reason_length(client: openai.AsyncOpenAI) -> None:
    for params in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        result = await ask(client, user("Describe a long day."), **params)
        content = result.choices[0].message.content or ""
        assert result.choices[0].finish_reason == "length"
        assert len(content.split()) == 3
        assert result.usage is not None and 1 <= result.usage.completion_tokens <= 3
    roomy = await ask(client, user("Describe a long day."), max_tokens=100)
    assert roomy.choices[0].finish_reason == "stop"


async def test_stop_string_cuts_the_answer(client: openai.AsyncOpenAI) -> None:
    result = await ask(client, user("Say something."), stop=["e"])
    content = result.choices[0].message.content or ""
    assert "e" not in content and result.choices[0].finish_reason == "stop"
    assert content == simulated_reply("sim-a", user("Say something."), stop=["e"])[0]


async def test_missing_key_is_an_authentication_error(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    for header in (openai.Omit(), "", "Bearer "):
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(model="sim-a", messages=user("hi"),  # type: ignore[arg-type]
                                                 extra_headers={"Authorization": header})
        assert caught.value.code == "invalid_api_key" and caught.value.type == "invalid_request_error"
    assert srv.stats()["by_status"] == {"401": 3}
    srv.configure(require_key=False)
    result = await client.chat.completions.create(model="sim-a", messages=user("hi"),  # type: ignore[arg-type]
                                                  extra_headers={"Authorization": openai.Omit()})
    assert result.choices[0].message.content


async def test_bad_requests_get_openai_error_json(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    status, body = await sim_http(srv, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = await sim_http(srv, "POST", "/v1/chat/completions", {"model": "sim-a"})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = await sim_http(srv, "POST", "/v1/chat/completions", {"messages": user("hi")})
    assert status == 400 and body["error"]["param"] == "model"
    with pytest.raises(openai.BadRequestError):
        await ask(client, user("hi"), n=2)
    assert srv.stats()["by_status"] == {"400": 4} and srv.stats()["received"] == 4


async def test_rpm_window_rejects_the_fourth_request(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    srv.configure(rpm=3)
    remaining = []
    for i in range(3):
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-a", messages=user(f"q{i}"))  # type: ignore[arg-type]
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert re.fullmatch(r"(\d+m)?\d+(\.\d+)?s|\d+ms", raw.headers["x-ratelimit-reset-requests"])
        assert raw.headers["x-request-id"]
        remaining.append(raw.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(client, user("q3"))
    headers = caught.value.response.headers
    assert float(headers["retry-after"]) == pytest.approx(0.2)
    assert int(headers["retry-after-ms"]) == 200
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert caught.value.code == "rate_limit_exceeded" and caught.value.type == "requests"
    assert srv.stats()["by_status"] == {"200": 3, "429": 1}


async def test_rpm_window_slides_with_the_clock(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    now = [1000.0]
    srv.clock = lambda: now[0]
    srv.configure(rpm=2)

    async def remaining_and_reset(text: str) -> tuple[str, str]:
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-a", messages=user(text))  # type: ignore[arg-type]
        return raw.headers["x-ratelimit-remaining-requests"], raw.headers["x-ratelimit-reset-requests"]

    assert await remaining_and_reset("a") == ("1", "1m0s")
    now[0] += 30
    assert await remaining_and_reset("b") == ("0", "1m0s")
    with pytest.raises(openai.RateLimitError):
        await ask(client, user("c"))
    now[0] += 30.5  # the first request has left the window; the 429 never entered it
    assert await remaining_and_reset("d") == ("0", "1m0s")
    now[0] += 1
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(client, user("e"))
    assert caught.value.response.headers["x-ratelimit-reset-requests"] == "59s"
    assert srv.stats()["by_status"] == {"200": 3, "429": 2}


async def test_random_faults(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    srv.configure(fault_429=1.0, retry_after=1.5)
    with pytest.raises(openai.RateLimitError) as limited:
        await ask(client, user("hi"))
    assert limited.value.response.headers["retry-after"] == "1.5"
    srv.configure(fault_429=0.0, fault_500=1.0)
    with pytest.raises(openai.InternalServerError) as failed:
        await ask(client, user("hi"))
    assert failed.value.type == "server_error"
    assert srv.stats() == {"received": 2, "by_status": {"429": 1, "500": 1}, "completed_by_digest": {}}


async def test_faults_follow_the_seed() -> None:
    async def outcomes(seed: int) -> list[int]:
        async with await start_server(SimConfig(fault_429=0.3, fault_500=0.3, seed=seed)) as server:
            sdk = make_client(server)
            seen = []
            for i in range(20):
                try:
                    await ask(sdk, user(f"q{i}"))
                    seen.append(200)
                except openai.APIStatusError as exc:
                    seen.append(exc.status_code)
            await sdk.close()
            return seen

    first = await outcomes(7)
    assert first == await outcomes(7)
    assert {200, 429, 500} <= set(first)


async def test_hang_makes_the_client_time_out(srv: SimServer) -> None:
    srv.configure(fault_timeout=1.0, hang_seconds=5)
    sdk = make_client(srv, timeout=0.3)
    try:
        with pytest.raises(openai.APITimeoutError):
            await ask(sdk, user("slow"))
        # A hang shorter than the client's patience is just a slow success.
        srv.configure(hang_seconds=0.05)
        assert (await ask(sdk, user("slow"), timeout=5)).choices[0].message.content
    finally:
        await sdk.close()
    await srv.close()  # wakes the hung handler, whose client is gone: counted as 499, not completed
    stats = srv.stats()
    assert stats["by_status"] == {"200": 1, "499": 1}
    assert stats["completed_by_digest"] == {digest(user("slow")): 1}


async def test_stats_count_by_digest_and_reset(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    one, two = user("first question"), [{"content": "second", "role": "user"}]
    await ask(client, one)
    await ask(client, one)
    await ask(client, two)
    expected = {"received": 3, "by_status": {"200": 3}, "completed_by_digest": {digest(one): 2, digest(two): 1}}
    assert srv.stats() == expected
    assert await sim_http(srv, "GET", "/sim/stats") == (200, expected)
    status, _ = await sim_http(srv, "POST", "/sim/reset")
    assert status == 200
    assert srv.stats() == {"received": 0, "by_status": {}, "completed_by_digest": {}}


async def test_config_endpoint_changes_faults_at_run_time(srv: SimServer, client: openai.AsyncOpenAI) -> None:
    status, config = await sim_http(srv, "POST", "/sim/config", {"fault_500": 1.0, "rpm": 100})
    assert status == 200 and config["fault_500"] == 1.0 and config["rpm"] == 100
    assert srv.config.fault_500 == 1.0
    with pytest.raises(openai.InternalServerError):
        await ask(client, user("hi"))
    await sim_http(srv, "POST", "/sim/config", {"fault_500": 0})
    assert (await ask(client, user("hi"))).choices[0].message.content
    for bad in ({"no_such_knob": 1}, {"rpm": "many"}, {"fault_429": -1}, [1, 2]):
        status, body = await sim_http(srv, "POST", "/sim/config", bad)
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert srv.config.rpm == 100
    with pytest.raises(ValueError, match="fault_429"):
        SimConfig(fault_429=1.5)


async def test_module_entry_point_prints_port_and_answers() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "providers.simserver", "--port", "0", "--rpm", "600", "--fault-429", "0",
        "--no-require-key", cwd=REPO, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=20)).decode()
        match = re.fullmatch(r"simulated server listening on (http://127\.0\.0\.1:(\d+)/v1)\n", line)
        assert match and int(match[2]) > 0
        sdk = openai.AsyncOpenAI(base_url=match[1], api_key="test-key", max_retries=0,
                                 http_client=openai.DefaultAioHttpClient())
        try:
            raw = await sdk.chat.completions.with_raw_response.create(
                model="sim-a", messages=user(MC_PROMPT))  # type: ignore[arg-type]
        finally:
            await sdk.close()
        assert raw.parse().choices[0].message.content in {"A", "B", "C", "D"}
        assert raw.headers["x-ratelimit-limit-requests"] == "600"
    finally:
        if proc.returncode is None:
            proc.terminate()
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
