"""Gemini's explicit cached contents on the simulated server, through the google-genai SDK.

Expected figures are worked out here from the documented API (ai.google.dev/gemini-api/docs/caching, "Explicit
caching"; ai.google.dev/api/caching) and the server's token rule (3 tokens a request, 3 a message, one per four
characters), not read from simserver.cached_contents."""

from __future__ import annotations

import datetime
from typing import Any

import aiohttp
import pytest
from google import genai
from google.genai import errors, types
from google.oauth2 import credentials as user_credentials

from simserver import SimConfig, SimServer, start_server
from simserver.vertex import issue_token

MODEL = "gemini-2.5-flash"
SYSTEM = "Answer each question about the passage with one letter."  # 55 characters: 14 tokens
PASSAGE = ("The river rose for three days and the village moved its boats uphill. " * 80)[:5600]  # 1,400 tokens
QUESTION = "Question: where did the boats go? A) uphill B) downstream C) nowhere"


def tokens(text: str) -> int:
    return (len(text) + 3) // 4


#: the cache's tokens: a prompt made of the system instruction and the passage
CACHED = 3 + (3 + tokens(SYSTEM)) + (3 + tokens(PASSAGE))
NOT_FOUND = "CachedContent not found (or permission denied)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def srv():
    async with await start_server(SimConfig()) as server:
        server.clock = Clock()
        yield server


def client_for(server: SimServer, key: str = "k") -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=server.root_url, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))


@pytest.fixture
def client(srv: SimServer) -> genai.Client:
    return client_for(srv)


async def make_cache(client: genai.Client, model: str = MODEL, **config: Any) -> types.CachedContent:
    return await client.aio.caches.create(model=model, config=types.CreateCachedContentConfig(
        system_instruction=SYSTEM, contents=[PASSAGE], **config))


def answer_config(**more: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(max_output_tokens=40, thinking_config=types.ThinkingConfig(thinking_budget=0),
                                       **more)


async def test_create_get_update_list_delete(srv: SimServer, client: genai.Client):
    cache = await make_cache(client, ttl="300s", display_name="river passage")
    assert cache.name.startswith("cachedContents/") and len(cache.name) > len("cachedContents/")
    assert cache.model == f"models/{MODEL}" and cache.display_name == "river passage"
    assert cache.usage_metadata.total_token_count == CACHED
    assert cache.create_time == cache.update_time
    assert cache.expire_time - cache.create_time == datetime.timedelta(seconds=300)

    got = await client.aio.caches.get(name=cache.name)
    assert (got.name, got.expire_time, got.usage_metadata.total_token_count) == (cache.name, cache.expire_time, CACHED)

    srv.clock.now += 100
    updated = await client.aio.caches.update(name=cache.name, config=types.UpdateCachedContentConfig(ttl="600s"))
    assert updated.update_time - cache.create_time == datetime.timedelta(seconds=100)
    assert updated.expire_time - updated.update_time == datetime.timedelta(seconds=600)
    later = cache.create_time + datetime.timedelta(hours=2)
    moved = await client.aio.caches.update(name=cache.name, config=types.UpdateCachedContentConfig(expire_time=later))
    assert abs(moved.expire_time - later) < datetime.timedelta(milliseconds=1)

    other = await make_cache(client)  # neither ttl nor expireTime: an hour
    assert other.expire_time - other.create_time == datetime.timedelta(hours=1)
    assert sorted([c.name async for c in await client.aio.caches.list()]) == sorted([cache.name, other.name])

    await client.aio.caches.delete(name=cache.name)
    with pytest.raises(errors.ClientError) as gone:
        await client.aio.caches.get(name=cache.name)
    assert gone.value.code == 403 and gone.value.status == "PERMISSION_DENIED" and gone.value.message == NOT_FOUND
    assert [c.name async for c in await client.aio.caches.list()] == [other.name]


async def test_an_answer_through_the_cache_is_the_answer_to_the_whole_prompt(srv: SimServer, client: genai.Client):
    whole = []
    turns = [types.Content(role="user", parts=[types.Part(text=text)]) for text in (PASSAGE, QUESTION)]
    for _ in range(2):  # the second is an implicit hit on the first
        whole.append(await client.aio.models.generate_content(
            model=MODEL, contents=turns, config=answer_config(system_instruction=SYSTEM)))
    implicit = whole[1].usage_metadata.cached_content_token_count
    assert implicit and implicit != CACHED  # 1,024 + 128·k tokens, so the explicit count below cannot be it

    cache = await make_cache(client)
    cached = await client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                      config=answer_config(cached_content=cache.name))
    assert cached.text == whole[0].text and cached.text
    prompt = CACHED + 3 + tokens(QUESTION)
    assert cached.usage_metadata.prompt_token_count == whole[0].usage_metadata.prompt_token_count == prompt
    assert cached.usage_metadata.cached_content_token_count == CACHED  # the cache's, not the implicit prefix
    assert cached.usage_metadata.cache_tokens_details[0].token_count == CACHED
    assert list(srv.stats()["completed_by_digest"].values()) == [3]  # one prompt, answered three times


