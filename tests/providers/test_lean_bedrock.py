"""The bedrock provider over the lean wire (``runner/providers/bedrock.py`` on ``bedrock_wire.py`` and ``lean_http.py``)
against the SDK paths it replaces online (boto3's ``converse``, ``AsyncAnthropicBedrock``'s InvokeModel), both sent
to one scripted server: the same method, path and query, Content-Type and body for each request of both families,
its SigV4 signature checked as a server checks it (recomputed with botocore's ``SigV4Auth`` over the request as
received, at the date it names); Converse's path and body against botocore's own rest-json serializer, its answer
against botocore's own parser (blobs decoded); the same completion for an answer and the same error for each of
Bedrock's error answers; credentials that need refreshing refreshed once, off the event loop, for many requests in
flight; the SDKs kept where a proxy or an endpoint variable applies; and the strict simulated server's Bedrock
routes taking every lean request. Nothing connects anywhere but 127.0.0.1 (``_local_only``, test_vertex.py's)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runner.errors import (
    AuthError,
    BadRequest,
    ModelSetupError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientError,
)
from runner.providers import capabilities
from runner.providers.base import CacheMarks, Completion, ProviderSettings
from runner.providers.bedrock import BedrockProvider
from runner.providers.bedrock_converse import output_members
from runner.providers.bedrock_wire import converse_answer, converse_body
from runner.providers.records import LEAN_WIRE
from simserver import SimConfig, start_server
from tests.helpers import headers_of, isolated_aws, provider_outcome, scripted_server
from tests.providers.test_bedrock import _botocore_refuses_bearer_over_http as botocore_refuses_bearer_over_http
from tests.providers.test_lean_gemini import MESSAGES, described
from tests.providers.test_vertex import _local_only  # noqa: F401  (an autouse fixture)

ACCESS_KEY, SECRET, REGION = "AKIDSIMULATEDLEAN", "simulated-secret-never-shown", "us-east-1"
CONVERSE = "amazon.nova-pro-v1:0"
CLAUDE = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
PROFILE_ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
CONVERSE_ANSWER = {
    "output": {"message": {"role": "assistant", "content": [
        {"reasoningContent": {"redactedContent": base64.b64encode(b"\x00hidden").decode()}},
        {"text": "4 (é)"}]}},
    "stopReason": "end_turn", "usage": {"inputTokens": 20, "outputTokens": 2, "totalTokens": 22,
                                        "cacheReadInputTokens": 4, "cacheWriteInputTokens": 1},
    "metrics": {"latencyMs": 120}}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
           "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "C"}],
           "stop_reason": "end_turn", "stop_sequence": None,
           "usage": {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 4,
                     "cache_creation_input_tokens": 2}}
#: Converse's (model, params) whose requests both paths must write alike
CONVERSE_CASES: list[tuple[str, dict[str, Any]]] = [
    (CONVERSE, {"max_tokens": 5, "temperature": 0}),
    (CONVERSE, {"max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"]}),
    ("us.amazon.nova-pro-v1:0", {"max_tokens": 5}),
    (PROFILE_ARN, {"max_tokens": 5, "temperature": 1}),
    *([("amazon.nova-pro-v1:0", {"reasoning": {"effort": "low"}, "max_tokens": 9}),
       ("amazon.nova-pro-v1:0", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
           "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}})]
      # (botocore before 1.43's Converse has no outputConfig: both paths refuse these, as test_bedrock.py checks)
      if {"textFormat", "effort"} <= output_members() else []),
]
#: Claude's (model, params, whether the messages are marked for the prompt cache)
CLAUDE_CASES: list[tuple[str, dict[str, Any], bool]] = [
    (CLAUDE, {"max_tokens": 5, "temperature": 0.2, "stop": ["\n"]}, False),
    (CLAUDE, {"top_p": 0.9}, True),
    ("anthropic.claude-sonnet-4-5-20250929-v1:0", {"reasoning": {"budget_tokens": 1024}, "max_tokens": 2048}, False),
    ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"letter": {"type": "string"}},
                                "required": ["letter"], "additionalProperties": False}}}}, False),
]


class SDKBedrock(BedrockProvider):
    """The bedrock provider as it was before the lean wire: boto3 and AsyncAnthropicBedrock."""

    lean_wire: ClassVar[bool] = False


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolated_aws(monkeypatch, tmp_path, ACCESS_KEY, SECRET, region=REGION)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy", "ANTHROPIC_BEDROCK_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["environment", "botocore"])
def credentials_from(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's keys read from the environment as botocore's first provider reads them (no profile named: a run's
    own way), or by botocore's session through its whole chain (as wherever the environment is not the answer)."""
    from runner.providers import aws_sessions

    if request.param == "botocore":
        monkeypatch.setattr(aws_sessions, "environment_credentials", lambda profile: None)
    return str(request.param)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    async with scripted_server() as served:
        yield served


