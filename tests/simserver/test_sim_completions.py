"""The simulated server's OpenAI legacy Completions (``/v1/completions`` with echo and logprobs), through the
official openai SDK over 127.0.0.1 only."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from simserver import SimServer
from simserver.completions import token_logprobs, tokens

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def score(oa: openai.AsyncOpenAI, context: str, continuation: str) -> float:
    """The log-likelihood of ``continuation`` after ``context``, the way evaluation harnesses ask for it."""
    done = await oa.completions.create(model="sim-lm", prompt=context + continuation, max_tokens=0, echo=True,
                                           logprobs=0)
    lp = done.choices[0].logprobs
    assert lp is not None and lp.text_offset is not None and lp.token_logprobs is not None
    return sum(x for x, at in zip(lp.token_logprobs, lp.text_offset, strict=True) if at >= len(context))


async def raw(srv: SimServer, payload: Any, key: str = "test-key") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            srv.url + "/completions", data=json.dumps(payload), headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.json()


async def test_tokens_round_trip() -> None:
    for text in ("", "Hello, world!", "  two  spaces\n\nand lines  ", "Ünïcode — dash... ok?", "a\tb"):
        assert "".join(tokens(text)) == text
    assert tokens("The cat, sat.") == ["The", " cat", ",", " sat", "."]


async def test_echo_with_logprobs_shape(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    prompt = "The capital of France is"
    done = await oa.completions.create(model="sim-lm", prompt=prompt, max_tokens=4, echo=True, logprobs=3)
    assert done.object == "text_completion" and done.model == "sim-lm" and len(done.choices) == 1
    choice = done.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert "".join(lp.tokens) == choice.text
    assert lp.tokens[:5] == ["The", " capital", " of", " France", " is"]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 9
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
    assert all(x < 0 for x in lp.token_logprobs[1:])
    offsets, at = [], 0
    for tok in lp.tokens:
        offsets.append(at)
        at += len(tok)
    assert lp.text_offset == offsets
    for tok, x, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert len(top) == 3 and all(v < 0 for v in top.values())
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert tok not in top or top[tok] == x
        assert sum(2.718281828 ** v for v in top.values()) < 1.0 + 1e-9
    assert lp.token_logprobs[1:5] == token_logprobs("sim-lm", prompt)[1:]  # the documented pure function
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (5, 4, 9)
    assert srv.stats()["by_route"]["openai"] == 1 and srv.stats()["by_status"] == {"200": 1}


async def test_without_echo_only_generated_tokens_with_offsets_after_the_prompt(oa: openai.AsyncOpenAI) -> None:
    prompt = "Once upon a time"
    done = await oa.completions.create(model="sim-lm", prompt=prompt, max_tokens=50, logprobs=1)
    choice = done.choices[0]
    assert not choice.text.startswith(prompt) and choice.text.startswith(" ")
    assert choice.finish_reason == "stop"  # the sentence ended before 50 tokens
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs and lp.text_offset and lp.tokens
    assert "".join(lp.tokens) == choice.text and lp.text_offset[0] == len(prompt)
    assert all(x is not None and x < 0 for x in lp.token_logprobs)
    assert done.usage is not None and done.usage.completion_tokens == len(lp.tokens)
    plain = await oa.completions.create(model="sim-lm", prompt=prompt, max_tokens=50)
    assert plain.choices[0].text == choice.text and plain.choices[0].logprobs is None


async def test_deterministic(oa: openai.AsyncOpenAI) -> None:
    runs = [await oa.completions.create(model="sim-lm", prompt="Repeat after me: hello", max_tokens=3,
                                            echo=True, logprobs=2) for _ in range(2)]
    first, second = (r.choices[0] for r in runs)
    assert first.text == second.text
    assert first.logprobs == second.logprobs
    other = await oa.completions.create(model="sim-other", prompt="Repeat after me: hello", max_tokens=3,
                                            echo=True, logprobs=2)
    assert other.choices[0].logprobs != first.logprobs  # the model is part of the hash


async def test_logprobs_depend_on_the_context(oa: openai.AsyncOpenAI) -> None:
    # The same continuation scores differently after different contexts ...
    a = await score(oa, "The weather today is", " sunny and warm")
    b = await score(oa, "My favourite colour is", " sunny and warm")
    assert a != b and a < 0 and b < 0
    # ... and a continuation that repeats a word of its context scores higher than one that does not.
    repeated = await score(oa, "My pet is a cat. Every morning I feed my", " cat")
    unseen = await score(oa, "My pet is a dog. Every morning I feed my", " cat")
    assert repeated > unseen
    assert repeated == pytest.approx(sum(token_logprobs("sim-lm", " cat", "My pet is a cat. Every morning I feed my")))


async def test_list_prompts_give_one_choice_each(oa: openai.AsyncOpenAI) -> None:
    prompts = ["Question: 2+2? Answer: 4", "Question: 2+2? Answer: 5", "Another prompt"]
    done = await oa.completions.create(model="sim-lm", prompt=prompts, max_tokens=0, echo=True, logprobs=0)
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert [c.text for c in done.choices] == prompts
    assert all(c.finish_reason == "length" for c in done.choices)
    singles = [await oa.completions.create(model="sim-lm", prompt=p, max_tokens=0, echo=True, logprobs=0)
               for p in prompts]
    assert [c.logprobs for c in done.choices] == [s.choices[0].logprobs for s in singles]
    assert done.choices[0].logprobs and done.choices[0].logprobs.top_logprobs
    assert done.choices[0].logprobs.top_logprobs[1] == {}  # logprobs=0: no alternatives
    assert done.usage is not None and done.usage.prompt_tokens == sum(len(tokens(p)) for p in prompts)
    assert done.usage.completion_tokens == 0


async def test_max_tokens_zero_generates_nothing(oa: openai.AsyncOpenAI) -> None:
    done = await oa.completions.create(model="sim-lm", prompt="Just score me.", max_tokens=0, echo=True,
                                           logprobs=1)
    choice = done.choices[0]
    assert choice.text == "Just score me." and choice.finish_reason == "length"
    assert choice.logprobs and choice.logprobs.tokens == ["Just", " score", " me", "."]
    assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (4, 0)
    bare = await oa.completions.create(model="sim-lm", prompt="Just score me.", max_tokens=0)
    assert bare.choices[0].text == "" and bare.choices[0].finish_reason == "length"


async def test_stop_and_max_tokens_cut_the_generated_text(oa: openai.AsyncOpenAI) -> None:
    full = (await oa.completions.create(model="sim-lm", prompt="Tell me", max_tokens=100)).choices[0].text
    words = full.split(" ")
    cut = await oa.completions.create(model="sim-lm", prompt="Tell me", max_tokens=2)
    assert cut.choices[0].text == " ".join(words[:3]) and cut.choices[0].finish_reason == "length"
    stopped = await oa.completions.create(model="sim-lm", prompt="Tell me", max_tokens=100, stop=[words[3]])
    assert stopped.choices[0].text == full[:full.index(words[3])] and stopped.choices[0].finish_reason == "stop"


async def test_bad_requests(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    for payload, param in (({"prompt": "hi"}, "model"), ({"model": "sim-lm"}, "prompt"),
                           ({"model": "sim-lm", "prompt": [1, 2]}, "prompt"),
                           ({"model": "sim-lm", "prompt": "hi", "logprobs": 6}, "logprobs"),
                           ({"model": "sim-lm", "prompt": "hi", "max_tokens": -1}, "max_tokens"),
                           ({"model": "sim-lm", "prompt": "hi", "n": 2}, "n")):
        status, body = await raw(srv, payload)
        assert status == 400, payload
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param
    with pytest.raises(openai.BadRequestError, match="prompt"):
        await oa.completions.create(model="sim-lm", prompt=None)
    with pytest.raises(openai.BadRequestError, match="model"):
        await oa.completions.create(model="", prompt="hi")
    assert srv.stats()["by_status"] == {"400": 8}


async def test_key_check_rate_limits_faults_and_stats(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    status, body = await raw(srv, {"model": "sim-lm", "prompt": "hi"}, key="")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    srv.configure(rpm=2)
    for _ in range(2):
        await oa.completions.create(model="sim-lm", prompt="hi", max_tokens=1)
    with pytest.raises(openai.RateLimitError):
        await oa.completions.create(model="sim-lm", prompt="hi", max_tokens=1)
    srv.configure(rpm=None, fault_500=1.0)
    with pytest.raises(openai.InternalServerError):
        await oa.completions.create(model="sim-lm", prompt="hi", max_tokens=1)
    srv.configure(fault_500=0.0, fault_filter=1.0)
    filtered = await oa.completions.create(model="sim-lm", prompt="hi", max_tokens=5, echo=True)
    assert filtered.choices[0].finish_reason == "content_filter" and filtered.choices[0].text == "hi"
    stats = srv.stats()
    assert stats["received"] == 6 and stats["by_route"]["openai"] == 6
    assert stats["by_status"] == {"401": 1, "200": 3, "429": 1, "500": 1}
    assert sum(stats["completed_by_digest"].values()) == 3