async def test_scripted_answers_match_the_whole_prompt(srv: SimServer, client: genai.Client, tmp_path):
    script = tmp_path / "script.yaml"
    # the passage is only in the cache, the question only in the request
    script.write_text("responses:\n  - contains: ['river rose', 'where did the boats go']\n    response: 'A'\n")
    srv.configure(script=str(script))
    cache = await make_cache(client)
    answer = await client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                      config=answer_config(cached_content=cache.name))
    assert answer.text == "A" and srv.stats()["scripted"] == 1


async def test_too_small_a_cache_is_refused_with_the_models_minimum(srv: SimServer, client: genai.Client):
    short = "A short passage. " * 10
    n = 3 + 3 + tokens(short)
    with pytest.raises(errors.ClientError) as small:
        await client.aio.caches.create(model=MODEL, config=types.CreateCachedContentConfig(contents=[short]))
    assert small.value.code == 400 and small.value.status == "INVALID_ARGUMENT"
    assert small.value.message == f"Cached content is too small. total_token_count={n}, min_total_token_count=1024"
    with pytest.raises(errors.ClientError) as pro:  # 2.5 Pro takes 4,096 at least
        await make_cache(client, model="gemini-2.5-pro")
    assert pro.value.message.endswith(f"total_token_count={CACHED}, min_total_token_count=4096")
    srv.configure(cache_min_tokens=20)
    assert (await client.aio.caches.create(model=MODEL, config=types.CreateCachedContentConfig(
        contents=[short]))).usage_metadata.total_token_count == n


async def test_a_request_setting_a_system_instruction_or_another_model_is_refused(client: genai.Client):
    cache = await make_cache(client)
    with pytest.raises(errors.ClientError) as both:
        await client.aio.models.generate_content(model=MODEL, contents=QUESTION, config=answer_config(
            cached_content=cache.name, system_instruction="Be brief."))
    assert both.value.code == 400 and both.value.message == (
        "CachedContent can not be used with GenerateContent request setting system_instruction, tools or "
        "tool_config.\n\nProposed fix: move those values to CachedContent from GenerateContent request.")
    with pytest.raises(errors.ClientError) as other:
        await client.aio.models.generate_content(model="gemini-2.5-flash-lite", contents=QUESTION,
                                                 config=answer_config(cached_content=cache.name))
    assert other.value.code == 400 and other.value.message == (
        f"Model used by GenerateContent request (models/gemini-2.5-flash-lite) and CachedContent (models/{MODEL}) "
        "has to be the same.")


async def test_an_expired_deleted_or_other_keys_cache_is_not_found(srv: SimServer, client: genai.Client):
    cache = await make_cache(client, ttl="60s")
    srv.clock.now += 59
    ok = await client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                  config=answer_config(cached_content=cache.name))
    assert ok.usage_metadata.cached_content_token_count == CACHED
    other = client_for(srv, "another key")  # held while it asks: google-genai closes an unreferenced client's session
    try:
        with pytest.raises(errors.ClientError) as stranger:
            await other.aio.caches.get(name=cache.name)
    finally:
        await other.aio.aclose()
    assert stranger.value.code == 403
    srv.clock.now += 1  # reading it did not extend its life
    for call in (client.aio.caches.get(name=cache.name),
                 client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                    config=answer_config(cached_content=cache.name))):
        with pytest.raises(errors.ClientError) as expired:
            await call
        assert (expired.value.code, expired.value.message) == (403, NOT_FOUND)

    kept = await make_cache(client)
    await client.aio.caches.delete(name=kept.name)
    with pytest.raises(errors.ClientError) as deleted:
        await client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                 config=answer_config(cached_content=kept.name))
    assert (deleted.value.code, deleted.value.message) == (403, NOT_FOUND)
    with pytest.raises(errors.ClientError) as twice:
        await client.aio.caches.delete(name=kept.name)
    assert twice.value.code == 403