def settings(url: str | None, **more: Any) -> ProviderSettings:
    return ProviderSettings.model_validate({"base_url": url, "timeout": 10, **more})


def both(url: str) -> tuple[BedrockProvider, BedrockProvider]:
    return BedrockProvider(settings(url)), SDKBedrock(settings(url))


async def outcome(provider: BedrockProvider, model: str, params: dict[str, Any],
                  messages: list[dict[str, Any]] | None = None) -> Completion | ProviderError | ModelSetupError:
    return await provider_outcome(provider, model, messages or MESSAGES, params)  # type: ignore[no-any-return]


def verified(request: dict[str, Any], url: str, key: str = ACCESS_KEY, secret: str = SECRET,
             token: str | None = None) -> list[str]:
    """The headers ``request`` (as the scripted server received it) signed, once its SigV4 signature is recomputed
    with botocore's signer from the secret, the headers it names, the body and the date it was sent with."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    headers = headers_of(request)
    scheme, _, rest = headers["authorization"].partition(" ")
    fields = dict(part.strip().split("=", 1) for part in rest.split(","))
    signed = fields["SignedHeaders"].split(";")
    date = headers["x-amz-date"]
    assert scheme == "AWS4-HMAC-SHA256"
    assert fields["Credential"] == f"{key}/{date[:8]}/{REGION}/bedrock/aws4_request"
    received = AWSRequest(method=request["method"], url=url + request["path"], data=request["body"],
                          headers={name: headers[name] for name in signed})
    received.context["timestamp"] = date
    signer = SigV4Auth(Credentials(key, secret, token), "bedrock", REGION)
    expected = signer.signature(signer.string_to_sign(received, signer.canonical_request(received)), received)
    assert fields["Signature"] == expected
    return signed


def same_request(lean: dict[str, Any], sdk: dict[str, Any], url: str) -> None:
    """Method, path with its query, Content-Type; each signed as a server checks it, the lean one over at least
    the host, the date and the Content-Type."""
    assert (lean["method"], lean["path"]) == (sdk["method"], sdk["path"])
    assert headers_of(lean)["content-type"] == headers_of(sdk)["content-type"] == "application/json"
    assert {"host", "x-amz-date", "content-type"} <= set(verified(lean, url))
    verified(sdk, url)


def reference(model: str, request: dict[str, Any]) -> dict[str, Any]:
    """botocore's own rest-json serialisation of ``converse(modelId=model, **request)``: its URL path and body."""
    import botocore.session
    from botocore.serialize import create_serializer

    operation = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse")
    return create_serializer("rest-json").serialize_to_request({"modelId": model, **request}, operation)


# -- requests and answers -----------------------------------------------------------------------------------------

@pytest.mark.usefixtures("credentials_from")
async def test_each_converse_request_is_boto3s_own_and_its_answer_the_same_completion(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(CONVERSE_ANSWER).encode())
    for model, params in CONVERSE_CASES:
        seen.clear()
        lean, sdk = both(url)
        got, expected = await outcome(lean, model, params), await outcome(sdk, model, params)
        assert isinstance(got, Completion) and isinstance(expected, Completion), (got, expected)
        lean_sent, sdk_sent = seen
        same_request(lean_sent, sdk_sent, url)
        assert lean_sent["body"] == sdk_sent["body"], params  # byte for byte
        serialized = reference(model, lean.converse_request(model, MESSAGES, params))
        assert lean_sent["path"] == serialized["url_path"] and lean_sent["body"] == serialized["body"]
        for field in ("text", "thinking", "finish_reason", "input_tokens", "output_tokens", "cached_tokens",
                      "cache_write_tokens", "raw"):
            assert getattr(got, field) == getattr(expected, field), field
    assert lean_sent["path"] == ("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus."
                                 "amazon.nova-pro-v1%3A0/converse") or model != PROFILE_ARN
    assert (got.text, got.input_tokens, got.cached_tokens) == ("4 (é)", 25, 4)


