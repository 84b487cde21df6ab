"""Strict mode (simserver.strict): each request the real API refuses is refused through the official SDK with the
real status and error body, and its well-formed counterpart is answered; batch lines get the same checks."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from simserver import SimServer, strict
from simserver.cli import main as simserver_main

pytestmark = pytest.mark.asyncio(loop_scope="module")

HI = [{"role": "user", "content": "hi"}]


def claude_sdk(srv: SimServer, version: str | None) -> anthropic.AsyncAnthropic:
    """anthropic 2.x; ``version`` None keeps the SDK's own default (2026-10-21)."""
    headers = {"anthropic-version": version} if version else {}
    return anthropic.AsyncAnthropic(base_url=srv.root_url, api_key="k", max_retries=0, default_headers=headers)


def gemini_sdk(srv: SimServer, version: str) -> genai.Client:
    """A google-genai client of the simulated server speaking API ``version``, always named: the SDK's own default
    is not the same in every google-genai the floor allows (v1beta in 2.33, v1 in 3.x)."""
    return genai.Client(api_key="k", http_options=genai_types.HttpOptions(
        base_url=srv.root_url, retry_options=genai_types.HttpRetryOptions(attempts=1), api_version=version))


# -- OpenAI -------------------------------------------------------------------------------------------------

#: (model, refused arguments, the error's code, param and message start, accepted arguments)
OPENAI_CASES = [
    ("gpt-4o", {"stop": list("abcde")}, "array_above_max_length", "stop", "Invalid 'stop': array too long",
     {"stop": list("abcd")}),
    ("gpt-4o", {"temperature": 2.5}, "decimal_above_max_value", "temperature", "Invalid 'temperature'",
     {"temperature": 2.0}),
    ("gpt-4o", {"response_format": {"type": "json_schema", "json_schema": {"name": "my answer",
                                                                           "schema": {"type": "object"}}}},
     "invalid_value", "response_format.json_schema.name", "Invalid 'response_format.json_schema.name'",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "my_answer", "schema": {"type": "object"}}}}),
    ("o3", {"temperature": 0}, "unsupported_value", "temperature",
     "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value is supported.",
     {"temperature": 1}),
    ("o3", {"max_tokens": 100}, "unsupported_parameter", "max_tokens",
     "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
     {"max_completion_tokens": 100}),
    ("o3", {"top_p": 0.5}, "unsupported_value", "top_p", "Unsupported value: 'top_p'", {}),
    ("o3", {"logprobs": True}, "unsupported_parameter", "logprobs", "Unsupported parameter: 'logprobs'", {}),
    ("o3", {"presence_penalty": 0.5}, "unsupported_parameter", "presence_penalty",
     "Unsupported parameter: 'presence_penalty'", {"presence_penalty": 0}),
    ("o4-mini", {"frequency_penalty": -1}, "unsupported_parameter", "frequency_penalty",
     "Unsupported parameter: 'frequency_penalty'", {}),
    ("gpt-5", {"stop": ["x"]}, "unsupported_parameter", "stop", "Unsupported parameter: 'stop'", {}),
    ("gpt-4o", {"reasoning_effort": "low"}, "unsupported_parameter", "reasoning_effort",
     "Unsupported parameter: 'reasoning_effort'", {}),
    ("o3", {"reasoning_effort": "minimal"}, "unsupported_value", "reasoning_effort",
     "Unsupported value: 'reasoning_effort' does not support 'minimal'", {"reasoning_effort": "low"}),
    ("gpt-4o", {"extra_body": {"frobnicate": 1}}, None, None, "Unrecognized request argument supplied: frobnicate",
     {"extra_body": {"seed": 7}}),
]


@pytest.mark.parametrize(("model", "refused", "code", "param", "message", "accepted"), OPENAI_CASES,
                         ids=[f"{c[0]}-{c[4][:40]}" for c in OPENAI_CASES])
