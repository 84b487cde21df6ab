"""Service tiers as the simulated server sells them: a request names one in its API's words (Chat Completions'
``service_tier`` on the OpenAI and Azure routes, Groq's on ``/groq/openai/v1/chat/completions``, Gemini's
``serviceTier``), and :class:`TierDesk` decides what becomes of it:

    strict mode   a tier the model is not sold at is refused with a 400, by the capability table's tier rules
                  (runner/providers/capability_table.py ``TIER_RULES``, each with its source): OpenAI's for the
                  OpenAI route (a name they do not know takes every tier, as ``sim:`` does), Azure's for the model
                  behind a deployment and an API version before 2025-12-01, Gemini's, Groq's.
    ``flex_shed``      the fraction of flex requests shed, drawn (only while it is above 0) after the rate limits:
                  OpenAI a 429 whose code is ``resource_unavailable`` (OpenAI's flex guide names the error "429
                  Resource Unavailable"; its code is not published, so this one is the server's own), Azure a 429
                  saying "Resource unavailable" in Azure's error body, Groq its 498 ``capacity_exceeded``
                  (console.groq.com/docs/flex-processing), Gemini a 503 UNAVAILABLE (the cookbook's
                  Inference_tiers notebook: "Flex is sheddable and fails with 503 errors"). Not billed.
    ``flex_latency``   seconds a flex answer takes beyond ``latency``.
    ``priority_limit`` priority requests per model served at priority since the last reset; the rest are served
                  at standard, as past an account's priority limit (Gemini's priority page: "automatically
                  downgraded to the Standard tier").

The answer names the tier that served it: the OpenAI, Azure and Groq routes in the body's ``service_tier``
(default, flex, priority; Groq on_demand, flex), Gemini in the ``x-gemini-service-tier`` header. ``/sim/stats``
counts, once a tier was asked, each route's tiers asked and served and the requests shed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runner.providers.capability_table import AZURE_TIER_VERSION
from runner.providers.tiers import (
    FLEX,
    GEMINI_TIER_HEADER,
    GEMINI_WIRE,
    GROQ_WIRE,
    OPENAI_WIRE,
    PRIORITY,
    STANDARD,
    served,
    tiers_taken,
)

from . import strict, strict_openai
from .openai import OpenAIFormat
from .refusals import Refusal
from .wire import Ask, WireFormat, response

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["GROQ", "GroqFormat", "TierDesk", "add_routes"]

#: each route's field and words for the tier (runner/providers/tiers.py gives their sources)
_FIELDS: dict[str, tuple[str, Mapping[str, str]]] = {
    "openai": ("service_tier", OPENAI_WIRE), "azure-openai": ("service_tier", OPENAI_WIRE),
    "groq": ("service_tier", GROQ_WIRE), "gemini": ("serviceTier", GEMINI_WIRE)}
#: whose tier rules each route's models are read under: the OpenAI route serves ``openai:`` and ``sim:`` alike
_RULES_OF = {"openai": "sim", "azure-openai": "azure-openai", "groq": "groq", "gemini": "gemini"}
#: Groq's service_tier values (console.groq.com/docs/service-tiers: performance, on_demand, flex, auto)
GROQ_TIERS = ("performance", "on_demand", "flex", "auto")


class GroqFormat(OpenAIFormat):
    """Groq's OpenAI-compatible Chat Completions (``/openai/v1`` on api.groq.com, here under ``/groq``)."""

    name = "groq"


GROQ = GroqFormat()


