"""The simulated server, exercised through the official openai, anthropic and google-genai SDKs (and raw
aiohttp for what the SDKs hide) over 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion

from simserver import SimConfig, SimServer, simulated_reply, start_server
from simserver import cli as simserver_cli
from tests.helpers import make_claude, make_gemini, make_openai

REPO = Path(__file__).resolve().parents[2]
MC_PROMPT = "Which is a fruit?\nA. carrot\nB. apple\nC. potato\nD. onion\nAnswer:"
NO_ROUTES = {"openai": 0, "anthropic": 0, "gemini": 0}


def user(text: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def digest(messages: list[dict[str, Any]]) -> str:
    canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# One server and one client per SDK serve the whole module (each SDK client loads certificate bundles when
# built, ~50 ms apiece); every test starts from the server as new. Tests that close it start their own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def own_srv() -> AsyncIterator[SimServer]:
    """A server of the test's own, for tests that close it."""
    async with await start_server() as server:
        yield server


async def ask_claude(claude: anthropic.AsyncAnthropic, text: str = "hi", max_tokens: int = 50,
                     **params: Any) -> anthropic.types.Message:
    return await claude.messages.create(model="sim-a", max_tokens=max_tokens,
                                        messages=[{"role": "user", "content": text}], **params)


async def ask_gemini(gemini: genai.Client, text: str = "hi", model: str = "sim-a",
                     **config: Any) -> genai_types.GenerateContentResponse:
    return await gemini.aio.models.generate_content(
        model=model, contents=text, config=genai_types.GenerateContentConfig(**config) if config else None)