async def test_openai_refuses_what_the_real_api_refuses(srv: SimServer, oa: openai.AsyncOpenAI, model: str,
                                                        refused: dict[str, Any], code: str | None, param: str | None,
                                                        message: str, accepted: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await oa.chat.completions.create(model=model, messages=HI, **refused)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    assert error["code"] == code and error["param"] == param and error["message"].startswith(message)
    answer = await oa.chat.completions.create(model=model, messages=HI, **accepted)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason in ("stop", "length")


async def test_openai_made_up_models_take_the_usual_parameters(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    for model in ("gpt-test", "sim-model", "sim-a"):
        answer = await oa.chat.completions.create(model=model, messages=HI, temperature=0, top_p=1, max_tokens=20,
                                                  stop=["zz"], seed=3, logprobs=True, top_logprobs=2)
        assert answer.choices[0].message.content


# -- Anthropic ----------------------------------------------------------------------------------------------

#: (model, API version (None: the SDK's default), refused arguments, message start, accepted arguments)
ANTHROPIC_CASES = [
    ("claude-3-5-haiku-20241022", None, {"extra_body": {"temperature": 0}},
     "temperature: Extra inputs are not permitted", {}),
    ("claude-3-5-haiku-20241022", "2026-10-21", {"extra_body": {"top_k": 5}}, "top_k: Extra inputs are not permitted",
     {}),
    ("claude-3-5-haiku-20241022", "2023-06-01", {"extra_body": {"temperature": 1.5}},
     "temperature: Input should be less than or equal to 1", {"extra_body": {"temperature": 0, "top_k": 5}}),
    ("claude-sonnet-4-5", "2023-06-01", {"extra_body": {"temperature": 0, "top_p": 0.9}},
     "`temperature` and `top_p` cannot both be specified for this model. Please use only one.",
     {"extra_body": {"temperature": 0}}),
    ("claude-opus-4-7", "2023-06-01", {"extra_body": {"temperature": 0}}, "`temperature` is not supported", {}),
    ("claude-sonnet-4-5", "2023-06-01", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 500}},
     "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
     {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}}),
    ("claude-sonnet-4-5", "2023-06-01", {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 2048}},
     "`max_tokens` must be greater than `thinking.budget_tokens`", {}),
    ("claude-sonnet-4-5", "2023-06-01", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048},
                                         "extra_body": {"temperature": 0}},
     "`temperature` may only be set to 1 when thinking is enabled", {}),
    ("claude-sonnet-4-5", "2023-06-01", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048},
                                         "extra_body": {"top_k": 5}}, "`top_k` is not compatible with thinking", {}),
    ("claude-sonnet-4-5", "2023-06-01", {"thinking": {"type": "adaptive"}}, "adaptive thinking is not supported", {}),
    ("claude-3-5-haiku-20241022", "2023-06-01",
     {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "output_config.format: structured outputs are not supported", {}),
    ("claude-3-5-haiku-20241022", "2023-06-01", {"max_tokens": 9000}, "max_tokens: 9000 > 8192, which is the maximum "
     "allowed number of output tokens for claude-3-5-haiku-20241022", {"max_tokens": 8192}),
    ("sim-a", "2023-06-01", {"extra_body": {"frobnicate": 1}}, "frobnicate: Extra inputs are not permitted", {}),
]


@pytest.mark.parametrize(("model", "version", "refused", "message", "accepted"), ANTHROPIC_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3][:30]}" for c in ANTHROPIC_CASES])
async def test_anthropic_refuses_what_the_real_api_refuses(srv: SimServer, model: str, version: str | None,
                                                           refused: dict[str, Any], message: str,
                                                           accepted: dict[str, Any]) -> None:
    sdk = claude_sdk(srv, version)
    try:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await sdk.messages.create(model=model, messages=HI, **{"max_tokens": 50, **refused})  # type: ignore[arg-type]
        good = await sdk.messages.create(model=model, messages=HI, **{"max_tokens": 50, **accepted})  # type: ignore[arg-type]
    finally:
        await sdk.close()
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(message)
    assert good.content


async def test_anthropic_adaptive_thinking_and_structured_outputs_where_the_model_has_them(srv: SimServer) -> None:
    sdk = claude_sdk(srv, "2023-06-01")
    try:
        good = await sdk.messages.create(model="claude-opus-4-6", max_tokens=50, messages=HI,  # type: ignore[arg-type]
                                         thinking={"type": "adaptive"},
                                         output_config={"effort": "high", "format": {
                                             "type": "json_schema", "schema": {"type": "object"}}})
    finally:
        await sdk.close()
    assert good.content


# -- Gemini -------------------------------------------------------------------------------------------------

#: (model, refused version, refused config, message, accepted version, accepted config)
GEMINI_CASES = [
    ("gemini-2.0-flash", "v1", {"system_instruction": "Be brief."},
     'Invalid JSON payload received. Unknown name "systemInstruction": Cannot find field.', "v1beta", None),
    ("gemini-2.0-flash", "v1", {"response_mime_type": "application/json"},
     "Invalid JSON payload received. Unknown name \"responseMimeType\" at 'generation_config': Cannot find field.",
     "v1beta", None),
    ("gemini-2.5-flash", "v1", {"thinking_config": {"thinking_budget": 1024}},
     "Invalid JSON payload received. Unknown name \"thinkingConfig\" at 'generation_config': Cannot find field.",
     "v1beta", None),
    ("gemini-2.0-flash", "v1beta", {"stop_sequences": list("abcdef")}, "* GenerateContentRequest.generation_config."
     "stop_sequences", "v1beta", {"stop_sequences": list("abcde")}),
    ("gemini-2.0-flash", "v1beta", {"seed": 2**31},
     "Invalid JSON payload received. Invalid value at 'generation_config.seed' (TYPE_INT32), 2147483648", "v1beta",
     {"seed": 2**31 - 1}),
    ("gemini-2.0-flash", "v1beta", {"temperature": 2.5}, "Unable to submit request because it has a temperature "
     "value of 2.5", "v1beta", {"temperature": 2.0}),
    ("gemini-2.5-pro", "v1beta", {"thinking_config": {"thinking_budget": 0}},
     "Budget 0 is invalid. This model only works in thinking mode.", "v1beta",
     {"thinking_config": {"thinking_budget": 128}}),
    ("gemini-2.5-pro", "v1beta", {"thinking_config": {"thinking_budget": 64}},
     "The thinking budget 64 is invalid.", "v1beta", {"thinking_config": {"thinking_budget": 128}}),
    ("gemini-2.5-flash", "v1beta", {"presence_penalty": 0.5}, "Penalty is not enabled for models/gemini-2.5-flash",
     "v1beta", {"presence_penalty": 0.0}),
    ("gemini-2.5-pro", "v1beta", {"frequency_penalty": 1.0}, "Penalty is not enabled for models/gemini-2.5-pro",
     "v1beta", {"temperature": 1.0}),
]


