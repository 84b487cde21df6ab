"""``params.presence_penalty`` and ``params.frequency_penalty``: their range, their place in the cache key, their
shape on each provider's wire (OpenAI's and Gemini's own fields, llama-cpp-python's arguments), the models that
refuse them (Anthropic, OpenAI's reasoning models, Gemini 2.5 and later) and the strict simulated server (which
checks bodies against OpenAI's and Google's published definitions) taking what is sent, online and in batches."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from runner.errors import JobFileError
from runner.plan.stage import StagePlan
from runner.providers.base import ProviderSettings, provider_class
from runner.providers.batching import ENDED, BatchLine
from runner.providers.capabilities import shape
from runner.providers.gemini import GeminiProvider
from runner.providers.local import LocalProvider
from runner.spec.job import load_job
from runner.spec.settings import Params
from simserver import SimServer
from tests.helpers import write_job, write_rows
from tests.providers.test_request_shaping import GEMINI_ANSWER, MESSAGES, OPENAI_ANSWER, Capture

pytestmark = pytest.mark.usefixtures("provider_keys")
#: the async tests run in the module's loop, the one the shared simulated server (``srv``) lives in
in_module_loop = pytest.mark.asyncio(loop_scope="module")

PENALTIES = {"presence_penalty": 0.8, "frequency_penalty": -0.5}


# -- the job file and the cache key -------------------------------------------------------------------------------


def test_penalties_take_openais_range_and_a_job_file_error_names_the_setting(tmp_path: Path) -> None:
    assert Params(presence_penalty=-2, frequency_penalty=2).model_dump(exclude_none=True) == {
        "presence_penalty": -2.0, "frequency_penalty": 2.0}
    dataset = write_rows(tmp_path / "d.jsonl", 1)
    path = write_job(tmp_path / "j.yaml", dataset, models=["sim:m"])
    path.write_text(path.read_text().replace("params: {temperature: 0, max_tokens: 5}",
                                             "params: {temperature: 0, max_tokens: 5, presence_penalty: 2.5}"))
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    message = str(caught.value)
    assert "j.yaml:3" in message and "presence_penalty" in message and "2" in message
    assert len(message.splitlines()) == 1


def plan_keys(tmp_path: Path, name: str, params: str, model: str = "sim:m") -> list[str]:
    dataset = write_rows(tmp_path / "d.jsonl", 3)
    path = write_job(tmp_path / name, dataset, models=[model])
    path.write_text(path.read_text().replace("params: {temperature: 0, max_tokens: 5}", f"params: {params}"))
    job = load_job(path)
    return [request.key for request in StagePlan(job, job.stages[0])]


def test_each_penalty_is_in_the_cache_key(tmp_path: Path) -> None:
    plain = plan_keys(tmp_path, "a.yaml", "{temperature: 0.8}")
    presence = plan_keys(tmp_path, "b.yaml", "{temperature: 0.8, presence_penalty: 0.8}")
    other = plan_keys(tmp_path, "c.yaml", "{temperature: 0.8, presence_penalty: 0.5}")
    frequency = plan_keys(tmp_path, "d.yaml", "{temperature: 0.8, frequency_penalty: 0.8}")
    both = plan_keys(tmp_path, "e.yaml", "{temperature: 0.8, presence_penalty: 0.8, frequency_penalty: 0.8}")
    assert len(plain) == 3
    groups = [set(plain), set(presence), set(other), set(frequency), set(both)]
    assert len(set().union(*groups)) == 5 * 3  # no two settings share a key
    # the same penalty written as an integer or a float is the same request
    assert plan_keys(tmp_path, "f.yaml", "{temperature: 0.8, presence_penalty: 1}") == \
        plan_keys(tmp_path, "g.yaml", "{temperature: 0.8, presence_penalty: 1.0}")


# -- which models take them -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("provider", "model"), [
    ("openai", "gpt-4o"), ("openai", "gpt-4-0613"), ("openai", "gpt-5-chat-latest"), ("gemini", "gemini-2.0-flash"),
    ("gemini", "gemini-1.5-pro"), ("local", "smollm2"), ("sim", "any"), ("openai-compatible", "vllm/x")])
def test_models_that_take_penalties_keep_them(provider: str, model: str) -> None:
    shaped = shape(provider, model, {"temperature": 0.8, **PENALTIES})
    assert shaped.problems == [] and shaped.dropped == []
    assert {k: shaped.params[k] for k in PENALTIES} == PENALTIES


@pytest.mark.parametrize(("provider", "model"), [
    ("anthropic", "claude-3-5-haiku-20241022"), ("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-opus-4-7"),
    ("openai", "o3"), ("openai", "o4-mini"), ("openai", "gpt-5"), ("openai", "gpt-5.2"), ("openai", "gpt-5.5"),
    ("gemini", "gemini-2.5-flash"), ("gemini", "gemini-2.5-pro"), ("gemini", "gemini-3-pro-preview")])
def test_models_without_penalties_refuse_them_or_drop_them_and_say_so(provider: str, model: str) -> None:
    refused = shape(provider, model, dict(PENALTIES))
    assert refused.problems == [
        f"{provider}:{model} takes no {name}: remove params.{name}, or set drop_unsupported: true to leave it out"
        for name in PENALTIES]
    dropped = shape(provider, model, dict(PENALTIES), drop_unsupported=True)
    assert dropped.problems == [] and not set(PENALTIES) & set(dropped.params)
    assert dropped.dropped == [f"{name} (takes no {name})" for name in PENALTIES]


def test_an_anthropic_job_with_a_penalty_is_refused_and_drop_unsupported_records_it(tmp_path: Path) -> None:
    dataset = write_rows(tmp_path / "d.jsonl", 1)
    path = write_job(tmp_path / "j.yaml", dataset, models=["anthropic:claude-3-5-haiku-20241022", "openai:gpt-4o"])
    path.write_text(path.read_text().replace("params: {temperature: 0, max_tokens: 5}",
                                             "params: {temperature: 0.8, max_tokens: 5, presence_penalty: 0.8}"))
    with pytest.raises(JobFileError, match="anthropic:claude-3-5-haiku-20241022 takes no presence_penalty: remove "
                                           "params.presence_penalty, or set drop_unsupported: true"):
        load_job(path)
    path.write_text(path.read_text() + "drop_unsupported: true\n")
    job = load_job(path)
    stage = job.stages[0]
    assert job.sent_with["dropped"][stage.name] == {
        "anthropic:claude-3-5-haiku-20241022": ["presence_penalty (takes no presence_penalty)"]}
    assert "presence_penalty" not in job.model_params(stage, "anthropic:claude-3-5-haiku-20241022")
    assert job.model_params(stage, "openai:gpt-4o")["presence_penalty"] == 0.8


# -- on the wire ------------------------------------------------------------------------------------------------------


async def sent(provider: str, model: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The body the provider's SDK puts on the wire for one request with both penalties (a capture server)."""
    shaped = shape(provider, model, {"temperature": 0.8, "max_tokens": 8, **PENALTIES})
    async with Capture(answer) as capture:
        base = capture.url + ("/v1" if provider in ("openai", "sim") else "")
        instance = provider_class(provider)(ProviderSettings(base_url=base, timeout=5))
        await instance.start()
        try:
            await instance.execute(model, MESSAGES, shaped.params)
        finally:
            await instance.aclose()
    (request,) = capture.requests
    return request["body"]


