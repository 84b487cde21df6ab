"""What the wire formats share: a request as the answer's inputs (:class:`Ask`), the :class:`WireFormat`
each format module fills in, and the JSON response and body-checking helpers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from .buckets import Blocked, Bucket

__all__ = ["JSON_HEADERS", "Ask", "Invalid", "Thought", "WireFormat", "compact", "joined", "positive_int", "response",
           "retry_headers", "seconds_text", "strings"]

# Built once: json.dumps() would build an encoder per call, and this is the hot path.
compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(slots=True)
class Ask:
    """A request of any format, as the inputs of the answer (OpenAI-style messages)."""

    model: str
    messages: list[Any]
    temperature: Any
    max_tokens: int | None
    top_p: Any
    stop: Any
    seed: Any
    extra: Any = None  #: what a format needs beyond these fields (legacy completions: its prompts and echo)
    #: the answer thinks first: asked for (reasoning_effort, thinking, thinkingConfig) or the model's default
    thinking: bool = False
    #: the effort asked for, lower case (OpenAI reasoning_effort, Anthropic output_config.effort, Gemini thinkingLevel)
    effort: str | None = None
    #: the thinking budget in tokens (Anthropic budget_tokens, Gemini thinkingBudget; None: dynamic or none given)
    budget: int | None = None
    #: the thinking text comes back (Anthropic thinking.display and the model's default, Gemini includeThoughts)
    show_thinking: bool = False
    #: the response's schema (OpenAI json_schema, Anthropic output_config.format, Gemini responseJsonSchema or
    #: responseSchema): the answer is a JSON instance of it
    schema: Any = None
    #: JSON without a schema (OpenAI json_object, Gemini responseMimeType application/json alone)
    json_object: bool = False
    #: Gemini's responseMimeType text/x.enum: the answer is the schema's enum value, bare (not JSON)
    enum_text: bool = False
    #: what the request read from and wrote to the prompt cache (:class:`simserver.prompt_cache.CacheUse`), set by
    #: the server before answering; None where the format caches nothing
    cache: Any = None
    #: the service tier asked (standard, flex, priority), then the one that serves it (:mod:`simserver.tiers`)
    tier: str | None = None


@dataclass(frozen=True, slots=True)
class Thought:
    """What a thinking answer spent before answering: ``tokens`` (counted in the completion tokens, as all three
    APIs count them against the output cap) and ``text`` (shown only where the format and the request say so)."""

    tokens: int
    text: str


class Invalid(Exception):
    """A request body the format rejects with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class WireFormat(Protocol):
    """One wire format: how it carries the key, reads a request, writes answers and errors.

    Error builders take the response headers gathered so far and return the finished response; ``limited``
    answers a bucket's 429 (``blocked``) or a random one (None) with ``retry`` seconds.
    """

    name = ""
    parse: Callable[[Any, web.Request], Ask]
    #: how its API caches prompts (:mod:`simserver.prompt_cache`: "openai", "anthropic", "gemini"); None: not at all
    cache_rule: str | None = None

    def new_headers(self) -> dict[str, str]:
        return {}

    def rate_headers(self, buckets: list[Bucket], headers: dict[str, str]) -> None:
        pass

    def key(self, request: web.Request) -> str: ...

    def cache_owner(self, request: web.Request) -> str:
        """Whose prompt cache a request reads (simserver.prompt_cache): its key, unless the API keeps caches per
        something else."""
        return self.key(request)
    def missing_key(self, headers: dict[str, str]) -> web.Response: ...
    def wrong_key(self, headers: dict[str, str]) -> web.Response: ...
    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response: ...
    def limited(self, model: str, blocked: Blocked | None, retry: float, headers: dict[str, str]) -> web.Response: ...
    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response: ...
    def server_error(self, headers: dict[str, str]) -> web.Response: ...
    def overloaded(self, headers: dict[str, str]) -> web.Response: ...

    def answer(self, ask: Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int, thought: Thought | None = None, refusal: str | None = None) -> dict[str, Any]:
        """The 200 body; ``text`` None means content-filtered, ``refusal`` (with ``text`` None) that the model
        declined with that message; ``thought`` is the thinking of a thinking answer (its tokens are in
        ``completion_tokens``)."""
        raise NotImplementedError


def key_refused(config: Any, fmt: WireFormat, request: web.Request, headers: dict[str, str]) -> web.Response | None:
    """The format's answer to a request whose key ``config`` (a ``SimConfig``) refuses: missing where one is
    required, or not the one set; None when the key is accepted."""
    if config.require_key or config.api_key is not None:
        key = fmt.key(request)
        if not key:
            return fmt.missing_key(headers)
        if config.api_key is not None and key != config.api_key:
            return fmt.wrong_key(headers)
    return None


def response(status: int, body: Any, headers: dict[str, str]) -> web.Response:
    return web.Response(status=status, body=compact(body).encode(), headers={**JSON_HEADERS, **headers})


def seconds_text(value: float) -> str:
    """0.2 -> "0.2", 1.0 -> "1": a decimal string without exponent."""
    return (f"{value:.3f}".rstrip("0").rstrip(".")) or "0"


def retry_headers(retry: float, headers: dict[str, str]) -> None:
    headers["retry-after"] = seconds_text(retry)


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


def joined(items: Any, key: str, kind: str | None) -> str | None:
    """Texts of a list of blocks or parts joined; None when one is not text."""
    if not isinstance(items, list):
        return None
    texts = []
    for item in items:
        if not isinstance(item, dict) or (kind and item.get("type") != kind) or not isinstance(item.get(key), str):
            return None
        texts.append(item[key])
    return "".join(texts)