def test_converse_blobs_go_and_come_as_botocore_writes_and_reads_them() -> None:
    """An image's bytes in a request (base64 in the body) and a redacted reasoning in an answer (decoded into
    bytes), as botocore's serializer and parser do them."""
    import botocore.session
    from botocore.parsers import create_parser

    request = {"messages": [{"role": "user", "content": [
        {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n\x1a\n\x00\xff"}}},
        {"document": {"format": "txt", "name": "d", "source": {"bytes": "é".encode()}}}, {"text": "what?"}]}],
        "inferenceConfig": {"maxTokens": 5}}
    assert converse_body({"modelId": CONVERSE, **request}) == reference(CONVERSE, request)["body"]
    operation = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse")
    body = json.dumps(CONVERSE_ANSWER).encode()
    parsed = create_parser("rest-json").parse({"status_code": 200, "headers": {}, "body": body},
                                              operation.output_shape)
    parsed.pop("ResponseMetadata")
    assert converse_answer(body, "here") == parsed
    assert parsed["output"]["message"]["content"][0]["reasoningContent"]["redactedContent"] == b"\x00hidden"


def test_nested_blobs_and_answers_with_or_without_one_are_botocores_own() -> None:
    """Blobs deep in a request (a tool result's image and document, a bytearray) are serialised where they are, as
    botocore's serializer writes them; an answer without a blob, one with an image's, and one whose blob members'
    names are spelt in ``\\u`` escapes are each read as botocore's parser reads them."""
    import botocore.session
    from botocore.parsers import create_parser

    request = {"messages": [
        {"role": "user", "content": [{"text": "look"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "see", "input": {"x": [1, "é"]}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "status": "success", "content": [
            {"image": {"format": "jpeg", "source": {"bytes": bytearray(b"\xff\xd8\xff\x00")}}},
            {"document": {"format": "csv", "name": "rows", "source": {"bytes": b"a,b\n1,2\n"}}},
            {"json": {"ok": True, "n": None}}]}}, {"text": "and?"}]}],
        "system": [{"text": "Réponds."}], "inferenceConfig": {"maxTokens": 5, "topP": 0.5}}
    assert converse_body({"modelId": CONVERSE, **request}) == reference(CONVERSE, request)["body"]
    with pytest.raises(TypeError):
        converse_body({"modelId": CONVERSE, "messages": [{"role": "user", "content": [{"text": object()}]}]})
    operation = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse")
    image = {"image": {"format": "png", "source": {"bytes": base64.b64encode(b"\x89PNG\x00").decode()}}}
    plain = {**CONVERSE_ANSWER, "output": {"message": {"role": "assistant", "content": [{"text": "4 (é)"}]}}}
    with_image = {**plain, "output": {"message": {"role": "assistant", "content": [image, {"text": "x"}]}}}
    escaped = json.dumps(CONVERSE_ANSWER).replace('"redactedContent"', '"\\u0072edactedContent"')
    for body in (json.dumps(plain).encode(), json.dumps(plain, ensure_ascii=False).encode(),
                 json.dumps(with_image).encode(), escaped.encode(),
                 json.dumps(with_image).replace('"bytes"', '"\\u0062ytes"').encode()):
        parsed = create_parser("rest-json").parse({"status_code": 200, "headers": {}, "body": body},
                                                  operation.output_shape)
        parsed.pop("ResponseMetadata")
        assert converse_answer(body, "here") == parsed, body
    assert isinstance(converse_answer(escaped.encode(), "here")["output"]["message"]["content"][0][
        "reasoningContent"]["redactedContent"], bytes)