@in_module_loop
async def test_openai_sends_its_own_penalty_fields() -> None:
    body = await sent("openai", "gpt-4o", OPENAI_ANSWER)
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.8, -0.5)


@in_module_loop
async def test_gemini_sends_them_in_the_generation_config() -> None:
    body = await sent("gemini", "gemini-2.0-flash", {**GEMINI_ANSWER})
    config = body["generationConfig"]
    spelled = {key.replace("_", "").lower(): value for key, value in config.items()}  # proto3 JSON: either case
    assert (spelled["presencepenalty"], spelled["frequencypenalty"]) == (0.8, -0.5)


@in_module_loop
async def test_the_strict_server_takes_what_each_api_is_sent(srv: SimServer) -> None:
    """OpenAI's body is checked against CreateChatCompletionRequest (penalties -2 to 2), Gemini's against the
    published GenerationConfig fields: both answered, not refused."""
    for provider, model in (("openai", "gpt-4o"), ("sim", "sim-model"), ("gemini", "gemini-2.0-flash")):
        shaped = shape(provider, model, {"temperature": 0.8, "max_tokens": 8, **PENALTIES})
        base = srv.url if provider in ("openai", "sim") else srv.root_url
        instance = provider_class(provider)(ProviderSettings(base_url=base, timeout=5))
        await instance.start()
        try:
            completion = await instance.execute(model, MESSAGES, shaped.params)
        finally:
            await instance.aclose()
        assert completion.text, (provider, completion)
    # the server does check the penalties: one outside the published range is refused
    client = openai.AsyncOpenAI(base_url=srv.url, api_key="k", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError, match="presence_penalty"):
            await client.chat.completions.create(model="gpt-4o", messages=MESSAGES,  # type: ignore[arg-type]
                                                 presence_penalty=2.5)
    finally:
        await client.close()


