"""A simulated LLM provider that speaks the OpenAI, Anthropic and Gemini wire formats.

Point the official SDKs (or the runner) at it for tests, demos and benchmarks: it answers deterministically,
enforces per-model rate limits, injects the faults a real provider produces, counts what it received, and only
ever listens on its bind address (127.0.0.1 by default). Nothing here talks to the network.

Endpoints (``SimServer.url`` is the OpenAI base ending in ``/v1``; ``SimServer.root_url`` the bare origin
that the anthropic and google-genai SDKs take as ``base_url``)
    ``POST /v1/chat/completions``                    OpenAI Chat Completions; key ``Authorization: Bearer``.
    ``POST /v1/messages``                            Anthropic Messages; key ``x-api-key`` (or ``Authorization:
                                                     Bearer``, which is what anthropic 2.x sends for ``api_key``).
    ``POST /v1beta/models/{model}:generateContent``  Gemini generateContent, also under ``/v1/``; key
                                                     ``x-goog-api-key`` or ``?key=``.
    ``GET  /sim/stats``   ``{"received", "by_status", "by_route", "completed_by_digest"}``.
    ``POST /sim/reset``   zeroes the counters and refills the rate-limit buckets.
    ``POST /sim/config``  JSON object of :class:`SimConfig` fields to change at run time.

Answers depend only on (model, messages, temperature, max tokens, top_p, stop, seed), hashed as canonical
JSON. Anthropic and Gemini requests are first mapped to the OpenAI message list they mean: the system prompt
(``system``; ``systemInstruction`` parts) becomes a leading ``{"role": "system", "content": text}``, every turn
``{"role": "user"|"assistant", "content": text}`` (Gemini's ``model`` is the assistant) with text blocks or
parts joined, and ``stop_sequences``/``stopSequences``, ``max_tokens``/``maxOutputTokens`` fill the OpenAI
fields. So a conversation whose OpenAI contents are plain strings gets the same text, and the same key in
``completed_by_digest`` (SHA-256 of that list as canonical JSON), in every format. Integral floats count as
integers (google-genai sends ``temperature=0`` as ``0.0``). If the last user message lists options on their
own lines ("A. ..." or "A) ..."), the answer is one of the offered letters; otherwise a sentence of 8-30 words.
The max tokens (one token per word) truncate it (finish ``length`` / ``max_tokens`` / ``MAX_TOKENS``); stop
strings cut it (Anthropic reports ``stop_sequence``). Completion tokens never exceed the max tokens.

Rate limits are token buckets per model, like the real providers': a bucket holds its per-minute limit and
refills continuously at limit/60 per second; a request is admitted only if every configured bucket holds its
cost (``rpm``: 1; ``tpm``: input + max tokens, 16 when absent; ``itpm``: input; ``otpm``: max tokens), and
is then charged to all of them. Otherwise it gets a 429 whose ``retry-after`` is the wait until the bucket
would admit it, rounded up to a millisecond; a request costing more than a bucket's capacity could never be
admitted and gets a 400 instead (a 429 would invite retries that can never succeed). Rate-limit headers go on
every response of an authenticated, valid request while a limit is configured: OpenAI ``x-ratelimit-{limit,
remaining,reset}-{requests,tokens}`` (rpm and tpm only; reset as "1s", "6m0s", "120ms"), Anthropic
``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`` (reset an
RFC 3339 time); Gemini sends none, only ``RetryInfo`` in its 429 body. "Reset" is when the bucket is full again.
Every 429 carries ``retry-after`` in seconds (OpenAI also ``retry-after-ms``).

Fault knobs (:class:`SimConfig`) are decided in this order, each drawing from a ``random.Random(seed)`` owned
by the server only when its fraction is non-zero (so adding a knob never shifts the others' dice):
    key check          missing / wrong key (``require_key``, ``api_key``); no draw.
    ``fault_401``      auth failure.
    (body validation)  400.
    ``fault_quota``    out of credit: OpenAI 429 ``insufficient_quota``, Anthropic 402 ``billing_error``, Gemini
                       429 with a per-day ``QuotaFailure``; the 429s carry ``retry_after`` like random 429s.
    rate limits        429 from the buckets; no draw.
    ``fault_429``      rate-limit 429 with ``retry-after`` = ``retry_after``. Requests past here are charged.
    ``fault_500``      500.
    ``fault_503``      overloaded (OpenAI 503, Anthropic 529, Gemini 503).
    ``fault_timeout``  hang ``hang_seconds`` before answering.
    ``fault_malformed`` a 200 whose JSON body is cut in half.
    ``fault_filter``   a 200 whose answer was content-filtered (OpenAI ``finish_reason="content_filter"`` with
                       null content, Anthropic ``stop_reason="refusal"`` with no content, Gemini
                       ``finishReason="SAFETY"`` with no parts), a 200 in all three formats so a client sees a
                       filtered answer the same way everywhere. Malformed wins over filtered.
``latency`` delays every 200. A request whose client has gone when its hang or latency ends is counted as
status 499. ``completed_by_digest`` counts the 200s a client could read (answers and filtered answers, not
malformed ones). ``received`` counts requests to the three model routes, ``by_route`` splits them by format.
Received keys are compared, never stored, logged or echoed; the configured ``api_key`` is masked in
/sim/config's answer and the config's repr.

Run it in-process with :func:`start_server`, blocking with :func:`serve`, or as
``python -m providers.simserver --port 0 --rpm 600 --fault-503 0.1`` (prints one "listening" line).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, Self

from aiohttp import web

__all__ = ["SimConfig", "SimServer", "main", "message_digest", "serve", "simulated_reply", "start_server"]

_MC_OPTION = re.compile(r"(?m)^\s*([A-Z])[.)]\s")
_WORDS = (
    "the", "a", "model", "answer", "result", "token", "quick", "careful", "simple", "clear", "short",
    "long", "data", "value", "test", "run", "paper", "term", "option", "question", "choice", "reason",
    "evidence", "context", "meaning", "sentence", "word", "number", "example", "likely", "plausible",
    "cause", "effect", "because", "therefore", "however", "indeed", "often", "rarely", "always", "never",
    "first", "second", "third", "final", "small", "large", "new", "old", "early", "late", "good", "fair",
    "exact", "rough", "useful", "system", "request", "server", "client", "cache", "budget", "limit",
    "retry", "window", "stream", "batch", "job", "stage", "seed",
)
_FINGERPRINT = "fp_simserver"
# Encoders built once: json.dumps() would build one per call, and this is the hot path.
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_JSON_HEADERS = {"Content-Type": "application/json"}
_DEFAULT_MAX_TOKENS = 16  # what a request without max tokens is charged to the token buckets
_LIMITS = (("rpm", "requests"), ("tpm", "tokens"), ("itpm", "input-tokens"), ("otpm", "output-tokens"))


@dataclass
class SimConfig:
    """The knobs of the simulated server; every field is also a command-line flag and a /sim/config key."""

    latency: float = 0.0  #: seconds added to each successful response
    rpm: int | None = None  #: requests per minute per model (token bucket); None means unlimited
    tpm: int | None = None  #: tokens per minute per model: input + max tokens (16 when absent) at admission
    itpm: int | None = None  #: input tokens per minute per model (Anthropic-style)
    otpm: int | None = None  #: output tokens per minute per model, charged as max tokens at admission
    fault_429: float = 0.0  #: fraction of requests answered with a rate-limit 429 at random
    retry_after: float = 0.2  #: seconds of retry-after sent with random 429s (fault_429, fault_quota)
    fault_500: float = 0.0  #: fraction answered 500
    fault_503: float = 0.0  #: fraction answered "overloaded" (OpenAI 503, Anthropic 529, Gemini 503)
    fault_401: float = 0.0  #: fraction answered with the format's invalid-key error
    fault_quota: float = 0.0  #: fraction answered "out of credit" (OpenAI 429 insufficient_quota, ...)
    fault_timeout: float = 0.0  #: fraction that hang for hang_seconds before answering
    hang_seconds: float = 30.0
    fault_malformed: float = 0.0  #: fraction answered 200 with a truncated, invalid JSON body
    fault_filter: float = 0.0  #: fraction answered 200 with a content-filtered, empty answer
    seed: int = 0  #: seeds the fault RNG only; answers never depend on it
    require_key: bool = True  #: reject requests without a non-empty key in the format's own header
    api_key: str | None = field(default=None, repr=False)  #: when set, the only key accepted (missing -> error)

    def __post_init__(self) -> None:
        _checked_updates(dataclasses.asdict(self))


_OPTIONAL = {"rpm": int, "tpm": int, "itpm": int, "otpm": int, "api_key": str}
_FIELD_KINDS: dict[str, type] = {f.name: _OPTIONAL.get(f.name) or type(f.default)
                                 for f in dataclasses.fields(SimConfig)}


def _checked_updates(updates: Any) -> dict[str, Any]:
    """Validate a /sim/config body; raise ValueError or TypeError naming the problem."""
    if not isinstance(updates, dict):
        raise TypeError("config must be a JSON object")
    out: dict[str, Any] = {}
    for name, value in updates.items():
        kind = _FIELD_KINDS.get(name)
        if kind is None:
            raise ValueError(f"unknown config field {name!r}")
        if name in _OPTIONAL and value is None:
            out[name] = None
        elif kind is str:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string")
            out[name] = value
        elif kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false")
            out[name] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value % 1):
            raise ValueError(f"{name} must be a{'n integer' if kind is int else ' number'}")
        elif value < 0 or (name.startswith("fault_") and value > 1) or (name in _OPTIONAL and value < 1):
            raise ValueError(f"{name} must be {'between 0 and 1' if name.startswith('fault_') else 'positive'}")
        else:
            out[name] = kind(value)
    return out


def _seconds_text(value: float) -> str:
    """0.2 -> "0.2", 1.0 -> "1": a decimal string without exponent."""
    return (f"{value:.3f}".rstrip("0").rstrip(".")) or "0"


def _duration_text(seconds: float) -> str:
    """OpenAI's reset format: "20ms", "1s", "8.64s", "6m0s"."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{_seconds_text(rest)}s"
    return f"{int(minutes)}m{text}" if minutes else text


