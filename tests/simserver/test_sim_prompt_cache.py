"""The simulated server caches prompts as each API documents it, read through the official SDKs' usage types.

Every expected count is worked out here from the documented rules and the server's token rule (3 tokens a request,
3 a message, one per four characters), not taken from simserver.prompt_cache: OpenAI reads the longest cached prefix
of 1,024 + 128·k tokens; Anthropic only at a ``cache_control`` breakpoint past the model's minimum, writing up to
its last breakpoint; Gemini reads implicitly from 1,024 tokens; nothing is cached before its request is answered;
an entry lapses five minutes after its last use (Anthropic's ``ttl: "1h"``: an hour)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from simserver import SimConfig, SimServer, start_server

#: a shared instruction of 5,000 characters: 1,250 tokens
SHARED = ("Read the passage and answer with one letter. " * 112)[:5000]


def tokens(text: str) -> int:
    return (len(text) + 3) // 4


def prompt(system: str, user: str) -> int:
    """The server's count of a system + user prompt."""
    return 3 + 3 + tokens(system) + 3 + tokens(user)


@pytest.fixture
async def srv():
    async with await start_server(SimConfig()) as server:
        yield server


@pytest.fixture
async def oa(srv: SimServer):
    async with openai.AsyncOpenAI(base_url=srv.url, api_key="k", max_retries=0) as client:
        yield client


@pytest.fixture
async def claude(srv: SimServer):
    async with anthropic.AsyncAnthropic(base_url=srv.root_url, api_key="k", max_retries=0) as client:
        yield client


async def ask_openai(client: openai.AsyncOpenAI, user: str, model: str = "gpt-4o") -> Any:
    answer = await client.chat.completions.create(model=model, max_tokens=5, messages=[
        {"role": "system", "content": SHARED}, {"role": "user", "content": user}])
    return answer.usage


