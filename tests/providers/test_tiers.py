"""Service tiers on the wire (runner/providers/tiers.py): each provider sends a stage's tier in its API's words,
reads back the tier that served the answer, and raises FlexUnavailable for a flex request the provider shed.

The bodies are those the official SDKs (and the lean wire) put on the wire, caught by a capture server of the test
(none of the simulated server's reading in the loop); OpenAI's are checked against the ServiceTier enum of OpenAI's
published OpenAPI document (simserver/published/openai_chat_request.json). The answers and errors come from the
simulated server, through the same SDKs.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pytest

from runner.errors import BadRequest, FlexUnavailable, RateLimited, TransientError
from runner.providers.base import Provider, ProviderSettings, provider_class
from runner.providers.openai_errors import flex_shed
from runner.providers.tiers import GEMINI_WIRE, GROQ_WIRE, OPENAI_WIRE, served, tier_problem, tiers_taken
from simserver import SimConfig, SimServer, start_server, strict
from tests.providers.test_request_shaping import GEMINI_ANSWER, OPENAI_ANSWER, Capture

pytestmark = pytest.mark.usefixtures("provider_keys")

MESSAGES = [{"role": "user", "content": "Which is a fruit? A. carrot B. apple"}]


@pytest.fixture(autouse=True)
def _more_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROQ_API_KEY", "test-key")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)


def published_tiers() -> list[str]:
    """CreateChatCompletionRequest.service_tier's values in OpenAI's published OpenAPI document."""
    extract = json.loads(files("simserver").joinpath("published", "openai_chat_request.json").read_text())
    return next(part["enum"] for part in extract["schemas"]["ServiceTier"]["anyOf"] if "enum" in part)


def settings_at(provider: str, root: str) -> ProviderSettings:
    """The provider's settings pointed at a server whose origin is ``root``, on the path its API has there."""
    base = {"openai": root + "/v1", "sim": root + "/v1", "gemini": root, "groq": root + "/groq/openai/v1",
            "azure-openai": root + "/openai"}[provider]
    extra = {"api_version": "2025-12-01"} if provider == "azure-openai" else {}
    return ProviderSettings(base_url=base, timeout=5, **extra)


async def call(instance: Provider, model: str, params: dict[str, Any]) -> Any:
    """One request: its completion, or the runner's error it raised."""
    await instance.start()
    try:
        return await instance.execute(model, MESSAGES, params)
    except (BadRequest, FlexUnavailable, RateLimited, TransientError) as exc:
        return exc
    finally:
        await instance.aclose()


#: (provider, model, tier, the field the body carries it in, its value there)
WIRE = [
    ("openai", "gpt-5-mini", "flex", "service_tier", "flex"),
    ("openai", "gpt-4o", "priority", "service_tier", "priority"),
    ("openai", "gpt-5-mini", "standard", "service_tier", "default"),
    ("sim", "gpt-sim", "flex", "service_tier", "flex"),
    ("azure-openai", "gpt-5.6-sol", "flex", "service_tier", "flex"),
    ("groq", "llama-3.1-8b-instant", "flex", "service_tier", "flex"),
    ("groq", "llama-3.1-8b-instant", "standard", "service_tier", "on_demand"),
    ("gemini", "gemini-2.5-flash", "flex", "serviceTier", "flex"),
    ("gemini", "gemini-3-flash", "priority", "serviceTier", "priority"),
]


@pytest.mark.parametrize(("provider", "model", "tier", "field", "value"), WIRE)
async def test_the_body_carries_the_tier_in_the_apis_words(provider, model, tier, field, value):
    answer = GEMINI_ANSWER if provider == "gemini" else OPENAI_ANSWER
    async with Capture(answer) as capture:
        instance = provider_class(provider)(settings_at(provider, capture.url))
        completion = await call(instance, model, {"max_tokens": 64, "service_tier": tier})
    assert not isinstance(completion, Exception), completion
    (request,) = capture.requests
    body = request["body"]
    assert body[field] == value
    if provider in ("openai", "sim", "azure-openai"):  # the published document's enum, and its whole schema
        assert value in published_tiers()
        assert strict.refusal("openai", {**body, "model": model}, model=model, headers={},
                              path="/v1/chat/completions") is None
    # the answer named no tier: none is read (the engine takes the tier it sent)
    assert completion.tier is None


async def test_without_a_tier_nothing_is_sent():
    async with Capture(OPENAI_ANSWER) as capture:
        await call(provider_class("openai")(settings_at("openai", capture.url)), "gpt-5-mini", {"max_tokens": 5})
        await call(provider_class("groq")(settings_at("groq", capture.url)), "llama-3.1-8b-instant",
                   {"max_tokens": 5})
    assert all("service_tier" not in request["body"] for request in capture.requests)


async def test_a_tier_a_provider_does_not_sell_is_not_sent():
    async with Capture(OPENAI_ANSWER) as capture:
        refused = await call(provider_class("together")(settings_at("openai", capture.url)), "m",
                             {"max_tokens": 5, "service_tier": "flex"})
        standard = await call(provider_class("together")(settings_at("openai", capture.url)), "m",
                              {"max_tokens": 5, "service_tier": "standard"})
    assert isinstance(refused, BadRequest) and "not sold at the flex tier" in str(refused)
    assert not isinstance(standard, Exception)
    assert [("service_tier" in r["body"]) for r in capture.requests] == [False]  # standard: nothing to name


@pytest.fixture
async def server():
    async with await start_server(SimConfig(priority_limit=1)) as srv:
        yield srv


