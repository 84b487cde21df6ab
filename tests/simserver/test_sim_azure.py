"""The simulated server's Azure OpenAI paths (simserver/azure.py) through the openai SDK's AsyncAzureOpenAI client:
deployments, api-version, the api-key header and Entra ID's bearer token, Azure's error bodies, the models list,
strict rules of the model behind a deployment, rate-limit headers, and the Files and Batch API under /openai/."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from simserver import SimConfig, SimServer, start_server
from simserver.azure import set_deployments

KEY = "azure-sim-key"
VERSION = "2024-10-21"
MESSAGES = [{"role": "user", "content": "Which is a fruit? A. carrot B. apple"}]


@pytest.fixture
async def server() -> AsyncIterator[SimServer]:
    async with await start_server(SimConfig(api_key=KEY, batch_delay=0)) as srv:
        yield srv


def client(srv: SimServer, **options: Any) -> openai.AsyncAzureOpenAI:
    settings: dict[str, Any] = {"api_key": KEY, "api_version": VERSION, "azure_endpoint": srv.root_url,
                                "max_retries": 0, **options}
    if "azure_ad_token" in options:
        settings.pop("api_key")
    return openai.AsyncAzureOpenAI(**settings)


async def raw(srv: SimServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.request(method, srv.root_url + path, **kwargs) as answer:
        return answer.status, await answer.json()


async def test_a_deployment_answers_in_chat_completions_naming_the_model_behind_it(server: SimServer):
    set_deployments(server, {"prod": "gpt-4o-mini"})
    sdk = client(server)
    answer = await sdk.chat.completions.with_raw_response.create(model="prod", messages=MESSAGES, max_tokens=10)
    completion = answer.parse()
    assert completion.model == "gpt-4o-mini" and completion.choices[0].message.content
    assert 0 < completion.usage.completion_tokens <= 10 and completion.usage.prompt_tokens > 0
    assert server.stats()["by_route"]["azure-openai"] == 1
    await sdk.close()


async def test_an_entra_id_token_is_taken_as_the_key(server: SimServer):
    sdk = client(server, azure_ad_token=KEY)
    assert (await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)).choices
    await sdk.close()


async def test_keys_missing_or_wrong_are_azures_401s(server: SimServer):
    sdk = client(server, api_key="bad-key-123")
    with pytest.raises(openai.AuthenticationError) as info:
        await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.body["code"] == "401" and "invalid subscription key" in info.value.body["message"]
    assert "bad-key-123" not in json.dumps(info.value.body)
    await sdk.close()
    status, body = await raw(server, "POST", f"/openai/deployments/gpt-4o/chat/completions?api-version={VERSION}",
                             json={"messages": MESSAGES})
    assert status == 401 and "missing subscription key" in body["error"]["message"]


async def test_the_api_version_is_required_and_must_be_one_azure_serves(server: SimServer):
    status, body = await raw(server, "POST", "/openai/deployments/gpt-4o/chat/completions",
                             json={"messages": MESSAGES}, headers={"api-key": KEY})
    assert (status, body) == (404, {"error": {"code": "404", "message": "Resource not found"}})
    sdk = client(server, api_version="2031-01-01")
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.body == {"code": "BadRequest", "message": "API version not supported"}
    await sdk.close()
    assert server.stats()["received"] == 0, "turned away before the model route"


async def test_an_unknown_deployment_is_deployment_not_found_once_deployments_are_named(server: SimServer):
    sdk = client(server)
    assert (await sdk.chat.completions.create(model="anything", messages=MESSAGES, max_tokens=3)).choices
    set_deployments(server, {"prod": "gpt-4o"})
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.chat.completions.create(model="anything", messages=MESSAGES)
    assert info.value.body["code"] == "DeploymentNotFound"
    status, shown = await raw(server, "GET", "/sim/azure/deployments")
    assert (status, shown) == (200, {"deployments": {"prod": "gpt-4o"}})
    await sdk.close()


async def test_the_deployments_route_sets_them_and_refuses_a_bad_map(server: SimServer):
    status, _ = await raw(server, "POST", "/sim/azure/deployments", json={"deployments": ["prod"]})
    assert status == 400
    status, shown = await raw(server, "POST", "/sim/azure/deployments", json={"deployments": {"a": "o3-mini"}})
    assert (status, shown) == (200, {"deployments": {"a": "o3-mini"}})


async def test_strict_mode_applies_the_rules_of_the_model_behind_the_deployment(server: SimServer):
    set_deployments(server, {"reasoner": "o3-mini", "chat": "gpt-4o"})
    sdk = client(server)
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(model="reasoner", messages=MESSAGES, temperature=0.2)
    assert info.value.param == "temperature" and "Only the default (1)" in info.value.message
    assert (await sdk.chat.completions.create(model="chat", messages=MESSAGES, temperature=0.2)).choices
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument"):
        await sdk.chat.completions.create(model="chat", messages=MESSAGES, extra_body={"bogus": 1})
    await sdk.close()


async def test_rate_limits_send_only_the_remaining_headers_and_azures_429(server: SimServer):
    server.configure(rpm=2)
    sdk = client(server)
    first = await sdk.chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES, max_tokens=3)
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert "x-ratelimit-limit-requests" not in first.headers
    await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=3)
    with pytest.raises(openai.RateLimitError) as info:
        await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=3)
    assert info.value.body["code"] == "429" and float(info.value.response.headers["retry-after"]) > 0
    await sdk.close()


async def test_the_models_list_needs_the_version_and_the_key(server: SimServer):
    set_deployments(server, {"prod": "gpt-4o", "mini": "gpt-4o-mini"})
    sdk = client(server)
    assert sorted([model.id async for model in sdk.models.list()]) == ["gpt-4o", "gpt-4o-mini"]
    await sdk.close()
    status, _ = await raw(server, "GET", "/openai/models", headers={"api-key": KEY})
    assert status == 404
    status, _ = await raw(server, "GET", f"/openai/models?api-version={VERSION}", headers={"api-key": "x"})
    assert status == 401


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def request(custom_id: str, model: str = "gpt-4o", url: str = "/chat/completions") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": f"question {custom_id}"}],
                     "max_tokens": 5}}


async def test_a_batch_answers_each_line_as_its_deployment_answers_online(server: SimServer):
    set_deployments(server, {"gpt-4o": "gpt-4o"})
    sdk = client(server)
    upload = await sdk.files.create(file=("in.jsonl", jsonl([request("a"), request("b")])), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/chat/completions",  # type: ignore[arg-type]
                                     completion_window="24h", metadata={"runner": "label"})
    assert batch.status == "validating" and batch.endpoint == "/chat/completions"
    batch = await sdk.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    assert [b.id async for b in sdk.batches.list()] == [batch.id]
    out = [json.loads(line) for line in (await sdk.files.content(batch.output_file_id)).text.splitlines()]
    online = await sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "question a"}],
                                               max_tokens=5)
    by_id = {line["custom_id"]: line["response"]["body"] for line in out}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"]["choices"][0]["message"]["content"] == online.choices[0].message.content
    await sdk.close()


async def test_a_batch_naming_an_unknown_deployment_or_openais_url_fails_validation(server: SimServer):
    set_deployments(server, {"gpt-4o": "gpt-4o"})
    sdk = client(server)

    async def problems(lines: list[dict[str, Any]]) -> set[tuple[str, int]]:
        upload = await sdk.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/chat/completions",  # type: ignore[arg-type]
                                         completion_window="24h")
        batch = await sdk.batches.retrieve(batch.id)
        assert batch.status == "failed" and all("/v1/" not in e.message for e in batch.errors.data)
        return {(e.code, e.line) for e in batch.errors.data}

    assert await problems([request("a", model="missing"), request("b", model="missing")]) == {
        ("model_not_found", 1), ("model_not_found", 2)}
    assert await problems([request("a"), request("b", url="/v1/chat/completions")]) == {("mismatched_url", 2)}
    upload = await sdk.files.create(file=("in.jsonl", jsonl([request("a")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="/chat/completions"):
        await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    await sdk.close()


async def test_batches_need_an_api_version_that_has_them(server: SimServer):
    sdk = client(server, api_version="2024-06-01")
    with pytest.raises(openai.BadRequestError):
        await sdk.files.create(file=("in.jsonl", jsonl([request("a")])), purpose="batch")
    await sdk.close()
    assert (await raw(server, "GET", "/openai/batches", headers={"api-key": KEY}))[0] == 404


async def test_the_identity_endpoint_gives_tokens_for_cognitive_services_that_the_resource_takes(server: SimServer):
    headers = {"X-IDENTITY-HEADER": "h"}
    status, _ = await raw(server, "GET", "/sim/azure/identity?api-version=2019-08-01&resource=https://vault.azure.net",
                          headers=headers)
    assert status == 400
    status, token = await raw(server, "GET", "/sim/azure/identity?api-version=2019-08-01"
                              "&resource=https://cognitiveservices.azure.com", headers=headers)
    assert status == 200 and token["token_type"] == "Bearer" and int(token["expires_on"]) > 0
    assert KEY not in token["access_token"]
    sdk = client(server, azure_ad_token=token["access_token"])
    assert (await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=3)).choices
    await sdk.close()
    sdk = client(server, azure_ad_token="sim-entra-forged")
    with pytest.raises(openai.AuthenticationError):
        await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=3)
    await sdk.close()