def claude_request(provider: BedrockProvider, model: str, asked: dict[str, Any], marked: bool
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A Claude case's messages and params as the engine hands them over: shaped by the capability table, and the
    system prompt marked for the prompt cache where the case says so."""
    capability = provider.capability_model(model)
    assert capability is not None
    params = capabilities.shape(*capability, asked).params
    if not marked:
        return MESSAGES, params
    return provider.mark_prompt_cache(model, MESSAGES, params, CacheMarks(cuts=((0, len("Be brief.")),), group="g"))


@pytest.mark.usefixtures("credentials_from")
async def test_each_claude_request_is_anthropic_bedrocks_own_and_its_answer_the_same_completion(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(MESSAGE).encode())
    for model, asked, marked in CLAUDE_CASES:
        seen.clear()
        messages, params = claude_request(BedrockProvider(settings(url)), model, asked, marked)
        lean, sdk = both(url)
        got, expected = await outcome(lean, model, params, messages), await outcome(sdk, model, params, messages)
        assert isinstance(got, Completion) and isinstance(expected, Completion), (got, expected)
        lean_sent, sdk_sent = seen
        same_request(lean_sent, sdk_sent, url)
        assert lean_sent["path"] == f"/model/{model}/invoke"  # (':' kept, as AsyncAnthropicBedrock keeps it)
        body = json.loads(lean_sent["body"])
        assert body == json.loads(sdk_sent["body"]), (model, params)
        assert body["anthropic_version"] == "bedrock-2023-05-31" and "model" not in body
        for field in ("text", "thinking", "finish_reason", "input_tokens", "output_tokens", "cached_tokens",
                      "cache_write_tokens", "raw"):
            assert getattr(got, field) == getattr(expected, field), field
    assert (got.text, got.thinking, got.input_tokens) == ("C", "hmm", 18)


@pytest.mark.usefixtures("credentials_from")
async def test_a_session_token_is_sent_and_signed_as_boto3_signs_it(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", "simulated-session-token")
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(CONVERSE_ANSWER).encode())
    lean, sdk = both(url)
    assert isinstance(await outcome(lean, CONVERSE, {"max_tokens": 5}), Completion)
    assert isinstance(await outcome(sdk, CONVERSE, {"max_tokens": 5}), Completion)
    lean_sent, sdk_sent = seen
    for sent in seen:
        assert headers_of(sent)["x-amz-security-token"] == "simulated-session-token"
    assert "x-amz-security-token" in verified(lean_sent, url, token="simulated-session-token")
    verified(sdk_sent, url, token="simulated-session-token")


def use_bedrock_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Bedrock API key in the environment, and no AWS access key beside it."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-api-key-simulated")


async def test_a_bedrock_api_key_is_the_bearer_token_anthropic_bedrock_sends(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    use_bedrock_api_key(monkeypatch)
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(MESSAGE).encode())
    lean, sdk = both(url)
    assert isinstance(await outcome(lean, CLAUDE, {"max_tokens": 5}), Completion)
    assert isinstance(await outcome(sdk, CLAUDE, {"max_tokens": 5}), Completion)
    assert [headers_of(sent)["authorization"] for sent in seen] == ["Bearer bedrock-api-key-simulated"] * 2
    # Converse over plain http: refused as botocore refuses it (from 1.44; the wire refuses with any botocore), in
    # the same sentence, nothing sent
    seen.clear()
    lean, sdk = both(url)
    got = await outcome(lean, CONVERSE, {"max_tokens": 5})
    assert isinstance(got, ModelSetupError) and "needs an https base_url" in str(got) and seen == []
    if botocore_refuses_bearer_over_http():
        expected = await outcome(sdk, CONVERSE, {"max_tokens": 5})
        assert (type(got), str(got)) == (type(expected), str(expected))
        assert seen == []


def bedrock_error(code: str, message: str, *, header: bool = True) -> tuple[bytes, dict[str, str]]:
    """Bedrock's error answer: ``{"message": ...}`` and the exception's name in ``x-amzn-ErrorType``."""
    headers = {"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/"} if header else {}
    return json.dumps({"message": message}).encode(), headers


ERRORS: list[tuple[int, bytes, dict[str, str]]] = [
    (400, *bedrock_error("ValidationException", "Malformed input request: extraneous key [foo]")),
    (400, json.dumps({"__type": "com.amazon.bedrock#ValidationException", "message": "bad"}).encode(), {}),
    (400, json.dumps({"Message": "capitalised"}).encode(), {"x-amzn-ErrorType": "ValidationException"}),
    (400, *bedrock_error("ServiceQuotaExceededException", "Too many tokens per day")),
    (403, *bedrock_error("AccessDeniedException", "You don't have access to the model with the specified model ID.")),
    (403, *bedrock_error("UnrecognizedClientException", "The security token included in the request is invalid.")),
    (403, *bedrock_error("InvalidSignatureException", "The request signature we calculated does not match")),
    (404, *bedrock_error("ResourceNotFoundException", "Could not resolve the foundation model")),
    (408, *bedrock_error("ModelTimeoutException", "Model has timed out")),
    (424, *bedrock_error("ModelErrorException", "The model failed")),
    (429, *bedrock_error("ThrottlingException", "Too many requests, please wait before trying again.")),
    (429, bedrock_error("ThrottlingException", "slow down")[0],
     {"x-amzn-ErrorType": "ThrottlingException", "retry-after": "2"}),
    (429, *bedrock_error("ModelNotReadyException", "Model is not ready")),
    (500, *bedrock_error("InternalServerException", "oops")),
    (503, *bedrock_error("ServiceUnavailableException", "Bedrock is unable to process your request.")),
    (502, b"<html>bad gateway</html>", {}),
    (503, b"", {}),
    (400, b"not json at all", {}),
]


@pytest.mark.parametrize("model", [CONVERSE, CLAUDE])
@pytest.mark.parametrize(("code", "body", "headers"), ERRORS)
async def test_each_error_answer_is_the_same_error_on_both_paths(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], model: str, code: int, body: bytes,
        headers: dict[str, str]) -> None:
    url, answer, _ = scripted
    answer.update(status=code, body=body, headers=headers)
    if not body.startswith(b"{"):
        answer["content_type"] = "text/html" if body.startswith(b"<") else "text/plain"
    lean, sdk = both(url)
    got, expected = await outcome(lean, model, {"max_tokens": 5}), await outcome(sdk, model, {"max_tokens": 5})
    assert described(got) == described(expected)
    assert SECRET not in str(got) and ACCESS_KEY not in str(got)
    if code == 403:
        assert isinstance(got, AuthError) and "AWS_ACCESS_KEY_ID" in str(got)
    elif code == 429 and b"not ready" not in body:
        assert isinstance(got, RateLimited) and got.retry_after in (2.0, None)
    elif code >= 500 or code in (408, 424, 429):  # (ModelNotReadyException: the model is loading)
        assert isinstance(got, TransientError) and got.status == code
    elif code == 404:
        assert isinstance(got, AuthError) and got.error_class == "unknown_model"
    else:
        assert isinstance(got, BadRequest | QuotaExceeded)


@pytest.mark.parametrize("model", [CONVERSE, CLAUDE])
@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe{}", b"{}", b""])
async def test_a_malformed_answer_is_the_same_error(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], model: str, body: bytes) -> None:
    url, answer, _ = scripted
    answer.update(status=200, body=body)
    lean, sdk = both(url)
    got, expected = await outcome(lean, model, {"max_tokens": 5}), await outcome(sdk, model, {"max_tokens": 5})
    if isinstance(expected, Completion):
        assert isinstance(got, Completion) and (got.text, got.output_tokens) == (expected.text, expected.output_tokens)
    else:
        assert described(got) == described(expected)
        assert isinstance(got, TransientError) and got.error_class == "malformed_response"


# -- credentials ---------------------------------------------------------------------------------------------------

@pytest.fixture
def from_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials from botocore's chain (the test's own, set on the session), not the environment's keys."""
    from runner.providers import aws_sessions

    monkeypatch.setattr(aws_sessions, "environment_credentials", lambda profile: None)


@pytest.mark.usefixtures("from_the_chain")
async def test_credentials_about_to_expire_are_refreshed_once_off_the_loop_for_every_request_in_flight(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A refreshable credential (an assumed role's, SSO's) inside botocore's refresh window: the first request to
    find it so has botocore refresh it in a worker thread, the 23 others wait for that one refresh."""
    from botocore.credentials import RefreshableCredentials

    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps({**CONVERSE_ANSWER, **MESSAGE}).encode())
    threads: list[threading.Thread] = []
    keys = iter(["AKIDFIRSTROLE", "AKIDSECONDROLE"])

    def fetch() -> dict[str, str]:
        threads.append(threading.current_thread())
        # the first lasts an hour; the second is the refresh asked when only five minutes are left
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {"access_key": next(keys), "secret_key": SECRET, "token": "role-token",
                "expiry_time": expiry.isoformat()}

    credentials = RefreshableCredentials.create_from_metadata(fetch(), fetch, "assume-role")
    threads.clear()
    provider = BedrockProvider(settings(url))
    monkeypatch.setattr(provider._core, "get_credentials", lambda: credentials)
    await provider.start()
    try:
        await provider.execute(CONVERSE, MESSAGES, {"max_tokens": 5})
        assert threads == [] and provider.signer is not None and provider.signer.refreshes == 0
        credentials._expiry_time = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
        seen.clear()
        results = await asyncio.gather(*(provider.execute(CLAUDE if i % 2 else CONVERSE, MESSAGES, {"max_tokens": 5})
                                          for i in range(24)))
        assert all(isinstance(result, Completion) for result in results)
    finally:
        await provider.aclose()
    assert len(threads) == 1 and threads[0] is not threading.main_thread(), "one refresh, in a worker thread"
    assert provider.signer.refreshes == 1 and len(seen) == 24
    for sent in seen:
        verified(sent, url, key="AKIDSECONDROLE", token="role-token")


@pytest.mark.usefixtures("from_the_chain")
async def test_missing_credentials_are_one_sentence_and_nothing_is_sent(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.credentials import RefreshableCredentials
    from botocore.exceptions import CredentialRetrievalError

    url, _, seen = scripted

    def refused() -> dict[str, str]:
        raise CredentialRetrievalError(provider="sso", error_msg="the SSO session has expired")

    past = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)).isoformat()
    credentials = RefreshableCredentials.create_from_metadata(
        {"access_key": "AKIDOLD", "secret_key": SECRET, "token": "t", "expiry_time": past}, refused, "sso")
    provider = BedrockProvider(settings(url))
    monkeypatch.setattr(provider._core, "get_credentials", lambda: credentials)
    got = await outcome(provider, CONVERSE, {"max_tokens": 5})
    assert isinstance(got, AuthError) and "could not be found or refreshed (CredentialRetrievalError)" in str(got)
    assert seen == [] and SECRET not in str(got)


@pytest.mark.usefixtures("credentials_from")
async def test_the_probe_s_provider_and_the_run_s_share_one_session_and_changed_keys_make_another(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """runner submit's providers (the checks', the probe's, the run's) share botocore's session and its credentials
    (aws_sessions.py), as long as nothing of the environment or the shared files changes."""
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(CONVERSE_ANSWER).encode())
    checked, probed, run = (BedrockProvider(settings(url)) for _ in range(3))
    checked.check_key(CONVERSE)
    assert checked._core is probed._core is run._core and checked._session is run._session
    assert await probe_outcome(probed, CONVERSE) is None
    assert isinstance(await outcome(run, CONVERSE, {"max_tokens": 5}), Completion)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDANOTHERKEY")
    changed = BedrockProvider(settings(url))
    assert changed._core is not run._core
    assert isinstance(await outcome(changed, CONVERSE, {"max_tokens": 5}), Completion)
    verified(seen[1], url)
    verified(seen[2], url, key="AKIDANOTHERKEY")


# -- where the wire goes, and where the SDKs stay ------------------------------------------------------------------

@pytest.mark.parametrize(("variables", "lean"), [
    ({}, True),
    ({"HTTPS_PROXY": "http://127.0.0.1:9"}, False),
    ({"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "bedrock-runtime.us-east-1.amazonaws.com"}, True),
    ({"HTTP_PROXY": "http://127.0.0.1:9"}, True),  # a proxy for the other scheme
    ({"AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://127.0.0.1:9"}, False),
    ({"AWS_USE_FIPS_ENDPOINT": "true"}, False),
])
async def test_where_a_proxy_or_an_endpoint_variable_applies_the_sdks_are_kept(
        monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], lean: bool) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    provider = BedrockProvider(settings(None))
    await provider.start()  # a wire or boto3's client; nothing is sent
    try:
        assert (provider.wire is not None) is lean
        assert (provider.runtime is None) is lean, "boto3's client waits for its first use beside the wire"
        assert provider.sent_with(CONVERSE) == (LEAN_WIRE if lean else provider.sent_with(CONVERSE, batch=True))
        if lean:
            assert provider.wire is not None
            assert (provider.wire.host, provider.wire.port) == ("bedrock-runtime.us-east-1.amazonaws.com", 443)
            assert provider.sent_with(CLAUDE) == LEAN_WIRE and provider.sent_with(CONVERSE, batch=True) != LEAN_WIRE
    finally:
        await provider.aclose()


def test_the_region_s_endpoint_is_the_one_boto3_picks() -> None:
    import boto3

    for region in ("us-east-1", "eu-central-1", "ap-northeast-1", "us-gov-west-1", "cn-north-1"):
        client = boto3.client("bedrock-runtime", region_name=region)
        provider = BedrockProvider(settings(None, region=region))
        assert provider.runtime_url() == client.meta.endpoint_url, region
        client.close()


# -- the pre-flight probe ------------------------------------------------------------------------------------------

FOUNDATION_MODEL = {"modelDetails": {"modelArn": f"arn:aws:bedrock:{REGION}::foundation-model/{CONVERSE}",
                                     "modelId": CONVERSE, "providerName": "amazon"}}
#: the control plane's answers to a lookup, each one the same outcome on both paths
PROBE_ANSWERS: list[tuple[int, bytes, dict[str, str]]] = [
    (200, json.dumps(FOUNDATION_MODEL).encode(), {}),
    (404, *bedrock_error("ResourceNotFoundException", "The model does not exist.")),
    (400, *bedrock_error("ValidationException", "The provided model identifier is invalid.")),
    (403, *bedrock_error("AccessDeniedException", "You are not authorized to perform: bedrock:GetFoundationModel")),
    (429, *bedrock_error("ThrottlingException", "Too many requests")),
    (500, *bedrock_error("InternalServerException", "oops")),
    (503, b"", {}),
]


async def probe_outcome(provider: BedrockProvider, model: str) -> Exception | None:
    try:
        await provider.probe(model)
    except (ProviderError, ModelSetupError) as exc:
        return exc
    finally:
        await provider.aclose()
    return None


@pytest.mark.usefixtures("credentials_from")
@pytest.mark.parametrize(("code", "body", "headers"), PROBE_ANSWERS)
async def test_the_probe_s_lookup_is_boto3s_own_signed_alike_and_each_answer_the_same_outcome(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], code: int, body: bytes,
        headers: dict[str, str]) -> None:
    """GetFoundationModel (and GetInferenceProfile for a cross-region id or an ARN) over the wire: the method, path
    and signature of boto3's ``bedrock`` client's request, no body and so no Content-Type signed, and the same
    outcome for each answer."""
    url, answer, seen = scripted
    answer.update(status=code, body=body, headers=headers)
    paths = []
    for model in (CONVERSE, "us.amazon.nova-pro-v1:0", PROFILE_ARN):
        seen.clear()
        lean, sdk = both(url)
        got, expected = await probe_outcome(lean, model), await probe_outcome(sdk, model)
        lean_sent, sdk_sent = seen
        paths.append(lean_sent["path"])
        assert (lean_sent["method"], lean_sent["path"]) == (sdk_sent["method"], sdk_sent["path"]) == \
            ("GET", sdk_sent["path"])
        assert lean_sent["body"] == sdk_sent["body"] == b""
        assert "content-type" not in headers_of(lean_sent)
        assert {"host", "x-amz-date"} <= set(verified(lean_sent, url)) and "content-type" not in verified(
            lean_sent, url)
        verified(sdk_sent, url)
        if code == 200:
            assert got is None and expected is None
        else:
            assert (type(got), str(got)) == (type(expected), str(expected))
            assert SECRET not in str(got) and ACCESS_KEY not in str(got)
    assert paths[:2] == [f"/foundation-models/{CONVERSE.replace(':', '%3A')}",
                         "/inference-profiles/us.amazon.nova-pro-v1%3A0"]
    assert paths[2].startswith("/foundation-models/arn%3Aaws%3Abedrock%3Aus-east-1%3A")  # (as boto3 asks it)
    if code == 404:
        assert isinstance(got, ModelSetupError) and "is not a model this account can use" in str(got)


async def test_the_probe_sends_a_bedrock_api_key_as_boto3_does_and_never_in_the_clear(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    use_bedrock_api_key(monkeypatch)
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(FOUNDATION_MODEL).encode())
    got = await probe_outcome(BedrockProvider(settings(url)), CONVERSE)
    assert isinstance(got, ModelSetupError) and "needs an https base_url" in str(got) and seen == []
    if botocore_refuses_bearer_over_http():
        expected = await probe_outcome(SDKBedrock(settings(url)), CONVERSE)
        assert (type(got), str(got)) == (type(expected), str(expected)) and seen == []


@pytest.mark.parametrize(("variables", "lean"), [
    ({}, True),
    ({"HTTPS_PROXY": "http://127.0.0.1:9"}, False),
    ({"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "bedrock.us-east-1.amazonaws.com"}, True),
    ({"AWS_ENDPOINT_URL_BEDROCK": "http://127.0.0.1:9"}, False),
    ({"AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://127.0.0.1:9"}, True),  # the runtime's, not the control plane's
    ({"AWS_USE_DUALSTACK_ENDPOINT": "true"}, False),
])
def test_the_probe_keeps_boto3_where_a_proxy_or_an_endpoint_variable_applies(
        monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], lean: bool) -> None:
    from runner.providers.bedrock_probe import lean_lookup

    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert lean_lookup(BedrockProvider(settings(None))) is lean
    assert lean_lookup(SDKBedrock(settings(None))) is False


def test_the_control_plane_s_endpoint_is_the_one_boto3_picks() -> None:
    import boto3

    from runner.providers.bedrock_probe import control_base

    for region in ("us-east-1", "eu-central-1", "us-gov-west-1", "cn-north-1"):
        client = boto3.client("bedrock", region_name=region)
        assert control_base(BedrockProvider(settings(None, region=region))) == client.meta.endpoint_url, region
        client.close()


def test_a_probe_and_a_request_over_the_wire_import_neither_boto3_nor_the_anthropic_sdk(tmp_path: Path) -> None:
    """What ``runner submit`` runs before its first Converse request, in a new interpreter: the probe, then the run's
    start and one request."""
    import subprocess
    import sys

    script = (
        "import asyncio, sys\n"
        "from runner.providers.base import ProviderSettings\n"
        "from runner.providers.bedrock import BedrockProvider\n"
        "from simserver import start_server\n"
        "async def go():\n"
        "    async with await start_server() as srv:\n"
        "        for _ in range(2):\n"
        "            provider = BedrockProvider(ProviderSettings(base_url=srv.root_url))\n"
        "            await provider.probe('amazon.nova-pro-v1:0')\n"
        "            await provider.start()\n"
        "            await provider.execute('amazon.nova-pro-v1:0', [{'role': 'user', 'content': 'hi'}], {})\n"
        "            await provider.aclose()\n"
        "asyncio.run(go())\n"
        "print(sorted(name for name in ('boto3', 's3transfer', 'anthropic') if name in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


# -- the strict simulated server ------------------------------------------------------------------------------------

async def test_the_strict_servers_bedrock_routes_take_every_lean_request() -> None:
    """simserver/bedrock.py checks each Converse body against botocore's service model, each InvokeModel body
    against the SDK's types and the capability table, and each request's SigV4 access key: a field sent wrongly
    is a 400, a wrong key a 403."""
    async with await start_server(SimConfig(api_key=ACCESS_KEY)) as srv:
        provider = BedrockProvider(settings(srv.root_url))
        await provider.start()
        try:
            # (the server knows ids, not an account's ARNs; Nova Pro has no structured outputs)
            converse = [(m, p) for m, p in CONVERSE_CASES if m != PROFILE_ARN and "response_format" not in p]
            for model, params in converse:
                assert (await provider.execute(model, MESSAGES, params)).text
            for model, asked, marked in CLAUDE_CASES:
                messages, params = claude_request(provider, model, asked, marked)
                assert (await provider.execute(model, messages, params)).text
            assert provider.runtime is None and provider.claude is not None and provider.claude.client is None, \
                "no SDK client was needed"
        finally:
            await provider.aclose()
        stats = srv.stats()
    assert stats["by_status"] == {"200": len(converse) + 4}
    assert stats["by_route"]["bedrock-converse"] == len(converse) and stats["by_route"]["bedrock-invoke"] == 4
