"""The simulated server answering like the real APIs for reasoning models, structured outputs and refusals
(simserver.respond), through the official openai, anthropic and google-genai SDKs and the runner's providers,
over 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from runner.errors import Refused
from runner.providers.base import ProviderSettings, provider_class
from runner.providers.capabilities import shape
from simserver import SimServer, simulated_reply
from simserver.answers import REFUSAL, THINKING_TOKENS, count_tokens, schema_instance

pytestmark = pytest.mark.asyncio(loop_scope="module")
MC = "Which is a fruit?\nA. carrot\nB. apple\nC. potato\nD. onion\nAnswer:"
FREE = "Describe the weather today in a few words."
LETTERS = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
           "required": ["answer"], "additionalProperties": False}
#: a schema with most of what structured outputs take: enums, bounds, arrays, $ref, anyOf, formats, lengths
RICH = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["A", "B", "C", "D"]},
        "confidence": {"type": "integer", "minimum": 1, "maximum": 5},
        "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "reasons": {"type": "array", "items": {"$ref": "#/$defs/reason"}, "minItems": 2, "maxItems": 3},
        "verdict": {"type": "string", "enum": ["yes", "no"]},
        "note": {"anyOf": [{"type": "string", "minLength": 40}, {"type": "null"}]},
        "when": {"type": "string", "format": "date"},
        "ok": {"type": "boolean"},
        "nothing": {"type": "null"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
        "both": {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                           {"properties": {"y": {"const": 7}}, "required": ["y"]}]},
    },
    "required": ["answer", "confidence", "score", "reasons", "verdict", "note", "when", "ok", "nothing", "tags",
                 "both"],
    "additionalProperties": False,
    "$defs": {"reason": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 10}},
                         "required": ["text"], "additionalProperties": False}},
}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def digest(messages: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


def fraction(salt: str, key: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{salt}\0{key}".encode()).digest()[:8], "big") / 2**64


def thinking(messages: list[dict[str, Any]], effort: str | None = None, budget: int | None = None) -> int:
    """The documented rule (simserver.answers.thinking_tokens), written out again."""
    low, high = THINKING_TOKENS[effort or "medium"]
    tokens = low + int(fraction("thinking", digest(messages)) * (high - low + 1))
    return min(tokens, budget) if budget is not None else tokens


def validate(schema: dict[str, Any], text: str) -> Any:
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    return value


async def ask_gemini(gemini: genai.Client, model: str, text: str = MC, **config: Any
                     ) -> genai_types.GenerateContentResponse:
    return await gemini.aio.models.generate_content(
        model=model, contents=text, config=genai_types.GenerateContentConfig(**config) if config else None)


async def through_runner(srv: SimServer, provider: str, model: str, params: dict[str, Any],
                         monkeypatch: pytest.MonkeyPatch, text: str = MC) -> Any:
    """Shape ``params`` for the model and send them through the runner's provider to the simulated server: the
    Completion, or the error raised."""
    monkeypatch.setenv({"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY",
                        "gemini": "GEMINI_API_KEY"}[provider], "test-key")
    shaped = shape(provider, model, params)
    assert not shaped.problems, shaped.problems
    base = srv.url if provider == "openai" else srv.root_url
    instance = provider_class(provider)(ProviderSettings(base_url=base, timeout=5))
    await instance.start()
    try:
        return await instance.execute(model, user(text), shaped.params)
    except Exception as exc:  # noqa: BLE001 - the test looks at it
        return exc
    finally:
        await instance.aclose()


# -- thinking: OpenAI --------------------------------------------------------------------------------------------


async def test_openai_reasoning_model_bills_reasoning_tokens_and_returns_no_thinking(
        srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    answer = await oa.chat.completions.create(model="o3", messages=user(MC), max_completion_tokens=1000)
    spent = thinking(user(MC))
    assert THINKING_TOKENS["medium"][0] <= spent <= THINKING_TOKENS["medium"][1]
    usage = answer.usage
    assert usage and usage.completion_tokens_details
    assert usage.completion_tokens_details.reasoning_tokens == spent
    assert usage.completion_tokens == spent + 1  # one token of answer, the letter
    assert answer.choices[0].message.content == simulated_reply("o3", user(MC), max_tokens=1000)[0]
    assert answer.choices[0].finish_reason == "stop"
    raw = answer.choices[0].message.model_dump()
    assert "reasoning_content" not in raw and "reasoning" not in raw  # Chat Completions returns no thinking
    low = await oa.chat.completions.create(model="o3", messages=user(MC), max_completion_tokens=1000,
                                           reasoning_effort="low")
    assert low.usage and low.usage.completion_tokens_details
    assert low.usage.completion_tokens_details.reasoning_tokens == thinking(user(MC), "low")


async def test_openai_effort_none_and_chat_models_do_not_think(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    for model, params in (("gpt-5.1", {"reasoning_effort": "none"}), ("gpt-4o", {}), ("sim-a", {})):
        answer = await oa.chat.completions.create(model=model, messages=user(MC), **params)
        assert answer.usage and answer.usage.completion_tokens_details
        assert answer.usage.completion_tokens_details.reasoning_tokens == 0 and answer.usage.completion_tokens == 1
    thinks = await oa.chat.completions.create(model="gpt-5.1", messages=user(MC))  # reasoning "default"
    assert thinks.usage and thinks.usage.completion_tokens_details
    assert thinks.usage.completion_tokens_details.reasoning_tokens == thinking(user(MC))


async def test_openai_small_cap_on_a_reasoning_model_comes_back_empty_and_billed(
        srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    answer = await oa.chat.completions.create(model="o3", messages=user(MC), max_completion_tokens=8)
    assert answer.choices[0].message.content == "" and answer.choices[0].finish_reason == "length"
    assert answer.usage and answer.usage.completion_tokens == 8
    assert answer.usage.completion_tokens_details and answer.usage.completion_tokens_details.reasoning_tokens == 8
    # room for part of a free-text answer: the words that fit after the thinking
    spent = thinking(user(FREE))
    cut = await oa.chat.completions.create(model="o3", messages=user(FREE), max_completion_tokens=spent + 3)
    full = await oa.chat.completions.create(model="o3", messages=user(FREE), max_completion_tokens=spent + 3,
                                            reasoning_effort="medium")
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content
    assert len(cut.choices[0].message.content.split(" ")) == 3
    assert cut.usage and cut.usage.completion_tokens == spent + 3
    assert full.choices[0].message.content == cut.choices[0].message.content  # medium is what o3 uses unasked


# -- thinking: Anthropic -----------------------------------------------------------------------------------------


async def test_anthropic_budget_thinking_block_apart_from_the_answer(srv: SimServer,
                                                                     claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(model="claude-sonnet-4-6", max_tokens=3000, messages=user(MC),
                                           thinking={"type": "enabled", "budget_tokens": 2048})
    block, text = message.content
    assert isinstance(block, anthropic.types.ThinkingBlock) and block.signature
    assert isinstance(text, anthropic.types.TextBlock)
    assert text.text == simulated_reply("claude-sonnet-4-6", user(MC), max_tokens=3000)[0]
    assert "Option " in block.thinking and f"Option {text.text} " not in block.thinking
    assert " no" in block.thinking and "yes" in block.thinking.lower()
    spent = thinking(user(MC))
    assert message.usage.output_tokens == spent + 1
    assert message.usage.output_tokens_details and message.usage.output_tokens_details.thinking_tokens == spent
    assert message.stop_reason == "end_turn"


async def test_anthropic_adaptive_thinking_display(srv: SimServer, claude: anthropic.AsyncAnthropic) -> None:
    async def thought(model: str, **thinking_config: Any) -> str:
        message = await claude.messages.create(model=model, max_tokens=3000, messages=user(MC),
                                               thinking={"type": "adaptive", **thinking_config},  # type: ignore
                                               output_config={"effort": "high"})
        block = message.content[0]
        assert isinstance(block, anthropic.types.ThinkingBlock) and block.signature
        assert message.usage.output_tokens_details
        assert message.usage.output_tokens_details.thinking_tokens == thinking(user(MC), "high")
        return block.thinking

    assert await thought("claude-opus-4-7", display="summarized")  # what the runner sends
    assert await thought("claude-opus-4-7") == ""  # Opus 4.7 and later omit it by default
    assert await thought("claude-sonnet-4-6")  # earlier Claude 4 models summarize by default
    assert await thought("claude-sonnet-4-6", display="omitted") == ""


async def test_anthropic_always_thinking_model_and_the_cap(srv: SimServer, claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(model="claude-fable-5-2", max_tokens=3000, messages=user(MC))
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.usage.output_tokens == thinking(user(MC)) + 1
    cut = await claude.messages.create(model="claude-opus-4-7", max_tokens=8, messages=user(MC),
                                       thinking={"type": "adaptive", "display": "summarized"})
    assert cut.stop_reason == "max_tokens" and [b.type for b in cut.content] == ["thinking"]
    assert cut.usage.output_tokens == 8
    plain = await claude.messages.create(model="claude-sonnet-4-6", max_tokens=3000, messages=user(MC))
    assert [b.type for b in plain.content] == ["text"] and plain.usage.output_tokens_details is None


# -- thinking: Gemini --------------------------------------------------------------------------------------------


async def test_gemini_thought_part_and_thoughts_token_count(srv: SimServer, gemini: genai.Client) -> None:
    response = await ask_gemini(gemini, "gemini-2.5-flash", thinking_config=genai_types.ThinkingConfig(
        thinking_budget=100, include_thoughts=True))
    parts = response.candidates[0].content.parts  # type: ignore[index,union-attr]
    assert parts and [bool(p.thought) for p in parts] == [True, False]
    assert parts[1].text == simulated_reply("gemini-2.5-flash", user(MC))[0] == response.text
    assert "Option " in parts[0].text and f"Option {parts[1].text} " not in parts[0].text  # type: ignore[operator]
    usage = response.usage_metadata
    assert usage and usage.thoughts_token_count == thinking(user(MC), budget=100) and usage.candidates_token_count == 1
    assert usage.total_token_count == usage.prompt_token_count + usage.thoughts_token_count + 1  # type: ignore[operator]
    level = await ask_gemini(gemini, "gemini-3-pro-preview", thinking_config=genai_types.ThinkingConfig(
        thinking_level=genai_types.ThinkingLevel.LOW))
    assert level.usage_metadata and level.usage_metadata.thoughts_token_count == thinking(user(MC), "low")
    assert [bool(p.thought) for p in level.candidates[0].content.parts] == [False]  # type: ignore[index,union-attr]


async def test_gemini_default_thinking_models_and_budget_zero(srv: SimServer, gemini: genai.Client) -> None:
    pro = await ask_gemini(gemini, "gemini-2.5-pro")
    assert pro.usage_metadata and pro.usage_metadata.thoughts_token_count == thinking(user(MC))
    off = await ask_gemini(gemini, "gemini-2.5-flash", thinking_config=genai_types.ThinkingConfig(thinking_budget=0))
    assert off.usage_metadata and off.usage_metadata.thoughts_token_count is None
    old = await ask_gemini(gemini, "gemini-2.0-flash")
    assert old.usage_metadata and old.usage_metadata.thoughts_token_count is None


async def test_gemini_thinking_fills_a_small_cap(srv: SimServer, gemini: genai.Client) -> None:
    response = await ask_gemini(gemini, "gemini-2.5-pro", max_output_tokens=8)
    candidate = response.candidates[0]  # type: ignore[index]
    assert candidate.finish_reason == genai_types.FinishReason.MAX_TOKENS
    assert candidate.content is not None and not candidate.content.parts and response.text is None
    assert response.usage_metadata and response.usage_metadata.thoughts_token_count == 8
    assert not response.usage_metadata.candidates_token_count


async def test_same_conversation_thinks_the_same_in_every_format(srv: SimServer, oa: openai.AsyncOpenAI,
                                                                 claude: anthropic.AsyncAnthropic,
                                                                 gemini: genai.Client) -> None:
    spent = thinking(user(FREE), "low")
    chat = await oa.chat.completions.create(model="o3", messages=user(FREE), reasoning_effort="low")
    message = await claude.messages.create(model="claude-opus-4-7", max_tokens=3000, messages=user(FREE),
                                           thinking={"type": "adaptive"}, output_config={"effort": "low"})
    response = await ask_gemini(gemini, "gemini-3-pro-preview", FREE,
                                thinking_config=genai_types.ThinkingConfig(thinking_level="low"))
    assert chat.usage and chat.usage.completion_tokens_details
    assert chat.usage.completion_tokens_details.reasoning_tokens == spent
    assert message.usage.output_tokens_details and message.usage.output_tokens_details.thinking_tokens == spent
    assert response.usage_metadata and response.usage_metadata.thoughts_token_count == spent


# -- through the runner's providers ----------------------------------------------------------------------------


@pytest.mark.parametrize(("provider", "model", "params", "shows"), [
    ("openai", "o3", {"max_tokens": 8}, False),
    ("anthropic", "claude-sonnet-4-6", {"max_tokens": 8, "reasoning": {"budget_tokens": 2048}}, True),
    ("anthropic", "claude-fable-5-2", {"max_tokens": 8, "reasoning": {"effort": "low"}}, True),
    ("gemini", "gemini-2.5-flash", {"max_tokens": 8, "reasoning": {"budget_tokens": 1000}}, True),
    ("gemini", "gemini-3-pro-preview", {"max_tokens": 8, "reasoning": {"effort": "low"}}, True),
])
async def test_runner_reads_the_answer_not_the_thinking(srv: SimServer, monkeypatch: pytest.MonkeyPatch,
                                                        provider: str, model: str, params: dict[str, Any],
                                                        shows: bool) -> None:
    completion = await through_runner(srv, provider, model, params, monkeypatch)
    assert not isinstance(completion, Exception), completion
    assert completion.text in ("A", "B", "C", "D") and completion.reasoning_tokens > 0
    assert completion.output_tokens == completion.reasoning_tokens + 1
    if shows:
        assert completion.thinking and "Option " in completion.thinking
        assert f"Option {completion.text} " not in completion.thinking
    else:
        assert completion.thinking is None


# -- structured outputs ------------------------------------------------------------------------------------------


async def test_schema_instances_validate() -> None:
    for seed in ("a", "b", "c", "d"):
        value = schema_instance(RICH, "C", seed)
        jsonschema.Draft202012Validator(RICH, format_checker=jsonschema.FormatChecker()).validate(value)
        assert value["answer"] == "C" and value["both"]["y"] == 7
    assert schema_instance({"type": "string", "enum": ["yes", "no"]}, "No.", "x") == "no"
    assert schema_instance({"type": ["null", "integer"], "minimum": 3, "maximum": 3}, "", "x") == 3
    gemini_schema = {"type": "OBJECT", "properties": {"n": {"type": "INTEGER"}, "a": {"type": "STRING"}},
                     "propertyOrdering": ["a", "n"]}
    assert list(schema_instance(gemini_schema, "B", "x")) == ["a", "n"]


async def test_openai_json_schema_answer_conforms_and_keeps_the_letter(srv: SimServer,
                                                                       oa: openai.AsyncOpenAI) -> None:
    plain = await oa.chat.completions.create(model="gpt-4o", messages=user(MC))
    for schema in (LETTERS, RICH):
        answer = await oa.chat.completions.create(model="gpt-4o", messages=user(MC), response_format={
            "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
        value = validate(schema, answer.choices[0].message.content or "")
        assert value["answer"] == plain.choices[0].message.content
        assert answer.usage and answer.usage.completion_tokens == count_tokens(answer.choices[0].message.content or "")
    mode = await oa.chat.completions.create(model="gpt-4o", messages=user(FREE),
                                            response_format={"type": "json_object"})
    assert isinstance(json.loads(mode.choices[0].message.content or ""), dict)


async def test_anthropic_output_config_format(srv: SimServer, claude: anthropic.AsyncAnthropic) -> None:
    plain = await claude.messages.create(model="claude-sonnet-4-6", max_tokens=3000, messages=user(MC))
    message = await claude.messages.create(model="claude-sonnet-4-6", max_tokens=3000, messages=user(MC),
                                           output_config={"format": {"type": "json_schema", "schema": RICH}})
    assert isinstance(message.content[0], anthropic.types.TextBlock)
    assert isinstance(plain.content[0], anthropic.types.TextBlock)
    assert validate(RICH, message.content[0].text)["answer"] == plain.content[0].text


async def test_gemini_response_json_schema_and_response_schema(srv: SimServer, gemini: genai.Client) -> None:
    plain = await ask_gemini(gemini, "gemini-2.0-flash")
    structured = await ask_gemini(gemini, "gemini-2.0-flash", response_mime_type="application/json",
                                  response_json_schema=RICH)
    assert validate(RICH, structured.text or "")["answer"] == plain.text
    openapi = {"type": "OBJECT", "properties": {"n": {"type": "INTEGER"}, "answer": {
        "type": "STRING", "enum": ["A", "B", "C", "D"]}}, "required": ["answer"], "propertyOrdering": ["n", "answer"]}
    legacy = await ask_gemini(gemini, "gemini-2.0-flash", response_mime_type="application/json",
                              response_schema=openapi)
    value = validate({"type": "object", "properties": {"n": {"type": "integer"}, "answer": LETTERS["properties"][
        "answer"]}, "required": ["answer"]}, legacy.text or "")
    assert list(value) == ["n", "answer"] and value["answer"] == plain.text
    mode = await ask_gemini(gemini, "gemini-2.0-flash", FREE, response_mime_type="application/json")
    assert isinstance(json.loads(mode.text or ""), dict)
    enum = await ask_gemini(gemini, "gemini-2.0-flash", response_mime_type="text/x.enum",
                            response_schema={"type": "STRING", "format": "enum", "enum": ["A", "B", "C", "D"]})
    assert enum.text == plain.text


async def test_structured_answer_with_thinking_and_a_scripted_text_wins(tmp_path: Path, srv: SimServer,
                                                                        oa: openai.AsyncOpenAI) -> None:
    answer = await oa.chat.completions.create(model="o3", messages=user(MC), response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": LETTERS, "strict": True}})
    validate(LETTERS, answer.choices[0].message.content or "")
    assert answer.usage and answer.usage.completion_tokens_details
    assert answer.usage.completion_tokens_details.reasoning_tokens == thinking(user(MC))
    script = tmp_path / "script.yaml"
    script.write_text('responses:\n  - contains: ["fruit"]\n    response: "{not json"\n')
    srv.configure(script=str(script))
    scripted = await oa.chat.completions.create(model="gpt-4o", messages=user(MC), response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": LETTERS, "strict": True}})
    assert scripted.choices[0].message.content == "{not json"


# -- refusals ----------------------------------------------------------------------------------------------------


async def test_refusals_in_each_format_are_billed(srv: SimServer, oa: openai.AsyncOpenAI,
                                                  claude: anthropic.AsyncAnthropic, gemini: genai.Client) -> None:
    srv.configure(fault_refusal=1.0)
    chat = await oa.chat.completions.create(model="gpt-4o", messages=user(MC))
    choice = chat.choices[0]
    assert choice.message.content is None and choice.message.refusal == REFUSAL and choice.finish_reason == "stop"
    assert chat.usage and chat.usage.completion_tokens == count_tokens(REFUSAL) and chat.usage.prompt_tokens > 0
    o3 = await oa.chat.completions.create(model="o3", messages=user(MC))
    assert o3.usage and o3.usage.completion_tokens == thinking(user(MC)) + count_tokens(REFUSAL)
    message = await claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=user(MC))
    assert message.stop_reason == "refusal" and message.content == []
    assert message.stop_details and message.stop_details.type == "refusal"
    assert message.usage.output_tokens == count_tokens(REFUSAL)
    response = await ask_gemini(gemini, "gemini-2.0-flash")
    assert not response.candidates and response.prompt_feedback
    assert response.prompt_feedback.block_reason == genai_types.BlockedReason.SAFETY
    assert response.usage_metadata and response.usage_metadata.prompt_token_count
    assert srv.stats()["by_status"] == {"200": 4}


async def test_fault_refusal_picks_the_same_prompts_every_time_in_every_format(
        srv: SimServer, oa: openai.AsyncOpenAI, gemini: genai.Client) -> None:
    srv.configure(fault_refusal=0.4)
    prompts = [f"Question {i}?" for i in range(12)]
    expected = {p for p in prompts if fraction("refusal", digest(user(p))) < 0.4}
    assert 0 < len(expected) < len(prompts)
    for _ in range(2):
        chats = [await oa.chat.completions.create(model="gpt-4o", messages=user(p)) for p in prompts]
        assert {p for p, c in zip(prompts, chats, strict=True) if c.choices[0].message.refusal} == expected
    blocked = [await ask_gemini(gemini, "gemini-2.0-flash", p) for p in prompts]
    assert {p for p, r in zip(prompts, blocked, strict=True) if r.prompt_feedback} == expected


@pytest.mark.parametrize(("provider", "model"), [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-6"),
                                                 ("gemini", "gemini-2.0-flash")])
async def test_runner_sees_each_refusal_as_refused_and_billed(srv: SimServer, monkeypatch: pytest.MonkeyPatch,
                                                              provider: str, model: str) -> None:
    srv.configure(fault_refusal=1.0)
    error = await through_runner(srv, provider, model, {"max_tokens": 50}, monkeypatch)
    assert isinstance(error, Refused) and error.error_class == "refused"
    assert error.billed is not None and error.billed.input_tokens > 0
    assert error.billed.output_tokens == (0 if provider == "gemini" else count_tokens(REFUSAL))


# -- what did not change -----------------------------------------------------------------------------------------


async def test_plain_requests_are_answered_as_before(srv: SimServer, oa: openai.AsyncOpenAI,
                                                     claude: anthropic.AsyncAnthropic, gemini: genai.Client) -> None:
    chat = await oa.chat.completions.create(model="sim-a", messages=user(FREE), max_tokens=5)
    assert (chat.choices[0].message.content, chat.choices[0].finish_reason) == simulated_reply(
        "sim-a", user(FREE), max_tokens=5)
    assert chat.usage and chat.usage.completion_tokens_details
    assert chat.usage.completion_tokens_details.reasoning_tokens == 0 and chat.choices[0].message.refusal is None
    message = await claude.messages.with_raw_response.create(model="sim-a", max_tokens=5, messages=user(FREE))
    body = json.loads(message.http_response.content)
    assert body["content"] == [{"type": "text", "text": simulated_reply("sim-a", user(FREE), max_tokens=5)[0]}]
    assert set(body) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert set(body["usage"]) == {"input_tokens", "output_tokens", "cache_creation_input_tokens",
                                  "cache_read_input_tokens"}
    response = await ask_gemini(gemini, "sim-a", FREE, max_output_tokens=5)
    assert response.text == simulated_reply("sim-a", user(FREE), max_tokens=5)[0]
    usage = response.usage_metadata
    assert usage and usage.thoughts_token_count is None and usage.candidates_token_count == 5


# -- batch lines -------------------------------------------------------------------------------------------------


async def test_batch_lines_think_and_answer_in_json_as_online(srv: SimServer, oa: openai.AsyncOpenAI,
                                                              claude: anthropic.AsyncAnthropic,
                                                              gemini: genai.Client) -> None:
    body = {"model": "o3", "messages": user(MC), "max_completion_tokens": 1000, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": LETTERS, "strict": True}}}
    line = json.dumps({"custom_id": "q", "method": "POST", "url": "/v1/chat/completions", "body": body})
    upload = await oa.files.create(file=("in.jsonl", line.encode()), purpose="batch")
    batch = await oa.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    done = await oa.batches.retrieve(batch.id)
    assert done.output_file_id
    out = json.loads((await oa.files.content(done.output_file_id)).text)["response"]["body"]
    online = await oa.chat.completions.create(**body)
    assert out["choices"][0]["message"] == online.choices[0].message.model_dump(mode="json", exclude_unset=True)
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == thinking(user(MC))

    params = {"model": "claude-sonnet-4-6", "max_tokens": 3000, "messages": user(MC),
              "thinking": {"type": "enabled", "budget_tokens": 2048}}
    created = await claude.messages.batches.create(requests=[{"custom_id": "q", "params": params}])  # type: ignore
    (result,) = [r async for r in await claude.messages.batches.results(created.id)]
    assert result.result.type == "succeeded"
    online_message = await claude.messages.create(**params)  # type: ignore[arg-type]
    assert result.result.message.content == online_message.content
    assert result.result.message.usage == online_message.usage

    config = {"max_output_tokens": 1000, "thinking_config": {"thinking_budget": 500, "include_thoughts": True}}
    job = await gemini.aio.batches.create(model="gemini-2.5-flash",
                                          src=[{"contents": [{"role": "user", "parts": [{"text": MC}]}],
                                                "config": config}])
    finished = await gemini.aio.batches.get(name=job.name or "")
    assert finished.dest and finished.dest.inlined_responses
    response = finished.dest.inlined_responses[0].response
    online_response = await ask_gemini(gemini, "gemini-2.5-flash", **config)
    assert response and response.candidates and online_response.candidates
    assert response.candidates[0].content == online_response.candidates[0].content
    assert response.usage_metadata == online_response.usage_metadata
    assert response.usage_metadata and response.usage_metadata.thoughts_token_count == thinking(user(MC), budget=500)
