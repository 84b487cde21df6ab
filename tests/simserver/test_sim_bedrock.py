"""The simulated server's Bedrock routes through the SDKs that speak them (boto3's bedrock-runtime and bedrock
clients, the anthropic SDK's AsyncAnthropicBedrock) and raw HTTP where an SDK would not send the request: Converse
and InvokeModel answers as the SDKs parse them, SigV4 required, errors in Bedrock's shape, strict mode's rules from
botocore's own service model, the lookups."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import boto3
import botocore.exceptions
import pytest
import pytest_asyncio
from botocore.config import Config

from simserver import SimServer, start_server
from tests.helpers import fresh, isolated_aws

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOVA = "amazon.nova-pro-v1:0"
CLAUDE = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
ACCESS_KEY = "AKIDSIMULATEDBEDROCK"
HI = [{"role": "user", "content": [{"text": "Hello there"}]}]
#: a well-formed SigV4 header (the server reads the access key id; it does not verify signatures)
SIGNED = {"Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/us-east-1/bedrock/aws4_request, "
                           "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64}


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS credentials from the environment only (tests/helpers.py)."""
    isolated_aws(monkeypatch, tmp_path, ACCESS_KEY, region=None)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared() -> AsyncIterator[SimServer]:
    async with await start_server() as server:
        yield server


@pytest.fixture
def srv(shared: SimServer) -> SimServer:
    return fresh(shared)


def client(srv: SimServer, service: str = "bedrock-runtime") -> Any:
    return boto3.client(service, region_name="us-east-1", endpoint_url=srv.root_url,
                        config=Config(retries={"mode": "standard", "total_max_attempts": 1}))


async def call(method: Callable[..., Any], **kwargs: Any) -> Any:
    """A boto3 call off the loop the server runs in."""
    return await asyncio.to_thread(method, **kwargs)


async def refusal(method: Callable[..., Any], **kwargs: Any) -> tuple[str, int, str]:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        await call(method, **kwargs)
    response = info.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Message"]


async def test_converse_answers_as_boto3_parses_it(srv):
    answer = await call(client(srv).converse, modelId=NOVA, messages=HI, system=[{"text": "Be brief."}],
                        inferenceConfig={"maxTokens": 8, "temperature": 0.0, "stopSequences": ["zzz"]})
    content = answer["output"]["message"]["content"]
    assert answer["output"]["message"]["role"] == "assistant" and isinstance(content[0]["text"], str)
    usage = answer["usage"]
    assert usage["outputTokens"] <= 8 and usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert answer["stopReason"] in ("end_turn", "max_tokens") and answer["metrics"]["latencyMs"] >= 0
    assert srv.stats()["by_route"]["bedrock-converse"] == 1


async def test_the_cap_ends_an_answer_with_max_tokens(srv):
    answer = await call(client(srv).converse, modelId=NOVA, messages=HI, inferenceConfig={"maxTokens": 1})
    assert answer["stopReason"] == "max_tokens" and answer["usage"]["outputTokens"] == 1


async def test_an_unknown_field_is_refused_by_the_service_models_rule(srv):
    runtime = client(srv)

    def smuggle(request: Any, **_: Any) -> None:  # past botocore's own check, as a hand-written client would
        body = json.loads(request.data)
        body["inferenceConfig"]["seed"] = 7
        request.data = json.dumps(body).encode()

    runtime.meta.events.register("before-sign.bedrock-runtime.Converse", smuggle)
    code, status, message = await refusal(runtime.converse, modelId=NOVA, messages=HI,
                                          inferenceConfig={"maxTokens": 5})
    assert (code, status) == ("ValidationException", 400)
    assert message == ("Malformed input request: extraneous key [seed] is not permitted, please reformat your input "
                       "and try again.")


async def test_a_value_out_of_the_service_models_range_is_refused(srv):
    # botocore checks no float ranges itself: the server does, from the same model (temperature 0 to 1)
    code, status, message = await refusal(client(srv).converse, modelId=NOVA, messages=HI,
                                          inferenceConfig={"temperature": 1.5})
    assert (code, status) == ("ValidationException", 400)
    assert message == ("1 validation error detected: Value '1.5' at 'inferenceConfig.temperature' failed to satisfy "
                       "constraint: Member must have value less than or equal to 1")
    assert srv.stats()["by_status"] == {"400": 1}


async def test_strict_off_takes_what_strict_refuses(srv):
    srv.configure(strict=False)
    answer = await call(client(srv).converse, modelId=NOVA, messages=HI, inferenceConfig={"temperature": 1.5})
    assert answer["stopReason"] in ("end_turn", "max_tokens")