#: (provider, model) sold at priority, whose answers name the tier that served them
PRIORITY = [("openai", "gpt-4o"), ("sim", "gpt-sim"), ("azure-openai", "gpt-5.4"),
            ("gemini", "gemini-2.5-flash")]


@pytest.mark.parametrize(("provider", "model"), PRIORITY)
async def test_the_tier_that_served_is_read_back_and_priority_past_its_limit_is_standard(server: SimServer,
                                                                                          provider, model):
    got = [await call(provider_class(provider)(settings_at(provider, server.root_url)), model,
                      {"max_tokens": 64, "service_tier": "priority"}) for _ in range(2)]
    assert [completion.tier for completion in got] == ["priority", "standard"]
    route = "openai" if provider == "sim" else provider
    assert server.stats()["tiers"]["served"][route] == {"priority": 1, "standard": 1}


@pytest.mark.parametrize(("provider", "model"), [("openai", "gpt-5-mini"), ("sim", "gpt-sim"),
                                                 ("azure-openai", "gpt-5.6-sol"), ("groq", "llama-3.1-8b-instant"),
                                                 ("gemini", "gemini-2.5-flash")])
async def test_a_shed_flex_request_is_its_own_error_and_a_standard_one_is_answered(server: SimServer, provider,
                                                                                   model):
    server.configure(flex_shed=1.0, flex_latency=0.05)
    shed = await call(provider_class(provider)(settings_at(provider, server.root_url)), model,
                      {"max_tokens": 64, "service_tier": "flex"})
    answered = await call(provider_class(provider)(settings_at(provider, server.root_url)), model,
                          {"max_tokens": 64, "service_tier": "standard"})
    assert isinstance(shed, FlexUnavailable), shed
    assert shed.error_class == "flex_unavailable" and not shed.retryable and not shed.possibly_billed
    assert shed.status == {"groq": 498, "gemini": 503}.get(provider, 429)
    assert answered.tier == "standard" and answered.output_tokens
    server.configure(flex_shed=0.0)
    slow = await call(provider_class(provider)(settings_at(provider, server.root_url)), model,
                      {"max_tokens": 64, "service_tier": "flex"})
    assert slow.tier == "flex"


async def test_a_rate_limit_or_an_overload_of_a_flex_request_is_not_a_shed(server: SimServer):
    server.configure(fault_429=1.0)
    limited = await call(provider_class("openai")(settings_at("openai", server.root_url)), "gpt-5-mini",
                         {"max_tokens": 64, "service_tier": "flex"})
    server.configure(fault_429=0.0, fault_503=1.0)
    overloaded = await call(provider_class("gemini")(settings_at("gemini", server.root_url)), "gemini-2.5-flash",
                            {"max_tokens": 64, "service_tier": "standard"})
    assert type(limited) is RateLimited and type(overloaded) is TransientError


async def test_the_strict_server_refuses_a_tier_the_model_is_not_sold_at(server: SimServer):
    openai = await call(provider_class("openai")(settings_at("openai", server.root_url)), "gpt-4o",
                        {"max_tokens": 64, "service_tier": "flex"})
    gemini = await call(provider_class("gemini")(settings_at("gemini", server.root_url)), "gemini-2.0-flash",
                        {"max_tokens": 64, "service_tier": "priority"})
    azure = await call(provider_class("azure-openai")(settings_at("azure-openai", server.root_url)), "gpt-4o",
                       {"max_tokens": 64, "service_tier": "flex"})
    assert isinstance(openai, BadRequest) and "Unsupported service_tier: flex" in str(openai)
    assert isinstance(gemini, BadRequest) and "not supported for models/gemini-2.0-flash" in str(gemini)
    assert isinstance(azure, BadRequest) and azure.status == 400


def test_the_error_mapping_reads_a_shed_from_its_status_and_words():
    assert flex_shed(429, {"error": {"code": "resource_unavailable", "message": "x"}})
    assert flex_shed(429, {"code": "429", "message": "Resource unavailable: no flex capacity"})
    assert flex_shed(498, {"error": {"message": "Flex tier capacity exceeded", "type": "capacity_exceeded"}})
    assert not flex_shed(429, {"error": {"code": "rate_limit_exceeded", "message": "Rate limit reached"}})
    assert not flex_shed(503, {"error": {"message": "overloaded"}})


def test_the_tiers_each_model_is_sold_at_and_the_words_read_back():
    assert tiers_taken("openai", "gpt-5-mini") == ("standard", "flex", "priority")
    assert tiers_taken("openai", "gpt-4o") == ("standard", "priority")
    assert tiers_taken("openai", "gpt-3.5-turbo") == ("standard",)
    assert tiers_taken("sim", "gpt-sim") == ("standard", "flex", "priority")  # a dry run of any model
    assert tiers_taken("sim", "gpt-4o") == ("standard", "priority")
    assert tiers_taken("gemini", "gemini-2.0-flash") == ("standard",)
    assert tiers_taken("groq", "llama-3.1-8b-instant") == ("standard", "flex")
    assert tiers_taken("anthropic", "claude-haiku-4-5") == ("standard",)
    assert tier_problem("azure-openai", "gpt-5.6-sol", "flex", api_version="2024-10-21") is not None
    assert tier_problem("azure-openai", "gpt-5.6-sol", "flex", api_version="2025-12-01") is None
    assert tier_problem("azure-openai", "gpt-5.6-sol", "flex", api_version="v1") is None
    assert [served(v, OPENAI_WIRE) for v in ("default", "flex", "priority", "scale", None)] == [
        "standard", "flex", "priority", None, None]
    assert served("on_demand", GROQ_WIRE) == "standard" and served("standard", GEMINI_WIRE) == "standard"