async def test_stats_count_reads_and_storage_and_reset_empties(srv: SimServer, client: genai.Client):
    assert "cached_contents" not in srv.stats()
    first = await make_cache(client, ttl="100s")
    srv.clock.now += 10
    second = await make_cache(client, ttl="1000s")
    for name in (first.name, second.name, second.name):
        await client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                 config=answer_config(cached_content=name))
    srv.clock.now += 20
    await client.aio.caches.delete(name=second.name)
    srv.clock.now += 200  # the first expired 170 s ago
    assert srv.stats()["cached_contents"] == {
        "created": 2, "deleted": 1, "live": 0, "reads": 3, "read_tokens": 3 * CACHED,
        "stored_token_seconds": CACHED * 100 + CACHED * 20}
    third = await make_cache(client)
    srv.clock.now += 5
    assert srv.stats()["cached_contents"]["live"] == 1
    assert srv.stats()["cached_contents"]["stored_token_seconds"] == CACHED * 125

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.root_url}/sim/reset") as reset:
            assert "cached_contents" not in await reset.json()
    assert [c async for c in await client.aio.caches.list()] == []
    with pytest.raises(errors.ClientError) as gone:
        await client.aio.caches.get(name=third.name)
    assert gone.value.code == 403


async def test_strict_create_and_update_mask_on_the_wire(srv: SimServer):
    body = {"model": f"models/{MODEL}", "contents": [{"role": "user", "parts": [{"text": PASSAGE}]}]}
    headers = {"x-goog-api-key": "k"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.root_url}/v1beta/cachedContents", json={**body, "temperature": 0},
                             headers=headers) as unknown:
            assert unknown.status == 400
            assert 'Unknown name "temperature"' in (await unknown.json())["error"]["message"]
        async with http.post(f"{srv.root_url}/v1beta/cachedContents", json={**body, "model": MODEL},
                             headers=headers) as bare:
            assert bare.status == 400 and "models/{model}" in (await bare.json())["error"]["message"]
        async with http.post(f"{srv.root_url}/v1beta/cachedContents", json=body) as keyless:
            assert keyless.status == 403
        async with http.post(f"{srv.root_url}/v1beta/cachedContents", json=body, headers=headers) as made:
            cache = await made.json()
            assert made.status == 200 and "contents" not in cache
        url = f"{srv.root_url}/v1beta/{cache['name']}"
        async with http.patch(url + "?updateMask=displayName", json={"displayName": "x"}, headers=headers) as bad:
            assert bad.status == 400
        srv.clock.now += 30
        async with http.patch(url + "?updateMask=ttl", json={"ttl": "90s", "displayName": "ignored"},
                              headers=headers) as patched:
            shown = await patched.json()
        assert patched.status == 200 and "displayName" not in shown
        expire = datetime.datetime.fromisoformat(shown["expireTime"])
        assert expire - datetime.datetime.fromisoformat(cache["createTime"]) == datetime.timedelta(seconds=120)
        async with http.post(f"{srv.root_url}/v1beta/cachedContents", json={**body, "ttl": "soon"},
                             headers=headers) as bad_ttl:
            assert bad_ttl.status == 400 and "ttl" in (await bad_ttl.json())["error"]["message"]


async def test_vertex_caches_live_in_a_project_and_location(srv: SimServer):
    def vertex(project: str, location: str = "us-central1") -> genai.Client:
        return genai.Client(vertexai=True, project=project, location=location,
                            credentials=user_credentials.Credentials(token=issue_token()),
                            http_options=types.HttpOptions(base_url=srv.root_url, api_version="v1",
                                                           retry_options=types.HttpRetryOptions(attempts=1)))

    client = vertex("lab")
    cache = await make_cache(client, ttl="120s")
    assert cache.name.startswith("projects/lab/locations/us-central1/cachedContents/")
    assert cache.model == f"projects/lab/locations/us-central1/publishers/google/models/{MODEL}"
    answer = await client.aio.models.generate_content(model=MODEL, contents=QUESTION,
                                                      config=answer_config(cached_content=cache.name))
    assert answer.usage_metadata.cached_content_token_count == CACHED
    assert answer.usage_metadata.prompt_token_count == CACHED + 3 + tokens(QUESTION)
    assert (await client.aio.caches.get(name=cache.name)).usage_metadata.total_token_count == CACHED
    short_name = "cachedContents/" + cache.name.rsplit("/", 1)[-1]  # the SDK puts its project and location first
    assert (await client.aio.caches.get(name=short_name)).name == cache.name
    for elsewhere in (vertex("other"), vertex("lab", "europe-west4")):
        with pytest.raises(errors.ClientError) as unseen:
            await elsewhere.aio.caches.get(name=short_name)
        assert unseen.value.code == 403
    await client.aio.caches.delete(name=cache.name)
    assert srv.stats()["cached_contents"]["deleted"] == 1
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{srv.root_url}/v1/projects/lab/locations/us-central1/cachedContents") as keyless:
            assert keyless.status == 401