async def test_sigv4_is_required_and_its_access_key_checked(srv):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.root_url}/model/{NOVA}/converse", json={"messages": HI}) as response:
            assert response.status == 403
            assert response.headers["x-amzn-ErrorType"].startswith("MissingAuthenticationTokenException:")
            assert await response.json() == {"message": "Missing Authentication Token"}
        bad = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/s3/aws4_request, "
                                "SignedHeaders=host, Signature=" + "0" * 64}
        async with http.post(f"{srv.root_url}/model/{NOVA}/converse", json={"messages": HI}, headers=bad) as response:
            assert response.status == 403  # signed for another service: malformed for Bedrock
    srv.configure(api_key="AKIDSOMEONEELSE")
    code, status, message = await refusal(client(srv).converse, modelId=NOVA, messages=HI)
    assert (code, status) == ("UnrecognizedClientException", 403)
    assert message == "The security token included in the request is invalid."


@pytest.mark.parametrize(("fault", "code", "status"), [("fault_429", "ThrottlingException", 429),
                                                       ("fault_500", "InternalServerException", 500),
                                                       ("fault_503", "ServiceUnavailableException", 503),
                                                       ("fault_quota", "ServiceQuotaExceededException", 400)])
async def test_faults_are_bedrocks_exceptions(srv, fault, code, status):
    srv.configure(**{fault: 1.0})
    assert (await refusal(client(srv).converse, modelId=NOVA, messages=HI))[:2] == (code, status)


async def test_a_filtered_answer_says_content_filtered(srv):
    srv.configure(fault_filter=1.0)
    answer = await call(client(srv).converse, modelId=NOVA, messages=HI)
    assert answer["stopReason"] == "content_filtered" and answer["output"]["message"]["content"] == []


def claude_sdk(srv: SimServer) -> anthropic.AsyncAnthropicBedrock:
    return anthropic.AsyncAnthropicBedrock(aws_region="us-east-1", base_url=srv.root_url, max_retries=0)


async def test_invoke_answers_claude_in_the_messages_format(srv):
    sdk = claude_sdk(srv)
    try:
        message = await sdk.messages.create(model=CLAUDE, max_tokens=10, system="Be brief.",
                                            messages=[{"role": "user", "content": "Hello there"}],
                                            extra_body={"anthropic_version": "bedrock-2023-05-31", "temperature": 0})
    finally:
        await sdk.close()
    assert message.type == "message" and message.content[0].type == "text" and message.usage.output_tokens >= 1
    assert srv.stats()["by_route"]["bedrock-invoke"] == 1


async def test_invoke_refuses_the_sdks_default_version_and_a_model_field(srv):
    sdk = claude_sdk(srv)
    try:
        with pytest.raises(anthropic.BadRequestError) as info:  # anthropic 2.x fills in 2026-10-21 by itself
            await sdk.messages.create(model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
        assert "anthropic_version" in info.value.body["message"]
        assert info.value.response.headers["x-amzn-ErrorType"].startswith("ValidationException:")
        with pytest.raises(anthropic.BadRequestError) as info:  # the Messages API's own rules, by its Claude name
            await sdk.messages.create(model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
                                      extra_body={"anthropic_version": "bedrock-2023-05-31", "temperature": 1.5})
        assert info.value.body["message"] == "temperature: Input should be less than or equal to 1"
    finally:
        await sdk.close()
    body = {"anthropic_version": "bedrock-2023-05-31", "model": CLAUDE, "max_tokens": 10,
            "messages": [{"role": "user", "content": "Hi"}]}  # the SDK moves the model to the path: raw HTTP
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.root_url}/model/{CLAUDE}/invoke", json=body, headers=SIGNED) as response:
            assert response.status == 400
            assert "extraneous key [model]" in (await response.json())["message"]


async def test_the_lookups_answer_as_boto3_parses_them_and_are_not_counted(srv):
    control = client(srv, "bedrock")
    details = (await call(control.get_foundation_model, modelIdentifier=NOVA))["modelDetails"]
    assert details["modelId"] == NOVA and details["modelLifecycle"]["status"] == "ACTIVE"
    profile = await call(control.get_inference_profile, inferenceProfileIdentifier=CLAUDE)
    assert profile["inferenceProfileId"] == CLAUDE and profile["status"] == "ACTIVE"
    srv.configure(models=NOVA)
    code, status, _ = await refusal(control.get_inference_profile, inferenceProfileIdentifier=CLAUDE)
    assert (code, status) == ("ResourceNotFoundException", 404)
    srv.configure(api_key="AKIDSOMEONEELSE")
    assert (await refusal(control.get_foundation_model, modelIdentifier=NOVA))[0] == "UnrecognizedClientException"
    assert srv.stats()["received"] == 0