@pytest.mark.parametrize(("model", "version", "refused", "message", "good_version", "accepted"), GEMINI_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3][:40]}" for c in GEMINI_CASES])
async def test_gemini_refuses_what_the_real_api_refuses(srv: SimServer, model: str, version: str,
                                                        refused: dict[str, Any], message: str, good_version: str,
                                                        accepted: dict[str, Any] | None) -> None:
    bad, good = gemini_sdk(srv, version), gemini_sdk(srv, good_version)
    try:
        with pytest.raises(genai_errors.ClientError) as caught:
            await bad.aio.models.generate_content(model=model, contents="hi",
                                                  config=genai_types.GenerateContentConfig(**refused))
        answer = await good.aio.models.generate_content(
            model=model, contents="hi", config=genai_types.GenerateContentConfig(**(accepted or refused)))
    finally:
        await bad.aio.aclose(), await good.aio.aclose()
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert caught.value.message is not None and caught.value.message.startswith(message)
    assert answer.text


# -- batch lines ----------------------------------------------------------------------------------------------

async def test_openai_batch_line_refused_as_online(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    lines = {"bad": {"model": "o3", "messages": HI, "temperature": 0}, "good": {"model": "o3", "messages": HI}}
    data = "".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
                   + "\n" for cid, body in lines.items())
    upload = await oa.files.create(file=("input.jsonl", data.encode()), purpose="batch")
    created = await oa.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
    done = await oa.batches.retrieve(created.id)
    assert done.request_counts and done.request_counts.failed == 1 and done.request_counts.completed == 1
    assert done.error_file_id is not None
    errors = [json.loads(line) for line in (await oa.files.content(done.error_file_id)).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["code"] == "unsupported_value"
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"


@pytest.mark.parametrize(("version", "outcome"), [("2023-06-01", "succeeded"), (None, "errored")])
async def test_anthropic_batch_lines_are_checked_under_the_create_requests_version(
        srv: SimServer, version: str | None, outcome: str) -> None:
    sdk = claude_sdk(srv, version)
    try:
        params = {"model": "claude-3-5-haiku-20241022", "max_tokens": 20, "messages": HI, "temperature": 0}
        created = await sdk.messages.batches.create(requests=[{"custom_id": "q", "params": params}])  # type: ignore[list-item]
        await sdk.messages.batches.retrieve(created.id)
        results = [r async for r in await sdk.messages.batches.results(created.id)]
    finally:
        await sdk.close()
    assert results[0].result.type == outcome
    if outcome == "errored":
        error = results[0].result.error  # type: ignore[union-attr]
        assert error.error.type == "invalid_request_error"
        assert error.error.message == "temperature: Extra inputs are not permitted"


async def test_gemini_batch_lines_are_v1beta_and_checked(srv: SimServer) -> None:
    sdk = gemini_sdk(srv, "v1beta")
    try:
        good = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                "config": {"system_instruction": "Be brief.", "max_output_tokens": 10}}
        bad = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "config": {"stop_sequences": list("abcdef")}}
        job = await sdk.aio.batches.create(model="gemini-2.0-flash", src=[good, bad])  # type: ignore[arg-type]
        assert job.name
        done = await sdk.aio.batches.get(name=job.name)
    finally:
        await sdk.aio.aclose()
    assert done.dest and done.dest.inlined_responses
    first, second = done.dest.inlined_responses
    assert first.error is None and first.response and first.response.text
    assert second.error is not None and second.error.code == 3  # INVALID_ARGUMENT
    assert "stop_sequences" in (second.error.message or "")


# -- the knob ---------------------------------------------------------------------------------------------------

async def test_lenient_takes_what_strict_refuses(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    srv.configure(strict=False)
    answer = await oa.chat.completions.create(model="o3", messages=HI, temperature=0, max_tokens=10)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason in ("stop", "length")


async def test_lenient_flag_and_config_field(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr("simserver.cli.serve", lambda host, port, config: seen.append(config))
    simserver_main(["--port", "0"])
    simserver_main(["--port", "0", "--lenient"])
    assert [c.strict for c in seen] == [True, False]


async def test_extracts_name_their_origin() -> None:
    from importlib.resources import files

    for name in ("openai_chat_request.json", "gemini_fields.json"):
        source = json.loads(files("simserver").joinpath("published", name).read_text())["source"]
        assert source["repository"].startswith("github.com/") and len(source["commit"]) == 40 and source["licence"]
    assert strict.refusal("openai", {"model": "gpt-4o", "messages": HI}, model="gpt-4o", headers={},
                          path="/v1/chat/completions") is None
