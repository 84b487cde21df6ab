"""The providers' token-counting endpoints as the simulated server speaks them. Each counts a prompt by the rule the
server bills prompt tokens with (``count_prompt_tokens`` of runner/providers/sim_tokens.py) over the messages its
format's model route reads from the same body, so a prompt's count equals what a later request of it is billed:

    ``POST /v1/messages/count_tokens``
        Anthropic: the Messages body without ``max_tokens`` (the fields of the anthropic SDK's
        ``MessageCountTokensParams``), key as on ``/v1/messages``; answers ``{"input_tokens": N}``.
    ``POST /v1beta/models/{model}:countTokens`` (also under ``/v1/``)
        Gemini: ``{"contents": [...]}`` or ``{"generateContentRequest": {...}}`` (which carries the system
        instruction); answers ``{"totalTokens": N, "promptTokensDetails": [...]}``.
    ``POST /v1/projects/{p}/locations/{l}/publishers/google/models/{model}:countTokens``
        Gemini on Vertex: ``contents``, ``systemInstruction``, ``generationConfig``; the same answer.
    ``POST /v1/projects/{p}/locations/{l}/publishers/anthropic/models/count-tokens:rawPredict``
        Claude on Vertex: the Messages count body with ``model`` and ``anthropic_version: vertex-2023-10-16`` in
        it; answers as Anthropic does.
    ``POST /model/{modelId}/count-tokens``
        Bedrock's CountTokens: ``{"input": {"invokeModel": {"body": BASE64}}}`` (a Claude InvokeModel body) or
        ``{"input": {"converse": {"messages", "system"}}}``; answers ``{"inputTokens": N}``.

Count requests are not model requests: not in ``received``, no fault dice, no rate-limit buckets, never billed.
/sim/stats counts them under ``count_tokens`` (``received``: every count request, answered or not; ``by_digest``:
each prompt's counts answered, by the digest ``completed_by_digest`` uses; ``peak_in_flight``: the most answered at
once), once there is one. ``SimConfig.count_latency`` makes each answer take that long. Strict mode checks
each body against the same published definitions as the model routes (:mod:`simserver.strict_anthropic`,
:mod:`simserver.strict_gemini`, :mod:`simserver.bedrock_strict`). ``SimConfig.count_tokens`` off answers every
count request with its format's 500: a counting endpoint that fails, whose client must fall back on something else.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runner.providers.bedrock_ids import claude_name

from . import bedrock_strict, strict_anthropic, strict_gemini
from .answers import count_prompt_tokens, message_digest
from .anthropic import ANTHROPIC, _parse_anthropic
from .bedrock import INVOKE, _read_converse
from .gemini import GEMINI, gemini_messages
from .refusals import Refusal
from .vertex import VERTEX_CLAUDE, VERTEX_GEMINI, VERTEX_VERSION
from .wire import Invalid, WireFormat, key_refused, response

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["Counted", "add_routes"]

_VERTEX = "/v1/projects/{project}/locations/{location}/publishers"


class Counted:
    """The count requests answered since the last reset."""

    def __init__(self) -> None:
        self.received = 0
        self.by_digest: Counter[str] = Counter()
        #: count requests being answered now, and the most at once since the last reset
        self.in_flight = 0
        self.peak = 0

    def clear(self) -> None:
        self.received = 0
        self.by_digest.clear()
        self.peak = self.in_flight

    def stats(self) -> dict[str, Any] | None:
        return {"received": self.received, "by_digest": dict(self.by_digest),
                "peak_in_flight": self.peak} if self.received else None


#: what a count route reads from a body (given the request and whether strict mode is on): its messages as the
#: server's OpenAI-style list; raises Invalid, or _Refused in strict mode
Reader = Callable[[dict[str, Any], web.Request, bool], list[dict[str, Any]]]


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _checked(refusal: Refusal | None, strict: bool) -> None:
    if strict and refusal is not None:
        raise _Refused(refusal)


def _messages_body(body: dict[str, Any], request: web.Request, strict: bool) -> list[dict[str, Any]]:
    _checked(strict_anthropic.count_refusal(body, request.headers), strict)
    return _parse_anthropic({**body, "max_tokens": 1}, request).messages


def _vertex_claude_body(body: dict[str, Any], request: web.Request, strict: bool) -> list[dict[str, Any]]:
    version = body.get("anthropic_version")
    if strict and version != VERTEX_VERSION:
        raise _Refused(Refusal(f"anthropic_version: Input should be '{VERTEX_VERSION}'" if version is not None
                               else "anthropic_version: Field required"))
    rest = {key: value for key, value in body.items() if key != "anthropic_version"}
    _checked(strict_anthropic.count_refusal(rest, None), strict)
    return _parse_anthropic({**rest, "max_tokens": 1}, request).messages


def _gemini_body(body: dict[str, Any], request: web.Request, strict: bool) -> list[dict[str, Any]]:
    _checked(strict_gemini.count_refusal(body), strict)
    inner = body.get("generateContentRequest")
    inner = inner if isinstance(inner, dict) else {"contents": body.get("contents")}
    if not inner.get("contents"):
        raise Invalid("* CountTokensRequest.contents: contents is not specified\n")
    return gemini_messages(inner, "CountTokensRequest")


def _vertex_gemini_body(body: dict[str, Any], request: web.Request, strict: bool) -> list[dict[str, Any]]:
    _checked(strict_gemini.count_refusal(body, "GenerateContentRequest"), strict)
    if not body.get("contents"):
        raise Invalid("* CountTokensRequest.contents: contents is not specified\n")
    return gemini_messages(body, "CountTokensRequest")


def _bedrock_body(body: dict[str, Any], request: web.Request, strict: bool) -> list[dict[str, Any]]:
    _checked(bedrock_strict.count_refusal(body), strict)
    given = body.get("input") if isinstance(body.get("input"), dict) else {}
    model = request.match_info["modelId"]
    if "invokeModel" in given:
        try:
            invoked = json.loads(base64.b64decode(given["invokeModel"]["body"], validate=True))
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise Invalid("Malformed input request: input.invokeModel.body is not a JSON body") from None
        if not isinstance(invoked, dict):
            raise Invalid("Malformed input request: input.invokeModel.body is not a JSON object")
        _checked(bedrock_strict.invoke_refusal(invoked, model, {}, request.path), strict)
        named = {key: value for key, value in invoked.items() if key not in ("anthropic_version", "anthropic_beta")}
        return _parse_anthropic({**named, "model": claude_name(model) or model}, request).messages
    if "converse" in given:
        return _read_converse(given["converse"], request).messages
    raise Invalid("Malformed input request: input must have invokeModel or converse")


def _count(server: SimServer, fmt: WireFormat, read: Reader, answer: Callable[[int], dict[str, Any]]
           ) -> Callable[[web.Request], Any]:
    """A count route's handler: the format's key check, the body read and counted, the count answered."""

    async def handle(request: web.Request) -> web.Response:
        server.counted.received += 1
        cfg, headers = server.config, fmt.new_headers()
        if (refused := key_refused(cfg, fmt, request, headers)) is not None:
            return refused
        if not cfg.count_tokens:
            return fmt.server_error(headers)
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise Invalid("The request body must be a JSON object.")
            messages = read(body, request, cfg.strict)
        except ValueError:
            return fmt.bad_request("We could not parse the JSON body of your request.", None, headers)
        except Invalid as exc:
            return fmt.bad_request(exc.message, exc.param, headers)
        except _Refused as exc:
            return fmt.bad_request(exc.refusal.message, exc.refusal.param, headers)
        counted = server.counted
        counted.in_flight += 1
        counted.peak = max(counted.peak, counted.in_flight)
        try:
            if cfg.count_latency > 0:
                await asyncio.sleep(cfg.count_latency * cfg.time_scale)
        finally:
            counted.in_flight -= 1
        counted.by_digest[message_digest(messages)] += 1
        return response(200, answer(count_prompt_tokens(messages)), headers)

    return handle


def _anthropic_answer(tokens: int) -> dict[str, Any]:
    return {"input_tokens": tokens}


def _gemini_answer(tokens: int) -> dict[str, Any]:
    return {"totalTokens": tokens, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}]}


def _bedrock_answer(tokens: int) -> dict[str, Any]:
    return {"inputTokens": tokens}


def add_routes(server: SimServer, app: web.Application) -> None:
    """The count routes (see the module's docstring); added before Vertex's ``{model}:rawPredict``, whose path
    Claude's ``count-tokens:rawPredict`` would match too."""
    add = app.router.add_post
    add("/v1/messages/count_tokens", _count(server, ANTHROPIC, _messages_body, _anthropic_answer))
    for version in ("v1beta", "v1"):
        add(f"/{version}/models/{{model}}:countTokens", _count(server, GEMINI, _gemini_body, _gemini_answer))
    add(_VERTEX + "/anthropic/models/count-tokens:rawPredict",
        _count(server, VERTEX_CLAUDE, _vertex_claude_body, _anthropic_answer))
    add(_VERTEX + "/google/models/{model}:countTokens",
        _count(server, VERTEX_GEMINI, _vertex_gemini_body, _gemini_answer))
    # Claude's and the Converse models' counts share the route; the errors are Bedrock's whichever it is
    add("/model/{modelId:.+}/count-tokens", _count(server, INVOKE, _bedrock_body, _bedrock_answer))