def _roles() -> list[str]:
    """The conversation roles the installed botocore's bedrock-runtime model lists (1.44 added "system")."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    return list(model.shape_for("ConversationRole").enum)


@pytest.mark.parametrize(("body", "words"), [
    ({"messages": "Hello"}, "Value 'Hello' at 'messages' failed to satisfy constraint: Member must be a list"),
    # two members of a content block (a union) that every botocore the boto3 floor allows has: cachePoint came later,
    # and where botocore's model lacks it the block is refused for that key instead
    ({"messages": [{"role": "user", "content": [{"text": "a", "image": {"format": "png", "source": {"bytes": ""}}}]}]},
     "at 'messages.1.member.content.1.member' failed to satisfy constraint: Member must have exactly one member set"),
    ({"messages": [{"role": "robot", "content": [{"text": "a"}]}]},
     "at 'messages.1.member.role' failed to satisfy constraint: Member must satisfy enum value set: "
     f"[{', '.join(_roles())}]"),
    ({"messages": [{"role": "user"}]},
     "Value null at 'messages.1.member.content' failed to satisfy constraint: Member must not be null"),
])
async def test_what_botocore_would_not_send_is_refused_in_bedrocks_words(srv, body, words):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.root_url}/model/{NOVA}/converse", json=body, headers=SIGNED) as response:
            assert response.status == 400
            assert response.headers["x-amzn-ErrorType"].startswith("ValidationException:")
            assert words in (await response.json())["message"]


# -- outputConfig: structured outputs and effort, against botocore's shape and the server's own rules ---------------

GPT_OSS = "openai.gpt-oss-120b-1:0"
LETTER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
          "required": ["answer"], "additionalProperties": False}


def _output_config_members() -> set[str]:
    import botocore.session

    shape = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse").input_shape
    member = shape.members.get("outputConfig")
    return set(member.members) if member is not None else set()


needs_output_config = pytest.mark.skipif(not {"textFormat", "effort"} <= _output_config_members(),
                                         reason="the installed botocore's Converse has no outputConfig.textFormat "
                                                "and effort")


def text_format(schema: Any) -> dict[str, Any]:
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {"schema": schema, "name": "letter"}}}}


@needs_output_config
async def test_converse_structured_output_answers_an_instance_of_the_schema(srv):
    answer = await call(client(srv).converse, modelId=GPT_OSS, messages=HI, outputConfig=text_format(
        json.dumps(LETTER)))
    text = answer["output"]["message"]["content"][0]["text"]
    assert json.loads(text)["answer"] in ("A", "B", "C", "D") and set(json.loads(text)) == {"answer"}
    geography = await call(client(srv).converse, modelId="us." + GPT_OSS, messages=HI,
                           outputConfig=text_format(json.dumps(LETTER)))
    assert json.loads(geography["output"]["message"]["content"][0]["text"])["answer"]


@needs_output_config
async def test_converse_structured_output_is_refused_where_bedrock_does_not_serve_it(srv):
    """Bedrock's structured outputs page lists the models that take outputConfig.textFormat: Nova is not one."""
    code, status, message = await refusal(client(srv).converse, modelId=NOVA, messages=HI,
                                          outputConfig=text_format(json.dumps(LETTER)))
    assert (code, status) == ("ValidationException", 400)
    assert message == (f"The model {NOVA} does not support structured outputs (outputConfig.textFormat); use a model "
                       "that supports them.")


@needs_output_config
async def test_converse_output_config_is_checked_against_the_service_model(srv):
    runtime = client(srv)
    # a schema is a String in JsonSchemaDefinition, holding a JSON Schema document
    code, _, message = await refusal(runtime.converse, modelId=GPT_OSS, messages=HI,
                                     outputConfig=text_format("{not json"))
    assert code == "ValidationException" and "at 'outputConfig.textFormat.structure.jsonSchema.schema'" in message
    # effort: a string of 0 to 16 characters (botocore sends any such); its documentation names the values
    code, _, message = await refusal(runtime.converse, modelId=GPT_OSS, messages=HI, outputConfig={"effort": "extreme"})
    assert code == "ValidationException"
    assert message.endswith("at 'outputConfig.effort' failed to satisfy constraint: Member must satisfy enum value "
                            "set: [low, medium, high, xhigh, max]")
    answer = await call(runtime.converse, modelId=GPT_OSS, messages=HI, outputConfig={"effort": "high"})
    assert answer["stopReason"] in ("end_turn", "max_tokens")

    def smuggle(request: Any, **_: Any) -> None:  # past botocore's own check: a member its shape does not have
        body = json.loads(request.data)
        body["outputConfig"]["textFormat"]["strict"] = True
        request.data = json.dumps(body).encode()

    runtime.meta.events.register("before-sign.bedrock-runtime.Converse", smuggle)
    code, _, message = await refusal(runtime.converse, modelId=GPT_OSS, messages=HI,
                                     outputConfig=text_format(json.dumps(LETTER)))
    assert message.startswith("Malformed input request: extraneous key [strict] is not permitted")
