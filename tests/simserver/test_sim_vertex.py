"""The simulated server's Vertex AI paths (simserver/vertex.py) through the official clients: google-auth against its
``/token`` endpoint, google-genai in Vertex mode, and the anthropic SDK's AsyncAnthropicVertex."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import anthropic
import pytest
from google import genai
from google.auth import exceptions as auth_errors
from google.auth.transport.requests import Request
from google.genai import errors as genai_errors
from google.genai import types
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

from simserver import SimServer, start_server
from simserver.vertex import VERTEX_VERSION, issue_token

PROJECT, LOCATION = "sim-project", "us-east5"
CLAUDE = "claude-sonnet-4-5@20250929"


@pytest.fixture(scope="module")
def private_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@pytest.fixture
async def srv():
    async with await start_server() as server:
        yield server


def service_account_of(srv: SimServer, private_key: str, email: str = "runner") -> service_account.Credentials:
    info = {"type": "service_account", "project_id": PROJECT, "private_key_id": "k1", "private_key": private_key,
            "client_email": f"{email}@{PROJECT}.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": srv.root_url + "/token"}
    return service_account.Credentials.from_service_account_info(
        info, scopes=["https://www.googleapis.com/auth/cloud-platform"])


def gemini_client(srv: SimServer, credentials) -> genai.Client:
    return genai.Client(vertexai=True, project=PROJECT, location=LOCATION, credentials=credentials,
                        http_options=types.HttpOptions(base_url=srv.root_url, api_version="v1",
                                                       retry_options=types.HttpRetryOptions(attempts=1)))


def claude_client(srv: SimServer, **auth) -> anthropic.AsyncAnthropicVertex:
    return anthropic.AsyncAnthropicVertex(region=LOCATION, project_id=PROJECT, base_url=srv.root_url + "/v1",
                                          max_retries=0, http_client=anthropic.DefaultAioHttpClient(), **auth)


async def test_the_token_endpoint_takes_a_service_account_and_a_refresh_token(srv: SimServer, private_key):
    sa = service_account_of(srv, private_key)
    await asyncio.to_thread(sa.refresh, Request())
    assert sa.token.startswith("ya29.") and sa.valid
    user = user_credentials.Credentials(None, refresh_token="1//refresh", client_id="c", client_secret="s",
                                        token_uri=srv.root_url + "/token")
    await asyncio.to_thread(user.refresh, Request())
    assert user.token.startswith("ya29.") and user.token != sa.token


async def test_a_revoked_grant_is_refused_as_google_refuses_it(srv: SimServer, private_key):
    with pytest.raises(auth_errors.RefreshError, match="invalid_grant"):
        await asyncio.to_thread(service_account_of(srv, private_key, "revoked").refresh, Request())


async def test_gemini_on_vertex_answers_a_token_it_issued_and_refuses_any_other(srv: SimServer, private_key):
    client = gemini_client(srv, service_account_of(srv, private_key))
    answer = await client.aio.models.generate_content(
        model="gemini-2.0-flash", contents="Say something.",
        config=types.GenerateContentConfig(system_instruction="Be brief.", temperature=0, max_output_tokens=12))
    assert answer.text and answer.usage_metadata.prompt_token_count > 0
    await client.aio.aclose()
    forged = gemini_client(srv, user_credentials.Credentials(token="ya29.forged.0123"))
    with pytest.raises(genai_errors.ClientError) as info:
        await forged.aio.models.generate_content(model="gemini-2.0-flash", contents="Hi")
    await forged.aio.aclose()
    assert info.value.code == 401 and info.value.status == "UNAUTHENTICATED"
    assert srv.stats()["by_route"]["vertex-gemini"] == 2 and srv.stats()["by_status"] == {"200": 1, "401": 1}


async def test_gemini_on_vertex_is_strict_as_gemini(srv: SimServer):
    url = (f"{srv.root_url}/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/"
           "gemini-2.0-flash:generateContent")
    body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}], "generationConfig": {"temprature": 0}}
    async with aiohttp.ClientSession() as session, \
            session.post(url, json=body, headers={"Authorization": f"Bearer {issue_token()}"}) as answer:
        error = (await answer.json())["error"]
    assert answer.status == 400 and error["status"] == "INVALID_ARGUMENT"
    assert 'Unknown name "temprature"' in error["message"]


async def test_claude_on_vertex_answers_in_the_messages_format_without_rate_headers(srv: SimServer):
    client = claude_client(srv, access_token=issue_token())
    raw = await client.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=20, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"anthropic_version": VERTEX_VERSION, "temperature": 0})
    message = await raw.parse()
    assert message.model == CLAUDE and message.content[0].text and message.usage.output_tokens > 0
    assert not any(name.startswith("anthropic-ratelimit") for name in raw.headers)
    assert srv.stats()["by_route"]["vertex-anthropic"] == 1
    await client.close()


@pytest.mark.parametrize(("extra", "words"), [
    ({}, "anthropic_version: Input should be 'vertex-2023-10-16'"),  # this SDK's own default is another version
    ({"anthropic_version": "2023-06-01"}, "anthropic_version: Input should be 'vertex-2023-10-16'"),
    ({"anthropic_version": VERTEX_VERSION, "temperature": 1.5}, "temperature: Input should be less than or equal "
                                                                 "to 1"),
    ({"anthropic_version": VERTEX_VERSION, "top_k": "x"}, "top_k: Input should be a valid number"),
])
async def test_claude_on_vertex_is_strict_as_the_messages_api_and_vertex(srv: SimServer, extra, words):
    client = claude_client(srv, access_token=issue_token())
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model=CLAUDE, max_tokens=20, messages=[{"role": "user", "content": "Hi"}],
                                     extra_body=extra)
    await client.close()
    assert info.value.status_code == 400 and words in info.value.message


async def test_claude_on_vertex_takes_no_model_in_the_body_and_no_forged_token(srv: SimServer):
    url = f"{srv.root_url}/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/anthropic/models/{CLAUDE}:rawPredict"
    body = {"anthropic_version": VERTEX_VERSION, "model": CLAUDE, "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body, headers={"Authorization": f"Bearer {issue_token()}"}) as answer:
            assert answer.status == 400
            assert (await answer.json())["error"]["message"] == "model: Extra inputs are not permitted"
        async with session.post(url, data=json.dumps(body)) as answer:
            assert answer.status == 401 and (await answer.json())["error"]["status"] == "UNAUTHENTICATED"
    client = claude_client(srv, access_token="ya29.forged.0123")
    with pytest.raises(anthropic.AuthenticationError):
        await client.messages.create(model=CLAUDE, max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
                                     extra_body={"anthropic_version": VERTEX_VERSION})
    await client.close()


async def test_the_publisher_model_lookup_knows_what_the_config_names(srv: SimServer, private_key):
    client = gemini_client(srv, service_account_of(srv, private_key))
    assert (await client.aio.models.get(model="gemini-9-anything")).name == "publishers/google/models/gemini-9-anything"
    srv.configure(models=f"gemini-2.0-flash,{CLAUDE}")
    assert (await client.aio.models.get(model="gemini-2.0-flash")).name == "publishers/google/models/gemini-2.0-flash"
    found = await client.aio.models.get(model="publishers/anthropic/models/claude-sonnet-4-5")
    assert found.name == "publishers/anthropic/models/claude-sonnet-4-5"
    with pytest.raises(genai_errors.ClientError) as info:
        await client.aio.models.get(model="gemini-9-anything")
    assert info.value.code == 404 and info.value.status == "NOT_FOUND"
    await client.aio.aclose()
    assert srv.stats()["received"] == 0  # lookups are not model requests
