"""Strict mode: refuse what the real APIs refuse, with their status and error body (``SimConfig.strict``).

:func:`refusal` is called on every body the format module has parsed (online, and on every batch line). It
returns None for a body the real API takes, or a :class:`~simserver.refusals.Refusal` (status 400, message, and for
OpenAI the ``param`` and ``code``) that :func:`render` turns into the format's own error body.

Each API's rules, and where each comes from (never from this project's own idea of the API), are in a module of
their own: :mod:`simserver.strict_openai` (OpenAI's published OpenAPI document), :mod:`simserver.strict_anthropic`
(the anthropic SDK's request types and the ``anthropic-version`` header) and :mod:`simserver.strict_gemini` (the
published protos); the rules per model are this server's own, :mod:`simserver.model_rules` (written from the
providers' documents, SDK types and model pages, each with its source; not the runner's capability table, so that a
wrong entry there is refused here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from . import strict_anthropic, strict_gemini, strict_openai
from .openai import OpenAIFormat
from .refusals import Refusal
from .wire import WireFormat

__all__ = ["RULES", "Refusal", "refusal", "render"]

#: the rules of the formats the modules of the clouds add (their wire name -> ``rule(body, model, headers, path)``)
RULES: dict[str, Callable[[dict[str, Any], str, Mapping[str, str], str], Refusal | None]] = {}


def render(fmt: WireFormat, refused: Refusal, headers: dict[str, str]) -> web.Response:
    """The format's error response for a refusal (OpenAI's carries ``param`` and ``code``)."""
    if isinstance(fmt, OpenAIFormat):  # Azure's deployments speak it too
        return OpenAIFormat.error(refused.status, refused.message, "invalid_request_error", refused.code, headers,
                                  refused.param)
    return fmt.bad_request(refused.message, refused.param, headers)


def refusal(wire: str, body: Any, *, model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """The refusal the real API gives this body, or None when it takes it. ``wire`` is the format's name,
    ``headers`` the request's (Anthropic reads ``anthropic-version``), ``path`` the URL path (OpenAI: only
    ``/v1/chat/completions`` is checked; Gemini: ``/v1/`` or ``/v1beta/``)."""
    if not isinstance(body, dict):
        return None  # the format module has answered it already
    if wire == "openai":
        return strict_openai.refusal(body, model, path) if path.endswith("/chat/completions") else None
    if wire == "anthropic":
        return strict_anthropic.refusal(body, model, headers)
    if wire == "gemini":
        return strict_gemini.refusal(body, model, "v1" if path.startswith("/v1/") else "v1beta")
    rule = RULES.get(wire)
    return rule(body, model, headers, path) if rule is not None else None