@pytest.mark.parametrize("provider", ["openai", "gemini"])
@in_module_loop
async def test_batch_lines_carry_the_penalties_and_the_strict_server_takes_them(srv: SimServer,
                                                                                provider: str) -> None:
    model = {"openai": "gpt-4o", "gemini": "gemini-2.0-flash"}[provider]
    params = shape(provider, model, {"temperature": 0.8, "max_tokens": 8, **PENALTIES}).params
    base = srv.url if provider == "openai" else srv.root_url
    instance = provider_class(provider)(ProviderSettings(base_url=base, timeout=5))
    await instance.start()
    try:
        batches = instance.batches()
        batch_id = await batches.submit(model, [BatchLine("line-0", MESSAGES, params)], label="run/stage")
        deadline = time.monotonic() + 5
        while (status := await batches.status(batch_id)).state != ENDED and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (status.state, status.succeeded, status.failed) == (ENDED, 1, 0)
        (result,) = await batches.results(batch_id)
        assert result.error is None and result.completion is not None and result.completion.text
    finally:
        await instance.aclose()
    body = srv.batches.batches[batch_id.removeprefix("batches/")].lines[0].body
    if provider == "openai":
        assert (body["presence_penalty"], body["frequency_penalty"]) == (0.8, -0.5)
    else:
        assert (body["generationConfig"]["presencePenalty"], body["generationConfig"]["frequencyPenalty"]) == \
            (0.8, -0.5)


def test_gemini_request_of_names_the_sdks_fields() -> None:
    _, config = GeminiProvider.request_of(MESSAGES, {"temperature": 0.8, **PENALTIES}, "gemini-2.0-flash")
    assert (config.presence_penalty, config.frequency_penalty) == (0.8, -0.5)
    _, plain = GeminiProvider.request_of(MESSAGES, {"temperature": 0.8}, "gemini-2.0-flash")
    assert plain.presence_penalty is None and plain.frequency_penalty is None


class RecordingLlama:
    """Stands in for llama_cpp.Llama: records create_chat_completion's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def reset(self) -> None:
        pass

    def create_chat_completion(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"choices": [{"message": {"content": "A"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


def test_the_embedded_model_is_given_the_penalties() -> None:
    import inspect

    from llama_cpp import Llama

    accepted = inspect.signature(Llama.create_chat_completion).parameters
    assert {"presence_penalty", "frequency_penalty"} <= set(accepted)
    provider = LocalProvider(ProviderSettings())
    recording = RecordingLlama()
    provider.model = lambda name: recording  # type: ignore[method-assign]  # the loaded model, stood in for
    provider._generate("smollm2", MESSAGES, {"temperature": 0.8, **PENALTIES})
    provider._generate("smollm2", MESSAGES, {"temperature": 0.8})
    first, second = recording.calls
    assert (first["presence_penalty"], first["frequency_penalty"]) == (0.8, -0.5)
    assert (second["presence_penalty"], second["frequency_penalty"]) == (0.0, 0.0)  # llama.cpp's own defaults
    assert all(accepted[name].default == 0.0 for name in PENALTIES)
    assert json.dumps(first["messages"]) == json.dumps(MESSAGES)
