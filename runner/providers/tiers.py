"""Service tiers: the runner's names for them, which a model takes (the capability table's ``TIER_RULES``), and
each API's words for them, sent and read back.

    standard   what a request gets when it asks for nothing
    flex       cheaper (OpenAI, Azure and Gemini: half the standard price; Groq: the same price at higher rate
               limits), slower, best effort: shed when capacity runs short (OpenAI and Azure a 429 "resource
               unavailable", Groq a 498 ``capacity_exceeded``, Gemini a 503), which the providers raise as
               ``FlexUnavailable`` (runner/errors.py) for the engine to retry at flex or fall back
    priority   dearer and faster; past the account's priority limit served at standard (Gemini says so in the
               ``x-gemini-service-tier`` header, OpenAI in the answer's ``service_tier``) and billed as served

A stage's ``tier:`` reaches a provider as the parameter ``service_tier`` (one of :data:`TIERS`) that the engine
adds to a request's parameters when it sends it (runner/engine/online.py), beside what its cache key holds: a tier
changes what an answer costs, not the answer (Azure's flex page: "Flex uses the same underlying model as
Standard"), so every tier of one request shares the memo. Each provider writes it in its API's words
(:data:`OPENAI_WIRE`, :data:`GROQ_WIRE`, :data:`GEMINI_WIRE`) and reads the tier that served the answer back
(:func:`served`) into ``Completion.tier``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .capability_table import AZURE_TIER_VERSION, TIER_RULES, TierRule

__all__ = ["FLEX", "GEMINI_TIER_HEADER", "GEMINI_WIRE", "GROQ_WIRE", "OPENAI_WIRE", "PRIORITY", "STANDARD", "TIERS",
           "served", "tier_problem", "tier_rule", "tiers_taken"]

STANDARD, FLEX, PRIORITY = "standard", "flex", "priority"
TIERS = (STANDARD, FLEX, PRIORITY)

#: Chat Completions' ``service_tier`` (OpenAI, Azure OpenAI, the simulated server): CreateChatCompletionRequest's
#: enum in OpenAI's OpenAPI document (simserver/published/openai_chat_request.json: auto, default, flex, scale,
#: priority, fast); "default" is the standard tier (Azure's flex page: "set request-level service_tier to
#: default"). The answer's ``service_tier`` names the tier that processed it (the same page: "check the
#: service_tier field in a successful response").
OPENAI_WIRE = {STANDARD: "default", FLEX: "flex", PRIORITY: "priority"}
#: Groq's ``service_tier`` (console.groq.com/docs/service-tiers): on_demand (the default when omitted), flex
GROQ_WIRE = {STANDARD: "on_demand", FLEX: "flex"}
#: Gemini's GenerateContentRequest ``serviceTier`` as google-genai 3.6.1 writes it (``types.ServiceTier``: standard,
#: flex, priority; ai.google.dev/gemini-api/docs/priority-inference: "set the service_tier field in the request
#: body to priority. The default tier is standard if the field is omitted")
GEMINI_WIRE = {STANDARD: "standard", FLEX: "flex", PRIORITY: "priority"}
#: the response header naming the tier that served a Gemini request (the priority page and the cookbook's
#: Inference_tiers notebook: ``response.sdk_http_response.headers.get("x-gemini-service-tier")``)
GEMINI_TIER_HEADER = "x-gemini-service-tier"


def served(value: object, wire: Mapping[str, str]) -> str | None:
    """The runner's name of the tier an API's ``value`` names (its wire words ``wire``, read back), or None when it
    names none of them (absent; OpenAI's "auto", "scale" or "fast", which the runner never asks for): the answer is
    then charged at the tier it was sent at."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    return next((ours for ours, theirs in wire.items() if text == theirs), None)


def tier_rule(provider: str, model: str) -> TierRule | None:
    """The capability table's tier rule of ``provider:model`` (the model behind an Azure deployment), None when the
    provider has none. ``sim:`` reads OpenAI's rules under the model's own name, without their last, catch-all
    rule: the simulated server dry-runs any model, so a name OpenAI's rules do not know takes every tier."""
    table = "openai" if provider == "sim" else provider
    for rule in TIER_RULES:
        if rule.provider == table and (provider != "sim" or rule.pattern) and re.match(rule.pattern, model):
            return rule
    return None


def tiers_taken(provider: str, model: str) -> tuple[str, ...]:
    """The tiers ``provider:model`` takes, standard first (every provider's models take standard: it is what a
    request gets without asking)."""
    rule = tier_rule(provider, model)
    if rule is None:
        return TIERS if provider == "sim" else (STANDARD,)
    return (STANDARD, *rule.tiers)


def tier_problem(provider: str, model: str, tier: str, *, api_version: str | None = None,
                 label: str | None = None) -> str | None:
    """Why ``provider:model`` cannot be sent at ``tier``, in one sentence naming the fix, or None when it can.
    ``label`` names the model as the job does; ``api_version`` is Azure's (a dated version before
    ``AZURE_TIER_VERSION`` takes no ``service_tier``)."""
    if tier == STANDARD:
        return None
    name = label or f"{provider}:{model}"
    taken = tiers_taken(provider, model)
    if tier not in taken:
        others = [t for t in taken if t != STANDARD]
        rule = tier_rule(provider, model)
        said = f" (per the {rule.source.split(' (')[0]})" if rule is not None else ""
        offer = f"choose {' or '.join(others)}, or " if others else ""
        return (f"{name} is not sold at the {tier} tier{said}: {offer}remove tier: (or set it to standard) for "
                "this model")
    if provider == "azure-openai" and api_version and api_version[:1].isdigit() and api_version < AZURE_TIER_VERSION:
        return (f"{name} takes service tiers from Azure OpenAI API version {AZURE_TIER_VERSION} on, not "
                f"{api_version}: set providers: azure-openai: api_version: (or OPENAI_API_VERSION) to "
                f"{AZURE_TIER_VERSION} or later")
    return None