async def raw_post(srv: SimServer, path: str, payload: Any, headers: dict[str, str] | None = None
                   ) -> tuple[int, Mapping[str, str], str]:
    """POST without an SDK: (status, headers (case-insensitive), body text). A Messages request gets the
    ``anthropic-version`` header the real API requires (as the SDK sends it) unless ``headers`` name one."""
    headers = dict(headers or {})
    if path.startswith("/v1/messages"):
        headers.setdefault("anthropic-version", "2023-06-01")
    async with aiohttp.ClientSession() as session, session.post(
            srv.root_url + path, data=json.dumps(payload), headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.text()


async def ask(oa: openai.AsyncOpenAI, messages: list[dict[str, Any]], model: str = "sim-a",
              **params: Any) -> ChatCompletion:
    return await oa.chat.completions.create(model=model, messages=messages, **params)  # type: ignore[arg-type]


async def sim_http(srv: SimServer, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
    """Call a /sim/* endpoint (or send a raw body) without the SDK."""
    base = srv.url.removesuffix("/v1")
    data = payload if isinstance(payload, bytes) else None if payload is None else json.dumps(payload)
    async with aiohttp.ClientSession() as session, session.request(
            method, base + path, data=data, headers={"Authorization": "Bearer test-key"}) as resp:
        return resp.status, await resp.json()


async def test_multiple_choice_answer_is_an_offered_letter_and_deterministic(
        srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    first = await ask(oa, user(MC_PROMPT), temperature=0)
    again = await ask(oa, user(MC_PROMPT), temperature=0)
    other_model = await ask(oa, user(MC_PROMPT), model="sim-b", temperature=0)
    answer = first.choices[0].message.content
    assert answer in {"A", "B", "C", "D"}
    assert again.choices[0].message.content == answer
    assert other_model.choices[0].message.content in {"A", "B", "C", "D"}
    assert other_model.model == "sim-b"
    assert (answer, "stop") == simulated_reply("sim-a", user(MC_PROMPT), temperature=0)
    # Content given as text parts is read the same way; only the letters offered can come back.
    parts = user([{"type": "text", "text": "Pick one.\n"}, {"type": "text", "text": "X) yes\nY) no\n"}])
    assert (await ask(oa, parts)).choices[0].message.content in {"X", "Y"}
    # Options written "A: text" (Know-No's MC-Test prompt) are read when no "A." / "A)" options are there...
    colon = "Question:\nWho came?\nOptions:\nA: Bob\nB: James\nC: Ann\nYour answer:"
    assert (await ask(oa, user(colon))).choices[0].message.content in {"A", "B", "C"}
    # ...and never pick a "Q:" line over dotted options
    mixed = "Q: which one?\nA. one\nB. two\nAnswer:"
    assert all(simulated_reply("sim-a", user(mixed), seed=s)[0] in {"A", "B"} for s in range(20))


async def test_free_text_answer_and_usage_parse_into_sdk_types(oa: openai.AsyncOpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *user("Tell me about the weather.")]
    result = await ask(oa, messages)
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


async def test_max_tokens_truncates_with_finish_reason_length(oa: openai.AsyncOpenAI) -> None:
    for params in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        result = await ask(oa, user("Describe a long day."), **params)
        content = result.choices[0].message.content or ""
        assert result.choices[0].finish_reason == "length"
        assert len(content.split()) == 3
        assert result.usage is not None and 1 <= result.usage.completion_tokens <= 3
    roomy = await ask(oa, user("Describe a long day."), max_tokens=100)
    assert roomy.choices[0].finish_reason == "stop"


async def test_stop_string_cuts_the_answer(oa: openai.AsyncOpenAI) -> None:
    result = await ask(oa, user("Say something."), stop=["e"])
    content = result.choices[0].message.content or ""
    assert "e" not in content and result.choices[0].finish_reason == "stop"
    assert content == simulated_reply("sim-a", user("Say something."), stop=["e"])[0]


async def test_missing_key_is_an_authentication_error(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    for header in (openai.Omit(), "", "Bearer "):
        with pytest.raises(openai.AuthenticationError) as caught:
            await oa.chat.completions.create(model="sim-a", messages=user("hi"),  # type: ignore[arg-type]
                                                 extra_headers={"Authorization": header})
        assert caught.value.code == "invalid_api_key" and caught.value.type == "invalid_request_error"
    assert srv.stats()["by_status"] == {"401": 3}
    srv.configure(require_key=False)
    result = await oa.chat.completions.create(model="sim-a", messages=user("hi"),  # type: ignore[arg-type]
                                                  extra_headers={"Authorization": openai.Omit()})
    assert result.choices[0].message.content


async def test_bad_requests_get_openai_error_json(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    status, body = await sim_http(srv, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = await sim_http(srv, "POST", "/v1/chat/completions", {"model": "sim-a"})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = await sim_http(srv, "POST", "/v1/chat/completions", {"messages": user("hi")})
    assert status == 400 and body["error"]["param"] == "model"
    with pytest.raises(openai.BadRequestError):
        await ask(oa, user("hi"), n=2)
    assert srv.stats()["by_status"] == {"400": 4} and srv.stats()["received"] == 4


async def test_rpm_bucket_rejects_the_fourth_request(srv: SimServer, oa: openai.AsyncOpenAI,
                                                      now: list[float]) -> None:
    srv.configure(rpm=3)
    remaining, resets = [], []
    for i in range(3):
        raw = await oa.chat.completions.with_raw_response.create(
            model="sim-a", messages=user(f"q{i}"))  # type: ignore[arg-type]
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-request-id"]
        assert "x-ratelimit-limit-tokens" not in raw.headers  # only the limits configured
        remaining.append(raw.headers["x-ratelimit-remaining-requests"])
        resets.append(raw.headers["x-ratelimit-reset-requests"])
    assert remaining == ["2", "1", "0"]
    assert resets == ["20s", "40s", "1m0s"]  # 3 per minute refill one request every 20 s
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(oa, user("q3"))
    headers = caught.value.response.headers
    assert headers["retry-after"] == "20" and headers["retry-after-ms"] == "20000"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert caught.value.code == "rate_limit_exceeded" and caught.value.type == "requests"
    assert "Limit 3, Used 3, Requested 1" in caught.value.message
    assert srv.stats()["by_status"] == {"200": 3, "429": 1}


async def test_rpm_bucket_refills_continuously(srv: SimServer, oa: openai.AsyncOpenAI,
                                               now: list[float]) -> None:
    srv.configure(rpm=2)  # one request back every 30 s

    async def remaining_and_reset(text: str) -> tuple[str, str]:
        raw = await oa.chat.completions.with_raw_response.create(
            model="sim-a", messages=user(text))  # type: ignore[arg-type]
        return raw.headers["x-ratelimit-remaining-requests"], raw.headers["x-ratelimit-reset-requests"]

    async def retry_after(text: str) -> tuple[str, str]:
        with pytest.raises(openai.RateLimitError) as caught:
            await ask(oa, user(text))
        return caught.value.response.headers["retry-after"], caught.value.response.headers["retry-after-ms"]

    assert await remaining_and_reset("a") == ("1", "30s")
    now[0] += 15  # half a request back: 1.5 in the bucket
    assert await remaining_and_reset("b") == ("0", "45s")
    assert await retry_after("c") == ("15", "15000")  # a 429 takes nothing from the bucket
    now[0] += 15
    assert await remaining_and_reset("d") == ("0", "1m0s")
    now[0] += 29.9996  # 0.4 ms short of one request: the wait is rounded up to a millisecond
    assert await retry_after("e") == ("0.001", "1")
    now[0] += 0.001
    assert (await remaining_and_reset("f"))[0] == "0"
    other = await oa.chat.completions.with_raw_response.create(
        model="sim-b", messages=user("g"))  # type: ignore[arg-type]
    assert other.headers["x-ratelimit-remaining-requests"] == "1"  # every model has its own buckets
    assert srv.stats()["by_status"] == {"200": 5, "429": 2}


async def test_tpm_bucket_charges_input_plus_max_tokens(srv: SimServer, oa: openai.AsyncOpenAI,
                                                         now: list[float]) -> None:
    srv.configure(tpm=120)  # 2 tokens back per second
    first = await oa.chat.completions.with_raw_response.create(
        model="sim-a", messages=user("hi"), max_tokens=10)  # type: ignore[arg-type]
    prompt_tokens = first.parse().usage.prompt_tokens  # type: ignore[union-attr]
    assert first.headers["x-ratelimit-limit-tokens"] == "120"
    assert first.headers["x-ratelimit-remaining-tokens"] == str(120 - prompt_tokens - 10)
    assert "x-ratelimit-limit-requests" not in first.headers
    second = await oa.chat.completions.with_raw_response.create(
        model="sim-a", messages=user("hi"))  # type: ignore[arg-type]
    left = 120 - 2 * prompt_tokens - 10 - 16  # no max_tokens: charged as 16
    assert second.headers["x-ratelimit-remaining-tokens"] == str(left)
    assert second.headers["x-ratelimit-reset-tokens"] == _seconds((120 - left) / 2)
    want = left + 7 - prompt_tokens  # asks for 7 tokens more than the bucket holds: 3.5 s at 2 per s
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(oa, user("hi"), max_tokens=want)
    assert caught.value.type == "tokens" and "tokens per min (TPM)" in caught.value.message
    assert caught.value.response.headers["retry-after"] == "3.5"
    now[0] += 3.5
    assert (await ask(oa, user("hi"), max_tokens=want)).choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="Request too large"):  # more than a minute's worth
        await ask(oa, user("hi"), max_tokens=200)


def _seconds(value: float) -> str:
    return f"{value:g}s" if value < 60 else f"{int(value // 60)}m{value % 60:g}s"


async def test_random_faults(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    srv.configure(fault_429=1.0, retry_after=1.5)
    with pytest.raises(openai.RateLimitError) as limited:
        await ask(oa, user("hi"))
    assert limited.value.response.headers["retry-after"] == "1.5"
    srv.configure(fault_429=0.0, fault_500=1.0)
    with pytest.raises(openai.InternalServerError) as failed:
        await ask(oa, user("hi"))
    assert failed.value.type == "server_error"
    assert srv.stats() == {"received": 2, "by_status": {"429": 1, "500": 1},
                           "by_route": {**NO_ROUTES, "openai": 2}, "completed_by_digest": {}}


async def test_faults_follow_the_seed() -> None:
    async def outcomes(seed: int) -> list[int]:
        async with await start_server(SimConfig(fault_429=0.3, fault_500=0.3, seed=seed)) as server:
            sdk = make_openai(server)
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


async def test_hang_makes_the_client_time_out(own_srv: SimServer) -> None:
    own_srv.configure(fault_timeout=1.0, hang_seconds=5)
    sdk = make_openai(own_srv, timeout=0.3)
    try:
        with pytest.raises(openai.APITimeoutError):
            await ask(sdk, user("slow"))
        # A hang shorter than the client's patience is just a slow success.
        own_srv.configure(hang_seconds=0.05)
        assert (await ask(sdk, user("slow"), timeout=5)).choices[0].message.content
    finally:
        await sdk.close()
    await own_srv.close()  # wakes the hung handler, whose client is gone: counted as 499, not completed
    stats = own_srv.stats()
    assert stats["by_status"] == {"200": 1, "499": 1}
    assert stats["completed_by_digest"] == {digest(user("slow")): 1}


async def test_stats_count_by_digest_and_reset(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    one, two = user("first question"), [{"content": "second", "role": "user"}]
    await ask(oa, one)
    await ask(oa, one)
    await ask(oa, two)
    expected = {"received": 3, "by_status": {"200": 3}, "by_route": {**NO_ROUTES, "openai": 3},
                "completed_by_digest": {digest(one): 2, digest(two): 1}}
    assert srv.stats() == expected
    assert await sim_http(srv, "GET", "/sim/stats") == (200, expected)
    status, _ = await sim_http(srv, "POST", "/sim/reset")
    assert status == 200
    assert srv.stats() == {"received": 0, "by_status": {}, "by_route": NO_ROUTES, "completed_by_digest": {}}


async def test_config_endpoint_changes_faults_at_run_time(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    status, config = await sim_http(srv, "POST", "/sim/config", {"fault_500": 1.0, "rpm": 100})
    assert status == 200 and config["fault_500"] == 1.0 and config["rpm"] == 100
    assert srv.config.fault_500 == 1.0
    with pytest.raises(openai.InternalServerError):
        await ask(oa, user("hi"))
    await sim_http(srv, "POST", "/sim/config", {"fault_500": 0})
    assert (await ask(oa, user("hi"))).choices[0].message.content
    for bad in ({"no_such_knob": 1}, {"rpm": "many"}, {"fault_429": -1}, [1, 2]):
        status, body = await sim_http(srv, "POST", "/sim/config", bad)
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert srv.config.rpm == 100
    with pytest.raises(ValueError, match="fault_429"):
        SimConfig(fault_429=1.5)


async def test_module_entry_point_prints_port_and_answers() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simserver", "--port", "0", "--rpm", "600", "--fault-429", "0",
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


# -- Anthropic and Gemini -------------------------------------------------------------------------------------

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}]


async def test_anthropic_answer_usage_and_stop_reasons(srv: SimServer, claude: anthropic.AsyncAnthropic) -> None:
    raw = await claude.messages.with_raw_response.create(
        model="sim-a", max_tokens=50, system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me about the weather."}]}])
    message = await raw.parse()  # anthropic: async parse(); openai's async raw response parses synchronously
    assert raw.headers["request-id"].startswith("req_") and "anthropic-ratelimit-requests-limit" not in raw.headers
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "sim-a" and message.stop_reason == "end_turn" and message.stop_sequence is None
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock) and 8 <= len(block.text.split()) <= 30
    usage = message.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 50
    assert usage.cache_creation_input_tokens == 0 and usage.cache_read_input_tokens == 0
    short = await ask_claude(claude, "Tell me about the weather.", max_tokens=3)
    assert short.stop_reason == "max_tokens" and len(short.content[0].text.split()) == 3  # type: ignore[union-attr]
    assert short.usage.output_tokens <= 3
    cut = await ask_claude(claude, "Say something.", stop_sequences=["zz", "e"])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "e"
    assert "e" not in cut.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("version", ["v1beta", "v1"])
async def test_gemini_answer_and_usage(srv: SimServer, version: str) -> None:
    sdk = make_gemini(srv, version=version)
    try:
        # v1 has no systemInstruction (generativelanguage v1 proto); the real v1 refuses it, as strict mode does
        system = {"system_instruction": "Answer with one letter."} if version == "v1beta" else {}
        result = await ask_gemini(sdk, MC_PROMPT, temperature=0, **system)
        short = await ask_gemini(sdk, "Tell me about the weather.", max_output_tokens=2)
    finally:
        await sdk.aio.aclose()
    assert result.text in {"A", "B", "C", "D"}
    candidate = result.candidates[0]  # type: ignore[index]
    assert candidate.finish_reason == genai_types.FinishReason.STOP and candidate.content.role == "model"  # type: ignore[union-attr]
    assert result.model_version == "sim-a" and result.response_id
    usage = result.usage_metadata
    assert usage is not None and usage.prompt_token_count and usage.candidates_token_count == 1
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    assert short.candidates[0].finish_reason == genai_types.FinishReason.MAX_TOKENS  # type: ignore[index]
    assert len((short.text or "").split()) == 2
    assert result.sdk_http_response is not None and result.sdk_http_response.headers is not None
    assert srv.stats()["by_route"] == {**NO_ROUTES, "gemini": 2}


async def test_one_conversation_gets_one_answer_and_digest_in_every_format(
        srv: SimServer, oa: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic, gemini: genai.Client) -> None:
    params = {"temperature": 0, "top_p": 1, "max_tokens": 12, "stop": ["zz"]}
    via_openai = (await ask(oa, CONVERSATION, **params)).choices[0].message.content
    turns = [{"role": m["role"], "content": m["content"]} for m in CONVERSATION[1:]]
    # anthropic 2.x no longer takes temperature/top_p as arguments; the wire field still exists.
    via_claude = await claude.messages.create(model="sim-a", max_tokens=12, system="Be brief.", messages=turns,
                                              stop_sequences=["zz"], extra_body={"temperature": 0, "top_p": 1},
                                              # the SDK's default version (2026-10-21) refuses any temperature
                                              extra_headers={"anthropic-version": "2023-06-01"})
    contents = [genai_types.Content(role="model" if m["role"] == "assistant" else "user",
                                    parts=[genai_types.Part(text=m["content"])]) for m in turns]
    via_gemini = await gemini.aio.models.generate_content(model="sim-a", contents=contents,  # type: ignore[arg-type]
                                                          config=genai_types.GenerateContentConfig(
        system_instruction="Be brief.", temperature=0, top_p=1, max_output_tokens=12, stop_sequences=["zz"]))
    assert via_openai == via_claude.content[0].text == via_gemini.text  # type: ignore[union-attr]
    assert via_openai == simulated_reply("sim-a", CONVERSATION, temperature=0, max_tokens=12, top_p=1,
                                                   stop=["zz"])[0]
    assert srv.stats()["completed_by_digest"] == {digest(CONVERSATION): 3}
    assert srv.stats()["by_route"] == {"openai": 1, "anthropic": 1, "gemini": 1}
    # snake_case fields (what a hand-written client might send) mean the same as google-genai's camelCase
    status, _, text = await raw_post(srv, "/v1beta/models/sim-a:generateContent", {
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "contents": [c.model_dump(exclude_none=True) for c in contents],
        "generation_config": {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 12, "stop_sequences": ["zz"]},
    }, {"x-goog-api-key": "test-key"})
    assert status == 200 and json.loads(text)["candidates"][0]["content"]["parts"][0]["text"] == via_openai


async def test_bad_anthropic_and_gemini_requests(srv: SimServer, gemini: genai.Client) -> None:
    key = {"x-api-key": "test-key"}
    status, _, text = await raw_post(srv, "/v1/messages", {"model": "sim-a", "messages": user("hi")}, key)
    body = json.loads(text)
    assert status == 400 and body["type"] == "error" and body["error"] == {
        "type": "invalid_request_error", "message": "max_tokens: Field required"}
    status, _, text = await raw_post(srv, "/v1/messages", {"model": "sim-a", "max_tokens": 5,
                                                           "messages": [{"role": "system", "content": "x"}]}, key)
    assert status == 400 and "messages.0.role" in json.loads(text)["error"]["message"]
    status, _, text = await raw_post(srv, "/v1/models/sim-a:generateContent", {"contents": []},
                                     {"x-goog-api-key": "test-key"})
    assert status == 400 and json.loads(text)["error"]["status"] == "INVALID_ARGUMENT"
    with pytest.raises(genai_errors.ClientError) as caught:
        await ask_gemini(gemini, candidate_count=2)
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    status, _, text = await raw_post(srv, "/v1beta/models/sim-a:countTokens", {"contents": []},
                                     {"x-goog-api-key": "test-key"})
    assert status == 400 and "contents is not specified" in json.loads(text)["error"]["message"]
    status, _, _ = await raw_post(srv, "/v1beta/models/sim-a:embedContent", {"contents": []})
    assert status == 404
    assert srv.stats()["by_status"] == {"400": 4}, "count requests are not model requests"


# -- keys ------------------------------------------------------------------------------------------------------

SECRET = "sk-never-echo-this-key"


async def test_missing_key_in_each_format(srv: SimServer) -> None:
    hi = {"model": "sim-a", "max_tokens": 5, "messages": user("hi")}
    status, _, text = await raw_post(srv, "/v1/messages", hi)
    assert status == 401 and json.loads(text)["error"] == {"type": "authentication_error",
                                                           "message": "x-api-key header is required"}
    status, _, text = await raw_post(srv, "/v1beta/models/sim-a:generateContent", {"contents": [{"parts": []}]})
    assert status == 403 and json.loads(text)["error"]["status"] == "PERMISSION_DENIED"
    # Each format's own header: x-api-key (or the Bearer header anthropic 2.x sends), x-goog-api-key or ?key=
    assert (await raw_post(srv, "/v1/messages", hi, {"x-api-key": "k"}))[0] == 200
    assert (await raw_post(srv, "/v1/messages", hi, {"Authorization": "Bearer k"}))[0] == 200
    contents = {"contents": [{"parts": [{"text": "hi"}]}]}
    assert (await raw_post(srv, "/v1beta/models/sim-a:generateContent?key=k", contents))[0] == 200
    assert (await raw_post(srv, "/v1/models/sim-a:generateContent", contents, {"x-goog-api-key": "k"}))[0] == 200
    assert (await raw_post(srv, "/v1/models/sim-a:generateContent", contents, {"Authorization": "Bearer k"}))[0] \
        == 403
    srv.configure(require_key=False)
    assert (await raw_post(srv, "/v1/messages", hi))[0] == 200
    assert (await raw_post(srv, "/v1/models/sim-a:generateContent", contents))[0] == 200


async def test_wrong_key_in_each_format_and_the_key_is_never_echoed(srv: SimServer) -> None:
    srv.configure(api_key="the-right-key")
    openai_sdk, claude_sdk, gemini_sdk = make_openai(srv), make_claude(srv, SECRET), make_gemini(srv, SECRET)
    openai_sdk.api_key = SECRET
    try:
        with pytest.raises(openai.AuthenticationError) as oa_error:
            await ask(openai_sdk, user("hi"))
        with pytest.raises(anthropic.AuthenticationError) as an:
            await ask_claude(claude_sdk)
        with pytest.raises(genai_errors.ClientError) as ge:
            await ask_gemini(gemini_sdk)
    finally:
        await openai_sdk.close(), await claude_sdk.close(), await gemini_sdk.aio.aclose()
    assert oa_error.value.code == "invalid_api_key" and oa_error.value.body["message"].startswith(  # type: ignore[index]
        "Incorrect API key provided")
    assert an.value.type == "authentication_error" and an.value.status_code == 401
    assert ge.value.code == 400 and ge.value.status == "INVALID_ARGUMENT"
    assert ge.value.details["error"]["details"] == [{  # type: ignore[index]
        "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
        "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]
    for exc in (oa_error.value, an.value, ge.value):
        assert SECRET not in str(exc) and SECRET not in str(getattr(exc, "body", "")) + str(ge.value.details)
    # With api_key set, a key is needed even when require_key is off; the right one passes.
    srv.configure(require_key=False)
    status, headers, text = await raw_post(srv, "/v1/messages", {"model": "m", "max_tokens": 1,
                                                                 "messages": user("hi")})
    assert status == 401
    right = {"x-api-key": "the-right-key"}
    assert (await raw_post(srv, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": user("hi")}, right))[0] \
        == 200
    assert SECRET not in json.dumps(srv.stats())
    status, config = await sim_http(srv, "POST", "/sim/config", {"fault_500": 0})
    assert status == 200 and config["api_key"] == "***" and "the-right-key" not in repr(srv.config)


# -- faults in every format -------------------------------------------------------------------------------------


async def test_fault_401(srv: SimServer, oa: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic,
                         gemini: genai.Client) -> None:
    srv.configure(fault_401=1.0)
    with pytest.raises(openai.AuthenticationError) as oa_error:
        await ask(oa, user("hi"))
    with pytest.raises(anthropic.AuthenticationError) as an:
        await ask_claude(claude)
    with pytest.raises(genai_errors.ClientError) as ge:
        await ask_gemini(gemini)
    assert oa_error.value.code == "invalid_api_key" and oa_error.value.status_code == 401
    assert an.value.type == "authentication_error"
    assert ge.value.code == 400 and ge.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"  # type: ignore[index]
    assert srv.stats()["by_status"] == {"401": 2, "400": 1}


async def test_fault_quota(srv: SimServer, oa: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic,
                           gemini: genai.Client) -> None:
    srv.configure(fault_quota=1.0, retry_after=0.5)
    with pytest.raises(openai.RateLimitError) as oa_error:
        await ask(oa, user("hi"))
    # 402: anthropic's own class from 2.10, its status error before (the project's floor is 2.0)
    with pytest.raises(getattr(anthropic, "PaymentRequiredError", anthropic.APIStatusError)) as an:
        await ask_claude(claude)
    with pytest.raises(genai_errors.ClientError) as ge:
        await ask_gemini(gemini)
    assert oa_error.value.code == oa_error.value.type == "insufficient_quota"
    assert oa_error.value.body["message"].startswith(  # type: ignore[index]
        "You exceeded your current quota, please check your plan and billing details")
    assert oa_error.value.response.headers["retry-after"] == "0.5"
    assert an.value.type == "billing_error" and an.value.status_code == 402
    # the body's message (the error's api_message holds it too, but only in newer anthropic SDKs)
    assert an.value.body["error"]["message"].startswith("Your credit balance is too low")  # type: ignore[index]
    assert ge.value.code == 429 and ge.value.status == "RESOURCE_EXHAUSTED"
    details = ge.value.details["error"]["details"]  # type: ignore[index]
    assert details[0]["violations"][0]["quotaId"] == "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
    assert details[1] == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.5s"}


async def test_fault_429(srv: SimServer, claude: anthropic.AsyncAnthropic, gemini: genai.Client) -> None:
    srv.configure(fault_429=1.0, retry_after=0.25)
    with pytest.raises(anthropic.RateLimitError) as an:
        await ask_claude(claude)
    assert an.value.type == "rate_limit_error" and an.value.response.headers["retry-after"] == "0.25"
    with pytest.raises(genai_errors.ClientError) as ge:
        await ask_gemini(gemini)
    assert ge.value.code == 429 and ge.value.status == "RESOURCE_EXHAUSTED"
    quota, retry = ge.value.details["error"]["details"]  # type: ignore[index]
    assert quota["violations"][0]["quotaId"] == "GenerateRequestsPerMinutePerProjectPerModel"
    assert retry == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.25s"}
    # google-genai on aiohttp: the error's .response is the raw aiohttp.ClientResponse, headers included
    assert ge.value.response.headers["retry-after"] == "0.25"  # type: ignore[union-attr]


async def test_fault_500_and_503(srv: SimServer, oa: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic,
                                 gemini: genai.Client) -> None:
    srv.configure(fault_500=1.0)
    with pytest.raises(anthropic.InternalServerError) as an:
        await ask_claude(claude)
    assert an.value.type == "api_error" and an.value.status_code == 500
    with pytest.raises(genai_errors.ServerError) as ge:
        await ask_gemini(gemini)
    assert ge.value.code == 500 and ge.value.status == "INTERNAL"
    srv.configure(fault_500=0.0, fault_503=1.0)
    with pytest.raises(openai.InternalServerError) as oa_error:
        await ask(oa, user("hi"))
    assert oa_error.value.status_code == 503 and oa_error.value.type == "server_error"
    with pytest.raises(anthropic.OverloadedError) as over:  # a subclass of anthropic.InternalServerError
        await ask_claude(claude)
    assert over.value.status_code == 529 and over.value.type == "overloaded_error"
    with pytest.raises(genai_errors.ServerError) as unavailable:
        await ask_gemini(gemini)
    assert unavailable.value.code == 503 and unavailable.value.status == "UNAVAILABLE"
    assert srv.stats()["by_status"] == {"500": 2, "503": 2, "529": 1}


async def test_fault_malformed_json(srv: SimServer, oa: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic,
                                    gemini: genai.Client) -> None:
    srv.configure(fault_malformed=1.0)
    status, headers, text = await raw_post(srv, "/v1/chat/completions", {"model": "m", "messages": user("hi")},
                                           {"Authorization": "Bearer k"})
    assert status == 200 and headers["Content-Type"] == "application/json" and text.startswith('{"id":"chatcmpl-')
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    # For the runner: none of the three SDKs wraps a 200 whose body is not JSON. openai 3.54, anthropic 2.12 and
    # google-genai 3.4 all raise the bare json.JSONDecodeError (a ValueError), not an SDK error class.
    with pytest.raises(json.JSONDecodeError):
        await ask(oa, user("hi"))
    with pytest.raises(json.JSONDecodeError):
        await ask_claude(claude)
    with pytest.raises(json.JSONDecodeError):
        await ask_gemini(gemini)
    stats = srv.stats()
    assert stats["by_status"] == {"200": 4} and stats["completed_by_digest"] == {}


async def test_fault_filter(srv: SimServer, oa: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic,
                            gemini: genai.Client) -> None:
    srv.configure(fault_filter=1.0)
    result = await ask(oa, user("hi"))
    assert result.choices[0].finish_reason == "content_filter" and result.choices[0].message.content is None
    message = await ask_claude(claude)
    assert message.stop_reason == "refusal" and message.content == [] and message.usage.output_tokens == 0
    response = await ask_gemini(gemini)
    candidate = response.candidates[0]  # type: ignore[index]
    assert candidate.finish_reason == genai_types.FinishReason.SAFETY and candidate.content is None
    assert response.text is None
    assert srv.stats()["completed_by_digest"] == {digest(user("hi")): 3}  # delivered, so counted


async def test_hang_times_out_each_sdk(own_srv: SimServer) -> None:
    own_srv.configure(fault_timeout=1.0, hang_seconds=5)
    claude_sdk = make_claude(own_srv, timeout=0.2)
    gemini_sdk = make_gemini(own_srv, timeout=200)  # milliseconds
    try:
        with pytest.raises(anthropic.APITimeoutError):
            await ask_claude(claude_sdk)
        # google-genai on aiohttp raises the builtin TimeoutError (from asyncio.timeout), not a genai error class.
        with pytest.raises(TimeoutError):
            await ask_gemini(gemini_sdk)
    finally:
        await claude_sdk.close(), await gemini_sdk.aio.aclose()
    await own_srv.close()
    assert own_srv.stats()["by_status"] == {"499": 2}


# -- rate limits in the Anthropic and Gemini formats -------------------------------------------------------------


async def test_anthropic_rate_limit_headers_and_otpm(srv: SimServer, claude: anthropic.AsyncAnthropic,
                                                     now: list[float]) -> None:
    srv.configure(rpm=10, tpm=1000, itpm=600, otpm=120)
    started = time.time()
    remaining: dict[str, list[int]] = {}
    for _ in range(2):
        raw = await claude.messages.with_raw_response.create(model="sim-a", max_tokens=50,
                                                             messages=[{"role": "user", "content": "hi"}])
        input_tokens = (await raw.parse()).usage.input_tokens
        for kind, limit in (("requests", 10), ("tokens", 1000), ("input-tokens", 600), ("output-tokens", 120)):
            assert raw.headers[f"anthropic-ratelimit-{kind}-limit"] == str(limit)
            remaining.setdefault(kind, []).append(int(raw.headers[f"anthropic-ratelimit-{kind}-remaining"]))
            reset = datetime.fromisoformat(raw.headers[f"anthropic-ratelimit-{kind}-reset"])
            assert reset.tzinfo is not None and started - 1 <= reset.timestamp() <= started + 62
    assert remaining == {"requests": [9, 8], "tokens": [1000 - (input_tokens + 50), 1000 - 2 * (input_tokens + 50)],
                         "input-tokens": [600 - input_tokens, 600 - 2 * input_tokens], "output-tokens": [70, 20]}
    assert "x-ratelimit-limit-requests" not in raw.headers
    with pytest.raises(anthropic.RateLimitError) as caught:  # 50 output tokens wanted, 20 left, 2 back per second
        await ask_claude(claude, max_tokens=50)
    assert caught.value.type == "rate_limit_error" and "output tokens" in caught.value.message
    headers = caught.value.response.headers
    assert headers["retry-after"] == "15" and headers["anthropic-ratelimit-output-tokens-remaining"] == "20"
    now[0] += 15
    assert (await ask_claude(claude, max_tokens=50)).stop_reason in {"end_turn", "max_tokens"}


async def test_gemini_rate_limit_has_retry_info_and_no_headers(srv: SimServer, gemini: genai.Client,
                                                               now: list[float]) -> None:
    srv.configure(rpm=2, tpm=100000)
    first = await ask_gemini(gemini)
    headers = first.sdk_http_response.headers or {}  # type: ignore[union-attr]
    assert not [name for name in headers if "ratelimit" in name.lower()]
    await ask_gemini(gemini)
    now[0] += 0.5
    with pytest.raises(genai_errors.ClientError) as caught:
        await ask_gemini(gemini)
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"
    quota, retry = caught.value.details["error"]["details"]  # type: ignore[index]
    assert quota["violations"][0]["quotaId"] == "GenerateRequestsPerMinutePerProjectPerModel"
    assert quota["violations"][0]["quotaValue"] == "2"
    assert retry["retryDelay"] == "29.5s"
    status, headers, _ = await raw_post(srv, "/v1beta/models/sim-a:generateContent",
                                        {"contents": [{"parts": [{"text": "hi"}]}]}, {"x-goog-api-key": "k"})
    assert status == 429 and headers["retry-after"] == "29.5"
    assert not [name for name in headers if "ratelimit" in name.lower()]


# -- configuration ------------------------------------------------------------------------------------------------


async def test_every_config_field_is_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SimConfig] = []
    monkeypatch.setattr(simserver_cli, "serve", lambda host, port, config: seen.append(config))
    simserver_cli.main(["--port", "0", "--fault-503", "0.1", "--itpm", "1000", "--otpm", "200", "--tpm", "5000",
                    "--fault-401", "0.2", "--fault-quota", "0.3", "--fault-malformed", "0.4", "--fault-filter",
                    "0.5", "--api-key", "abc", "--no-require-key"])
    assert seen == [SimConfig(fault_503=0.1, itpm=1000, otpm=200, tpm=5000, fault_401=0.2, fault_quota=0.3,
                              fault_malformed=0.4, fault_filter=0.5, api_key="abc", require_key=False)]
    for bad in ({"tpm": 0}, {"itpm": 1.5}, {"api_key": ""}, {"fault_503": 2}):
        with pytest.raises(ValueError):
            SimConfig(**bad)


async def test_a_reset_empties_the_clouds_buckets(own_srv: SimServer) -> None:
    from simserver import gcs, s3

    s3.put(own_srv, "bucket", "in/a.jsonl", b"{}")
    gcs.objects_of(own_srv).put("bucket", "in/a.jsonl", b"{}")
    assert s3.objects(own_srv) and gcs.objects_of(own_srv).listed("bucket")
    own_srv.reset()
    assert not s3.objects(own_srv) and not gcs.objects_of(own_srv).listed("bucket")