class TierDesk:
    """One server's tiers: what each request asked, its refusal or shedding, and the tier that serves it."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.clear()

    def clear(self) -> None:
        #: priority requests served at priority, per model, since the last reset
        self.priority_served: dict[str, int] = {}
        self.counts: dict[str, Any] = {"asked": {}, "served": {}, "shed": {}}

    def stats(self) -> dict[str, Any] | None:
        return self.counts if self.counts["asked"] else None

    def asked(self, fmt: WireFormat, body: Any) -> str | None:
        """The tier a request body names (the runner's name for it), None when it names none the server sells."""
        field = _FIELDS.get(fmt.name)
        if field is None or not isinstance(body, dict):
            return None
        value = body.get(field[0], body.get("service_tier"))
        if isinstance(value, str):  # the proto's enum names, SERVICE_TIER_FLEX, beside google-genai's flex
            value = value.lower().removeprefix("service_tier_")
        tier = served(value, field[1])
        if tier is not None:
            self._count("asked", fmt.name, tier)
        return tier

    def turn_away(self, fmt: WireFormat, ask: Ask, request: web.Request, headers: dict[str, str],
                  rng: random.Random) -> web.Response | None:
        """Strict mode's refusal of a tier the model is not sold at, or the shedding of a flex request; None: it is
        served, at ``ask.tier`` from now on (priority past ``priority_limit`` at standard)."""
        cfg, tier = self.server.config, ask.tier
        if tier is None:
            return None
        if cfg.strict and (refused := self._refusal(fmt.name, ask.model, tier, request)) is not None:
            return strict.render(fmt, refused, headers)
        if tier == FLEX and cfg.flex_shed and rng.random() < cfg.flex_shed:
            self._count("shed", fmt.name)
            return _shed(fmt, headers)
        if tier == PRIORITY and cfg.priority_limit is not None:
            used = self.priority_served.get(ask.model, 0)
            if used >= cfg.priority_limit:
                ask.tier = STANDARD
            else:
                self.priority_served[ask.model] = used + 1
        return None

    def delay(self, tier: str | None) -> float:
        return self.server.config.flex_latency if tier == FLEX else 0.0

    def stamp(self, fmt: WireFormat, answer: dict[str, Any], headers: dict[str, str], tier: str | None) -> None:
        """The answer names the tier that served it, in its API's way (nothing when it asked none)."""
        if tier is None:
            return
        self._count("served", fmt.name, tier)
        if fmt.name == "gemini":
            headers[GEMINI_TIER_HEADER] = GEMINI_WIRE[tier]
        else:
            answer["service_tier"] = _FIELDS[fmt.name][1].get(tier, tier)

    def _count(self, kind: str, route: str, tier: str | None = None) -> None:
        if tier is None:
            self.counts[kind][route] = self.counts[kind].get(route, 0) + 1
        else:
            by = self.counts[kind].setdefault(route, {})
            by[tier] = by.get(tier, 0) + 1

    @staticmethod
    def _refusal(route: str, model: str, tier: str, request: web.Request) -> Refusal | None:
        version = request.query.get("api-version", "")
        if route == "azure-openai" and tier != STANDARD and version[:1].isdigit() and version < AZURE_TIER_VERSION:
            return Refusal("Unrecognized request argument supplied: service_tier", "service_tier")
        if tier in tiers_taken(_RULES_OF.get(route, route), model):
            return None
        if route == "gemini":  # the API's wording is not published: the server's own
            return Refusal(f"Service tier {tier} is not supported for models/{model}.")
        # OpenAI's answer, as seen in openai/codex#15099: 400 invalid_request_error "Unsupported service_tier: flex";
        # Azure's flex page: an unsupported model "returns an HTTP 400 invalid_request_error"
        return Refusal(f"Unsupported service_tier: {tier if route != 'azure-openai' else OPENAI_WIRE[tier]}",
                       "service_tier", "unsupported_value")


def _shed(fmt: WireFormat, headers: dict[str, str]) -> web.Response:
    if fmt.name == "gemini":
        return fmt.overloaded(headers)
    if fmt.name == "groq":
        return OpenAIFormat.error(498, "Flex tier capacity exceeded. This request was made with the flex service "
                                  "tier, and there is no capacity available for it now. Please try again later.",
                                  "capacity_exceeded", "capacity_exceeded", headers)
    message = ("Resource unavailable: there is no flex capacity for this request now. Retry later, or send it with "
               "service_tier default.")
    if fmt.name == "azure-openai":
        return response(429, {"error": {"code": "429", "message": message}}, headers)
    return OpenAIFormat.error(429, message, "resource_unavailable", "resource_unavailable", headers)


def _groq_rule(body: dict[str, Any], model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """Groq speaks Chat Completions with its own service tiers: OpenAI's rules for the rest of the body."""
    tier = body.get("service_tier")
    if tier is not None and tier not in GROQ_TIERS:
        return Refusal(f"service_tier: value must be one of {', '.join(GROQ_TIERS)}", "service_tier")
    rest = {key: value for key, value in body.items() if key != "service_tier"}
    return strict_openai.refusal(rest, model, "/v1/chat/completions")


strict.RULES[GROQ.name] = _groq_rule


def add_routes(server: SimServer, app: web.Application) -> None:
    """Groq's Chat Completions route (the server's other routes read tiers in :meth:`SimServer._serve_one`)."""

    async def groq(request: web.Request) -> web.Response:
        return await server.answer(request, GROQ)

    app.router.add_post("/groq/openai/v1/chat/completions", groq)