async def test_openai_reads_the_longest_cached_prefix_in_128_token_steps_from_1024(
        srv: SimServer, oa: openai.AsyncOpenAI):
    client = oa
    first = await ask_openai(client, "Question one: which option? A) x B) y")
    assert first.prompt_tokens == prompt(SHARED, "Question one: which option? A) x B) y")
    assert first.prompt_tokens_details.cached_tokens == 0
    second = await ask_openai(client, "Another question entirely")
    # shared: the request's 3, the system message (3 + 1,250) and the user message's 3 header tokens = 1,259;
    # "Question one..." and "Another ..." differ in their first four characters
    shared = 3 + 3 + 1250 + 3
    assert second.prompt_tokens_details.cached_tokens == 1024 + 128 * ((shared - 1024) // 128) == 1152
    assert srv.stats()["prompt_cache"]["hits"] == 1


async def test_openai_caches_nothing_under_1024_tokens_and_per_model(srv: SimServer, oa: openai.AsyncOpenAI):
    client = oa
    short = [{"role": "user", "content": "x" * 4000}]  # 3 + 3 + 1,000 tokens
    for _ in range(2):
        usage = (await client.chat.completions.create(model="gpt-4o", max_tokens=5, messages=short)).usage
        assert usage.prompt_tokens == 1006 and usage.prompt_tokens_details.cached_tokens == 0
    await ask_openai(client, "q1")
    assert (await ask_openai(client, "q2", model="gpt-4.1")).prompt_tokens_details.cached_tokens == 0, \
        "another model has a cache of its own"


async def test_requests_sent_together_all_miss_and_the_next_one_reads(srv: SimServer, oa: openai.AsyncOpenAI):
    srv.configure(latency=0.2)
    client = oa
    together = await asyncio.gather(*(ask_openai(client, f"question {i}") for i in range(4)))
    assert [u.prompt_tokens_details.cached_tokens for u in together] == [0, 0, 0, 0]
    assert (await ask_openai(client, "question 9")).prompt_tokens_details.cached_tokens > 0


async def test_an_entry_lapses_five_minutes_after_its_last_use(srv: SimServer, oa: openai.AsyncOpenAI):
    now = [1000.0]
    srv.clock = lambda: now[0]
    client = oa
    await ask_openai(client, "q1")
    now[0] += 299
    assert (await ask_openai(client, "q2")).prompt_tokens_details.cached_tokens > 0, "read, and so refreshed"
    now[0] += 299
    assert (await ask_openai(client, "q3")).prompt_tokens_details.cached_tokens > 0
    now[0] += 301
    assert (await ask_openai(client, "q4")).prompt_tokens_details.cached_tokens == 0


async def test_caching_off_reads_nothing(srv: SimServer, oa: openai.AsyncOpenAI):
    srv.configure(prompt_cache=False)
    client = oa
    await ask_openai(client, "q1")
    assert (await ask_openai(client, "q2")).prompt_tokens_details.cached_tokens == 0
    assert "prompt_cache" not in srv.stats()


async def ask_claude(client: anthropic.AsyncAnthropic, user: str, *, mark: dict[str, Any] | None,
                     model: str = "claude-opus-4-1") -> Any:
    block: dict[str, Any] = {"type": "text", "text": SHARED}
    if mark is not None:
        block["cache_control"] = mark
    answer = await client.messages.create(model=model, max_tokens=5, system=[block],
                                          messages=[{"role": "user", "content": user}])
    return answer.usage


async def test_anthropic_caches_only_at_a_breakpoint_and_bills_the_write(
        srv: SimServer, claude: anthropic.AsyncAnthropic):
    client = claude
    unmarked = [await ask_claude(client, q, mark=None) for q in ("q1", "q2")]
    assert [(u.cache_read_input_tokens, u.cache_creation_input_tokens) for u in unmarked] == [(0, 0), (0, 0)]
    at_mark = 3 + 3 + 1250  # the request, the system message's header and its text
    total = prompt(SHARED, "q1")
    first = await ask_claude(client, "q1", mark={"type": "ephemeral"})
    assert (first.cache_creation_input_tokens, first.cache_read_input_tokens) == (at_mark, 0)
    assert first.input_tokens == total - at_mark, "input_tokens: only what follows the breakpoint"
    assert first.cache_creation.ephemeral_5m_input_tokens == at_mark
    second = await ask_claude(client, "another question", mark={"type": "ephemeral"})
    assert (second.cache_creation_input_tokens, second.cache_read_input_tokens) == (0, at_mark)


async def test_anthropic_one_hour_writes_and_the_models_minimum(srv: SimServer, claude: anthropic.AsyncAnthropic):
    client = claude
    hour = await ask_claude(client, "q1", mark={"type": "ephemeral", "ttl": "1h"})
    assert hour.cache_creation.ephemeral_1h_input_tokens == 3 + 3 + 1250
    assert hour.cache_creation.ephemeral_5m_input_tokens == 0
    # 1,256 tokens are under Claude Haiku 4.5's minimum of 4,096: not cached, billed as plain input
    small = [await ask_claude(client, q, mark={"type": "ephemeral"}, model="claude-haiku-4-5") for q in ("a", "b")]
    assert [(u.cache_creation_input_tokens, u.cache_read_input_tokens) for u in small] == [(0, 0), (0, 0)]
    assert small[1].input_tokens == prompt(SHARED, "b")


async def test_a_top_level_cache_control_marks_the_last_block(srv: SimServer, claude: anthropic.AsyncAnthropic):
    client = claude
    messages = [{"role": "user", "content": SHARED}]
    first = await client.messages.create(model="claude-opus-4-1", max_tokens=5, messages=messages,
                                         extra_body={"cache_control": {"type": "ephemeral"}})
    assert first.usage.cache_creation_input_tokens == 3 + 3 + 1250 and first.usage.input_tokens == 0
    again = await client.messages.create(model="claude-opus-4-1", max_tokens=5, messages=messages,
                                         extra_body={"cache_control": {"type": "ephemeral"}})
    assert again.usage.cache_read_input_tokens == 3 + 3 + 1250


async def test_gemini_reads_implicitly_from_1024_tokens(srv: SimServer):
    client = genai.Client(api_key="k", http_options=genai_types.HttpOptions(
        base_url=srv.root_url, api_version="v1beta", retry_options=genai_types.HttpRetryOptions(attempts=1)))

    async def ask(user: str) -> Any:
        answer = await client.aio.models.generate_content(
            model="gemini-2.5-flash", contents=user,
            config=genai_types.GenerateContentConfig(system_instruction=SHARED, max_output_tokens=5))
        return answer.usage_metadata

    first = await ask("q1")
    assert not first.cached_content_token_count
    second = await ask("another")
    assert second.cached_content_token_count == 1152
    assert second.prompt_token_count == prompt(SHARED, "another")


async def test_the_strict_server_refuses_a_fifth_breakpoint_and_an_hour_after_five_minutes(
        srv: SimServer, claude: anthropic.AsyncAnthropic):
    def block(text: str, ttl: str | None = None) -> dict[str, Any]:
        mark = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        return {"type": "text", "text": text, "cache_control": mark}

    four = [block(f"part {i}") for i in range(4)]
    await client_create(claude, system=four)  # four marks are allowed
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control may be provided. "
                                                        "Found 5."):
        await client_create(claude, system=[*four, block("part 5")])
    await client_create(claude, system=[block("long", "1h"), block("short", "5m")])
    with pytest.raises(anthropic.BadRequestError, match="ttl '1h' must not come after"):
        await client_create(claude, system=[block("short", "5m"), block("long", "1h")])


async def client_create(client: anthropic.AsyncAnthropic, **fields: Any) -> Any:
    return await client.messages.create(model="claude-opus-4-1", max_tokens=5,
                                        messages=[{"role": "user", "content": "q"}], **fields)


async def test_what_follows_a_breakpoint_is_not_part_of_what_it_caches(
        srv: SimServer, claude: anthropic.AsyncAnthropic):
    """A breakpoint two characters into a four-character token: the text after it differs between the requests
    and must not make the second miss."""
    head = SHARED + "Question:"  # 5,009 characters: the breakpoint falls inside a token

    async def ask(tail: str) -> Any:
        answer = await claude.messages.create(
            model="claude-opus-4-1", max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "text", "text": head, "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": tail}]}])
        return answer.usage

    first, second = await ask(" Why?"), await ask(" How?")
    mark = 3 + 3 + tokens(head)
    assert (first.cache_creation_input_tokens, second.cache_read_input_tokens) == (mark, mark)