def _rfc3339(wall: float) -> str:
    """Anthropic's reset format, whole seconds rounded up: "2025-01-08T21:24:00Z"."""
    return datetime.fromtimestamp(math.ceil(wall), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _wait_ms(seconds: float) -> int:
    return math.ceil(round(seconds * 1000, 6))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def message_digest(messages: list[Any]) -> str:
    """The key of /sim/stats' completed_by_digest: SHA-256 of the messages list as canonical JSON."""
    return hashlib.sha256(_canonical(messages).encode()).hexdigest()


def simulated_reply(model: str, messages: list[Any], temperature: Any = None, max_tokens: int | None = None,
                    top_p: Any = None, stop: Any = None, seed: Any = None) -> tuple[str, str]:
    """The (content, finish_reason) the server answers for these request fields; a pure function."""
    return _reply(_canonical(messages), model, messages, temperature, max_tokens, top_p, stop, seed)[:2]


def _reply(messages_json: str, model: str, messages: list[Any], temperature: Any, max_tokens: int | None,
           top_p: Any, stop: Any, seed: Any) -> tuple[str, str, str | None]:
    """(text, "stop"|"length", the stop string that cut the text or None)."""
    # The messages' canonical JSON is passed in because the server also needs it for the digest.
    params = _canonical([model, _number(temperature), max_tokens, _number(top_p), stop, seed])
    h = hashlib.sha256(f"{params}{messages_json}".encode()).digest()
    last = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    letters = list(dict.fromkeys(_MC_OPTION.findall(_text_of(last.get("content")))))
    if len(letters) >= 2:
        text = letters[h[0] % len(letters)]
    else:
        # Byte 1 picks the length (8-30 words), bytes 2..31 pick the words.
        words = [_WORDS[b % len(_WORDS)] for b in h[2:2 + 8 + h[1] % 23]]
        text = " ".join(words).capitalize() + "."
    hit = None
    if stop:
        cuts = [(i, s) for s in ([stop] if isinstance(stop, str) else stop) if s and (i := text.find(s)) >= 0]
        if cuts:
            cut, hit = min(cuts)
            text = text[:cut]
    if max_tokens is not None:
        words = text.split(" ")
        if len(words) > max_tokens:
            return " ".join(words[:max_tokens]), "length", None
    return text, "stop", hit


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _prompt_tokens(messages: list[Any]) -> int:
    return 3 + sum(_tokens(_text_of(m.get("content"))) + 3 for m in messages)


# -- requests ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Ask:
    """A request of any format, as the inputs of the answer (OpenAI-style messages)."""

    model: str
    messages: list[Any]
    temperature: Any
    max_tokens: int | None
    top_p: Any
    stop: Any
    seed: Any


class _Invalid(Exception):
    """A request body the format rejects with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


def _joined(items: Any, key: str, kind: str | None) -> str | None:
    """Texts of a list of blocks or parts joined; None when one is not text."""
    if not isinstance(items, list):
        return None
    texts = []
    for item in items:
        if not isinstance(item, dict) or (kind and item.get("type") != kind) or not isinstance(item.get(key), str):
            return None
        texts.append(item[key])
    return "".join(texts)


def _parse_openai(body: Any, request: web.Request) -> _Ask:
    if not isinstance(body, dict):
        raise _Invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _Invalid("You must provide a model parameter.", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Invalid("Missing required parameter: 'messages'.", "messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise _Invalid("Each message must be an object with a 'role'.", "messages")
    if body.get("n") not in (None, 1):
        raise _Invalid("The simulated server supports only n=1.", "n")
    if body.get("stream"):
        raise _Invalid("The simulated server does not support streaming.", "stream")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and not _positive_int(value):
            raise _Invalid(f"Invalid '{name}': expected an integer of at least 1.", name)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not _strings(stop):
        raise _Invalid("Invalid 'stop': expected a string or a list of strings.", "stop")
    return _Ask(body["model"], messages, body.get("temperature"),
                body.get("max_completion_tokens", body.get("max_tokens")), body.get("top_p"), stop,
                body.get("seed"))


def _parse_anthropic(body: Any, request: web.Request) -> _Ask:
    if not isinstance(body, dict):
        raise _Invalid("The request body must be a JSON object.")
    for name in ("model", "max_tokens", "messages"):
        if body.get(name) is None:
            raise _Invalid(f"{name}: Field required")
    model, max_tokens, turns = body["model"], body["max_tokens"], body["messages"]
    if not isinstance(model, str) or not model:
        raise _Invalid("model: Input should be a valid string")
    if not _positive_int(max_tokens):
        raise _Invalid("max_tokens: Input should be an integer greater than or equal to 1")
    if not isinstance(turns, list) or not turns:
        raise _Invalid("messages: at least one message is required")
    messages = []
    if (system := body.get("system")) is not None:
        text = system if isinstance(system, str) else _joined(system, "text", "text")
        if text is None:
            raise _Invalid("system: Input should be a valid string or a list of text blocks")
        messages.append({"role": "system", "content": text})
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise _Invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = turn.get("content")
        text = content if isinstance(content, str) else _joined(content, "text", "text")
        if text is None:
            raise _Invalid(f"messages.{i}.content: the simulated server accepts only a string or text blocks")
        messages.append({"role": turn["role"], "content": text})
    stop = body.get("stop_sequences")
    if stop is not None and not _strings(stop):
        raise _Invalid("stop_sequences: Input should be a valid list of strings")
    if body.get("stream"):
        raise _Invalid("stream: the simulated server does not support streaming")
    return _Ask(model, messages, body.get("temperature"), max_tokens, body.get("top_p"), stop or None, None)


def _parse_gemini(body: Any, request: web.Request) -> _Ask:
    if not isinstance(body, dict):
        raise _Invalid("Invalid JSON payload received. Expected an object.")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _Invalid("* GenerateContentRequest.contents: contents is not specified\n")
    messages = []
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system is not None:
        text = _joined(system.get("parts"), "text", None) if isinstance(system, dict) else None
        if text is None:
            raise _Invalid("* GenerateContentRequest.system_instruction: only text parts are supported\n")
        messages.append({"role": "system", "content": text})
    for i, content in enumerate(contents):
        role = content.get("role") or "user" if isinstance(content, dict) else None
        if role not in ("user", "model"):
            raise _Invalid(f"* GenerateContentRequest.contents[{i}].role: Please use a valid role: user, model.\n")
        text = _joined(content.get("parts"), "text", None)
        if text is None:
            raise _Invalid(f"* GenerateContentRequest.contents[{i}].parts: only text parts are supported\n")
        messages.append({"role": "assistant" if role == "model" else "user", "content": text})
    config = body.get("generationConfig", body.get("generation_config")) or {}
    if not isinstance(config, dict):
        raise _Invalid("Invalid JSON payload received. 'generationConfig' must be an object.")

    def option(camel: str, snake: str) -> Any:
        return config.get(camel, config.get(snake))

    max_tokens = option("maxOutputTokens", "max_output_tokens")
    if max_tokens is not None and not _positive_int(max_tokens):
        raise _Invalid("* GenerateContentRequest.generation_config.max_output_tokens: must be a positive integer\n")
    if option("candidateCount", "candidate_count") not in (None, 1):
        raise _Invalid("* GenerateContentRequest.generation_config.candidate_count: the simulated server "
                       "supports only 1\n")
    stop = option("stopSequences", "stop_sequences")
    if stop is not None and not _strings(stop):
        raise _Invalid("* GenerateContentRequest.generation_config.stop_sequences: must be a list of strings\n")
    return _Ask(request.match_info["model"], messages, config.get("temperature"), max_tokens,
                option("topP", "top_p"), stop or None, config.get("seed"))


# -- rate limits ------------------------------------------------------------------------------------------


class _Bucket:
    """One per-minute limit of one model: holds up to ``capacity``, refills at ``capacity / 60`` per second."""

    __slots__ = ("capacity", "kind", "level", "rate", "stamp")

    def __init__(self, kind: str, capacity: int, now: float) -> None:
        self.kind = kind  #: "requests", "tokens", "input-tokens" or "output-tokens"
        self.capacity = capacity
        self.rate = capacity / 60.0
        self.level = float(capacity)
        self.stamp = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def cost(self, input_tokens: int, output_tokens: int) -> int:
        kind = self.kind
        if kind == "requests":
            return 1
        if kind == "tokens":
            return input_tokens + output_tokens
        return input_tokens if kind == "input-tokens" else output_tokens

    def remaining(self) -> int:
        return max(0, int(self.level + 1e-9))

    def full_in(self) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level) / self.rate


@dataclass(slots=True)
class _Blocked:
    """Why a request was not admitted: the bucket that makes it wait longest."""

    bucket: _Bucket
    cost: int
    wait: float  #: seconds; inf when the cost exceeds the capacity


def _blocked(buckets: list[_Bucket], input_tokens: int, output_tokens: int) -> _Blocked | None:
    """Why the request cannot be admitted now (buckets refilled by the caller), or None."""
    worst: _Blocked | None = None
    for bucket in buckets:
        cost = bucket.cost(input_tokens, output_tokens)
        if cost > bucket.capacity:
            return _Blocked(bucket, cost, math.inf)
        if cost > bucket.level + 1e-9:
            wait = (cost - bucket.level) / bucket.rate
            if worst is None or wait > worst.wait:
                worst = _Blocked(bucket, cost, wait)
    return worst


_PER_MINUTE = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)",
               "input-tokens": "input tokens per min (ITPM)", "output-tokens": "output tokens per min (OTPM)"}


# -- formats ----------------------------------------------------------------------------------------------


class _Format(Protocol):
    """One wire format: how it carries the key, reads a request, writes answers and errors.

    Error builders take the response headers gathered so far and return the finished response; ``limited``
    answers a bucket's 429 (``blocked``) or a random one (None) with ``retry`` seconds.
    """

    name = ""
    parse: Callable[[Any, web.Request], _Ask]

    def new_headers(self) -> dict[str, str]:
        return {}

    def rate_headers(self, buckets: list[_Bucket], headers: dict[str, str]) -> None:
        pass

    def key(self, request: web.Request) -> str: ...
    def missing_key(self, headers: dict[str, str]) -> web.Response: ...
    def wrong_key(self, headers: dict[str, str]) -> web.Response: ...
    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response: ...
    def limited(self, model: str, blocked: _Blocked | None, retry: float, headers: dict[str, str]) -> web.Response: ...
    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response: ...
    def server_error(self, headers: dict[str, str]) -> web.Response: ...
    def overloaded(self, headers: dict[str, str]) -> web.Response: ...

    def answer(self, ask: _Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
        """The 200 body; ``text`` None means content-filtered."""
        raise NotImplementedError


def _response(status: int, body: Any, headers: dict[str, str]) -> web.Response:
    return web.Response(status=status, body=_compact(body).encode(), headers={**_JSON_HEADERS, **headers})


def _retry_headers(retry: float, headers: dict[str, str]) -> None:
    headers["retry-after"] = _seconds_text(retry)


class _OpenAI(_Format):
    name = "openai"
    parse = staticmethod(_parse_openai)

    def new_headers(self) -> dict[str, str]:
        return {"x-request-id": "req_" + os.urandom(12).hex()}

    def key(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else ""

    def rate_headers(self, buckets: list[_Bucket], headers: dict[str, str]) -> None:
        for b in buckets:
            if b.kind in ("requests", "tokens"):
                headers[f"x-ratelimit-limit-{b.kind}"] = str(b.capacity)
                headers[f"x-ratelimit-remaining-{b.kind}"] = str(b.remaining())
                headers[f"x-ratelimit-reset-{b.kind}"] = _duration_text(b.full_in())

    @staticmethod
    def error(status: int, message: str, type_: str, code: str | None, headers: dict[str, str],
              param: str | None = None) -> web.Response:
        return _response(status, {"error": {"message": message, "type": type_, "param": param, "code": code}},
                         headers)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(401, "You didn't provide an API key. You need to provide your API key in an "
                          "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                          "invalid_request_error", "invalid_api_key", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        # The real message shows a masked key; the simulation shows none at all.
        return self.error(401, "Incorrect API key provided. You can find your API key at "
                          "https://platform.openai.com/account/api-keys.", "invalid_request_error",
                          "invalid_api_key", headers)

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        return self.error(400, message, "invalid_request_error", None, headers, param)

    def limited(self, model: str, blocked: _Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        _retry_headers(retry, headers)
        headers["retry-after-ms"] = str(round(retry * 1000))
        if blocked is None:
            what, kind, used = _PER_MINUTE["requests"], "requests", ""
        else:
            b = blocked.bucket
            what, kind = _PER_MINUTE[b.kind], "requests" if b.kind == "requests" else "tokens"
            used = f" Limit {b.capacity}, Used {b.capacity - b.remaining()}, Requested {blocked.cost}."
        message = (f"Rate limit reached for {model} in organization org-simserver on {what}:{used} "
                   f"Please try again in {_duration_text(retry)}.")
        return self.error(429, message, kind, "rate_limit_exceeded", headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        _retry_headers(retry, headers)
        return self.error(429, "You exceeded your current quota, please check your plan and billing details. "
                          "For more information on this error, read the docs: "
                          "https://platform.openai.com/docs/guides/error-codes/api-errors.",
                          "insufficient_quota", "insufficient_quota", headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return self.error(500, "The server had an error while processing your request.", "server_error", None,
                          headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return self.error(503, "The server is overloaded or not ready yet.", "server_error", None, headers)

    def answer(self, ask: _Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
        return {
            "id": "chatcmpl-" + os.urandom(12).hex(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ask.model,
            "system_fingerprint": _FINGERPRINT,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish if text is not None else "content_filter"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0},
            },
        }


class _Anthropic(_Format):
    name = "anthropic"
    parse = staticmethod(_parse_anthropic)

    def new_headers(self) -> dict[str, str]:
        return {"request-id": "req_" + os.urandom(12).hex()}

    def key(self, request: web.Request) -> str:
        key = request.headers.get("x-api-key", "").strip()
        if key:
            return key
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else ""

    def rate_headers(self, buckets: list[_Bucket], headers: dict[str, str]) -> None:
        wall = time.time()
        for b in buckets:
            prefix = f"anthropic-ratelimit-{b.kind}-"
            headers[prefix + "limit"] = str(b.capacity)
            headers[prefix + "remaining"] = str(b.remaining())
            headers[prefix + "reset"] = _rfc3339(wall + b.full_in())

    @staticmethod
    def error(status: int, type_: str, message: str, headers: dict[str, str]) -> web.Response:
        body = {"type": "error", "error": {"type": type_, "message": message}, "request_id": headers["request-id"]}
        return _response(status, body, headers)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(401, "authentication_error", "x-api-key header is required", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(401, "authentication_error", "invalid x-api-key", headers)

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        return self.error(400, "invalid_request_error", message, headers)

    def limited(self, model: str, blocked: _Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        _retry_headers(retry, headers)
        b = blocked.bucket if blocked else None
        what = f"{b.capacity} {b.kind.replace('-', ' ')} per minute" if b else "requests per minute"
        return self.error(429, "rate_limit_error",
                          f"This request would exceed the rate limit for your organization of {what} "
                          f"(model {model}). Please retry after {_seconds_text(retry)} seconds.", headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        # 402 billing_error is in Anthropic's documented error types; older accounts saw this text as a 400.
        return self.error(402, "billing_error", "Your credit balance is too low to access the Anthropic API. "
                          "Please go to Plans & Billing to upgrade or purchase credits.", headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return self.error(500, "api_error", "Internal server error", headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return self.error(529, "overloaded_error", "Overloaded", headers)

    def answer(self, ask: _Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
        if text is None:
            reason = "refusal"
        elif finish == "length":
            reason = "max_tokens"
        else:
            reason = "stop_sequence" if stop_hit is not None else "end_turn"
        return {
            "id": "msg_" + os.urandom(12).hex(),
            "type": "message",
            "role": "assistant",
            "model": ask.model,
            "content": [] if text is None else [{"type": "text", "text": text}],
            "stop_reason": reason,
            "stop_sequence": stop_hit,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }


_GOOGLE_QUOTA = "type.googleapis.com/google.rpc.QuotaFailure"
_QUOTA_IDS = {  # bucket kind -> (quotaMetric suffix, quotaId)
    "requests": ("generate_content_requests", "GenerateRequestsPerMinutePerProjectPerModel"),
    "tokens": ("generate_content_input_token_count", "GenerateContentInputTokensPerModelPerMinute"),
    "input-tokens": ("generate_content_input_token_count", "GenerateContentInputTokensPerModelPerMinute"),
    "output-tokens": ("generate_content_output_token_count", "GenerateContentOutputTokensPerModelPerMinute"),
}


class _Gemini(_Format):
    name = "gemini"
    parse = staticmethod(_parse_gemini)

    def key(self, request: web.Request) -> str:
        return (request.headers.get("x-goog-api-key") or request.query.get("key") or "").strip()

    @staticmethod
    def error(code: int, status: str, message: str, headers: dict[str, str],
              details: list[dict[str, Any]] | None = None) -> web.Response:
        body = {"error": {"code": code, "message": message, "status": status, "details": details or []}}
        return _response(code, body, headers)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers (callers without "
                          "established identity). Please use API Key or other form of API consumer identity to "
                          "call this API.", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}
        return self.error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", headers,
                          [info])

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        return self.error(400, "INVALID_ARGUMENT", message, headers)

    @staticmethod
    def exhausted(model: str, metric_name: str, quota_id: str, limit: int | None, retry: float,
                  headers: dict[str, str]) -> web.Response:
        _retry_headers(retry, headers)
        metric = f"generativelanguage.googleapis.com/{metric_name}"
        violation: dict[str, Any] = {"quotaMetric": metric, "quotaId": quota_id,
                                     "quotaDimensions": {"location": "global", "model": model}}
        if limit is not None:
            violation["quotaValue"] = str(limit)
        message = ("You exceeded your current quota, please check your plan and billing details. For more "
                   "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n"
                   f"* Quota exceeded for metric: {metric}, {f'limit: {limit}, ' if limit else ''}model: {model}\n"
                   f"Please retry in {_seconds_text(retry)}s.")
        details = [{"@type": _GOOGLE_QUOTA, "violations": [violation]},
                   {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{_seconds_text(retry)}s"}]
        return _Gemini.error(429, "RESOURCE_EXHAUSTED", message, headers, details)

    def limited(self, model: str, blocked: _Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        kind = blocked.bucket.kind if blocked else "requests"
        metric, quota_id = _QUOTA_IDS[kind]
        return self.exhausted(model, metric, quota_id, blocked.bucket.capacity if blocked else None, retry, headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        return self.exhausted(model, "generate_content_free_tier_requests",
                              "GenerateRequestsPerDayPerProjectPerModel-FreeTier", None, retry, headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return self.error(500, "INTERNAL", "An internal error has occurred. Please retry or report in "
                          "https://developers.generativeai.google/guide/troubleshooting", headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return self.error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.", headers)

    def answer(self, ask: _Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
        if text is None:
            candidate: dict[str, Any] = {"finishReason": "SAFETY", "index": 0, "safetyRatings": [
                {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}]}
        else:
            candidate = {"content": {"role": "model", "parts": [{"text": text}]},
                         "finishReason": "MAX_TOKENS" if finish == "length" else "STOP", "index": 0}
        return {
            "candidates": [candidate],
            "usageMetadata": {"promptTokenCount": prompt_tokens, "candidatesTokenCount": completion_tokens,
                              "totalTokenCount": prompt_tokens + completion_tokens,
                              "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}]},
            "modelVersion": ask.model,
            "responseId": os.urandom(12).hex(),
        }


_OPENAI, _ANTHROPIC, _GEMINI = _OpenAI(), _Anthropic(), _Gemini()


# -- the server -------------------------------------------------------------------------------------------


class SimServer:
    """A running simulated server: ``url`` (OpenAI base, ends in ``/v1``), ``root_url``; ``stats()``,
    ``reset()``, ``configure()``."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.host = ""
        self.port = 0
        self._rng = random.Random(self.config.seed)
        self._buckets: dict[str, list[_Bucket]] = {}  # per model, the configured limits' buckets
        self._closing = asyncio.Event()
        self.clock: Callable[[], float] = time.monotonic  #: the rate limits' clock; tests may replace it
        self._runner: web.AppRunner | None = None
        self.reset()

    @property
    def root_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.root_url + "/v1"

    def stats(self) -> dict[str, Any]:
        return {"received": self._received, "by_status": {str(k): v for k, v in self._by_status.items()},
                "by_route": dict(self._by_route), "completed_by_digest": dict(self._completed)}

    def reset(self) -> None:
        self._received = 0
        self._by_status: dict[int, int] = {}
        self._by_route = {"openai": 0, "anthropic": 0, "gemini": 0}
        self._completed: dict[str, int] = {}
        self._buckets.clear()

    def configure(self, **changes: Any) -> SimConfig:
        """Change config fields at run time (validated); a new seed reseeds the fault RNG, a new limit
        starts full buckets."""
        self.config = dataclasses.replace(self.config, **_checked_updates(changes))
        if "seed" in changes:
            self._rng.seed(self.config.seed)
        if any(name in changes for name, _ in _LIMITS):
            self._buckets.clear()
        return self.config

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Self:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1beta/models/{model}:generateContent", self._gemini)
        app.router.add_post("/v1/models/{model}:generateContent", self._gemini)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_post("/sim/reset", self._reset)
        app.router.add_post("/sim/config", self._config)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        self.host, self.port = host, self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        self._closing.set()  # wakes requests hanging in a simulated timeout
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- handlers -------------------------------------------------------------------------------------

    async def _openai(self, request: web.Request) -> web.Response:
        return await self._serve(request, _OPENAI)

    async def _anthropic(self, request: web.Request) -> web.Response:
        return await self._serve(request, _ANTHROPIC)

    async def _gemini(self, request: web.Request) -> web.Response:
        return await self._serve(request, _GEMINI)

    def _finish(self, response: web.Response) -> web.Response:
        self._by_status[response.status] = self._by_status.get(response.status, 0) + 1
        return response

    def _buckets_at(self, model: str, now: float) -> list[_Bucket]:
        buckets = self._buckets.get(model)
        if buckets is None:
            cfg = self.config
            buckets = self._buckets[model] = [_Bucket(kind, limit, now) for name, kind in _LIMITS
                                              if (limit := getattr(cfg, name)) is not None]
        for bucket in buckets:
            bucket.refill(now)
        return buckets

    def _admit(self, fmt: _Format, ask: _Ask, prompt_tokens: int, headers: dict[str, str]) -> web.Response | None:
        """The out-of-credit fault, the rate limits, the random 429: the response that turns the request away,
        or None once it is charged to the model's buckets (and their headers are in ``headers``)."""
        cfg, rng = self.config, self._rng
        buckets: list[_Bucket] = []
        if cfg.rpm is not None or cfg.tpm is not None or cfg.itpm is not None or cfg.otpm is not None:
            buckets = self._buckets_at(ask.model, self.clock())
        if cfg.fault_quota and rng.random() < cfg.fault_quota:
            fmt.rate_headers(buckets, headers)
            return fmt.quota(ask.model, cfg.retry_after, headers)
        output_tokens = ask.max_tokens or _DEFAULT_MAX_TOKENS
        if buckets and (blocked := _blocked(buckets, prompt_tokens, output_tokens)) is not None:
            fmt.rate_headers(buckets, headers)
            if blocked.wait == math.inf:
                b = blocked.bucket
                return fmt.bad_request(f"Request too large for {ask.model} on {_PER_MINUTE[b.kind]}: Limit "
                                       f"{b.capacity}, Requested {blocked.cost}. The input or output tokens must "
                                       "be reduced.", None, headers)
            return fmt.limited(ask.model, blocked, _wait_ms(blocked.wait) / 1000, headers)
        if cfg.fault_429 and rng.random() < cfg.fault_429:
            fmt.rate_headers(buckets, headers)
            return fmt.limited(ask.model, None, cfg.retry_after, headers)
        if buckets:
            for bucket in buckets:
                bucket.level -= bucket.cost(prompt_tokens, output_tokens)
            fmt.rate_headers(buckets, headers)
        return None

    async def _serve(self, request: web.Request, fmt: _Format) -> web.Response:
        self._received += 1
        self._by_route[fmt.name] += 1
        cfg = self.config
        headers = fmt.new_headers()
        if cfg.require_key or cfg.api_key is not None:
            key = fmt.key(request)
            if not key:
                return self._finish(fmt.missing_key(headers))
            if cfg.api_key is not None and key != cfg.api_key:
                return self._finish(fmt.wrong_key(headers))
        rng = self._rng
        if cfg.fault_401 and rng.random() < cfg.fault_401:
            return self._finish(fmt.wrong_key(headers))
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self._finish(fmt.bad_request("We could not parse the JSON body of your request.", None, headers))
        try:
            ask = fmt.parse(body, request)
        except _Invalid as exc:
            return self._finish(fmt.bad_request(exc.message, exc.param, headers))

        prompt_tokens = _prompt_tokens(ask.messages)
        turned_away = self._admit(fmt, ask, prompt_tokens, headers)
        if turned_away is not None:
            return self._finish(turned_away)
        if cfg.fault_500 and rng.random() < cfg.fault_500:
            return self._finish(fmt.server_error(headers))
        if cfg.fault_503 and rng.random() < cfg.fault_503:
            return self._finish(fmt.overloaded(headers))
        hang = cfg.fault_timeout and rng.random() < cfg.fault_timeout
        malformed = cfg.fault_malformed and rng.random() < cfg.fault_malformed
        filtered = cfg.fault_filter and rng.random() < cfg.fault_filter
        if hang:
            try:  # close() sets _closing, so shutting down never waits out a hang
                await asyncio.wait_for(self._closing.wait(), cfg.hang_seconds)
            except TimeoutError:
                pass
            except asyncio.CancelledError:  # aiohttp with handler_cancellation=True: the client left
                self._finish(web.Response(status=499))
                raise
        elif cfg.latency > 0:
            await asyncio.sleep(cfg.latency)
        if (hang or cfg.latency > 0) and (request.transport is None or request.transport.is_closing()):
            # The client gave up while we waited: nothing was delivered, so nothing counts as completed.
            return self._finish(web.Response(status=499))

        messages_json = _canonical(ask.messages)
        if filtered and not malformed:
            text, finish, hit, completion_tokens = None, "content_filter", None, 0
        else:
            text, finish, hit = _reply(messages_json, ask.model, ask.messages, ask.temperature, ask.max_tokens,
                                       ask.top_p, ask.stop, ask.seed)
            completion_tokens = max(1, _tokens(text))
            if ask.max_tokens is not None:
                completion_tokens = min(completion_tokens, ask.max_tokens)
        data = _compact(fmt.answer(ask, text, finish, hit, prompt_tokens, completion_tokens)).encode()
        if malformed:
            data = data[:len(data) // 2]
        else:
            digest = hashlib.sha256(messages_json.encode()).hexdigest()
            self._completed[digest] = self._completed.get(digest, 0) + 1
        return self._finish(web.Response(body=data, headers={**_JSON_HEADERS, **headers}))

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self.stats())

    async def _config(self, request: web.Request) -> web.Response:
        try:
            self.configure(**_checked_updates(json.loads(await request.read())))
        except (ValueError, TypeError) as exc:  # bad JSON, unknown field or bad value
            return _OPENAI.bad_request(str(exc), None, {})
        shown = dataclasses.asdict(self.config)
        if shown["api_key"] is not None:
            shown["api_key"] = "***"
        return web.json_response(shown)


async def start_server(config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> SimServer:
    """Start a simulated server on the running loop; ``port=0`` picks a free port (see ``.port``)."""
    return await SimServer(config).start(host, port)


def serve(host: str = "127.0.0.1", port: int = 8765, config: SimConfig | None = None) -> None:
    """Run a simulated server until SIGINT/SIGTERM, after printing one "listening on" line to stdout."""

    async def run() -> None:
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        server = await start_server(config, host, port)
        try:
            print(f"simulated server listening on {server.url}", flush=True)
            await stopped.wait()
        finally:
            await server.close()

    asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    """``python -m providers.simserver``: every SimConfig field is a flag (``--fault-429 0.3``)."""
    parser = argparse.ArgumentParser(prog="python -m providers.simserver",
                                     description="Simulated OpenAI, Anthropic and Gemini LLM server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    for f in dataclasses.fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        if _FIELD_KINDS[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=_FIELD_KINDS[f.name], default=f.default)
    args = vars(parser.parse_args(argv))
    try:
        config = SimConfig(**{f.name: args[f.name] for f in dataclasses.fields(SimConfig)})
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    serve(args["host"], args["port"], config)


if __name__ == "__main__":
    sys.exit(main())
