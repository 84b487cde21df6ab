"""A simulated LLM provider that speaks the OpenAI Chat Completions wire format.

Point the official ``openai`` SDK (or the runner) at it for tests, demos and benchmarks: it answers
deterministically, injects the faults a real provider produces, counts what it received, and only ever
listens on its bind address (127.0.0.1 by default). Nothing here talks to the network.

Endpoints
    ``POST /v1/chat/completions``  OpenAI request and response bodies, headers and error JSON.
    ``GET  /sim/stats``            ``{"received", "by_status", "completed_by_digest"}``.
    ``POST /sim/reset``            zeroes the counters (and the rpm window).
    ``POST /sim/config``           JSON object of :class:`SimConfig` fields to change at run time.

Answers depend only on the request (model, messages, temperature, max tokens, top_p, stop, seed), hashed as
canonical JSON. If the last user message lists options on their own lines ("A. ..." or "A) ..."), the
answer is one of the offered letters; otherwise it is a sentence of 8-30 words from a fixed list.
``max_tokens`` (one token per word) truncates with ``finish_reason="length"``; ``stop`` strings cut the text.
``usage.completion_tokens`` never exceeds ``max_tokens``.

Fault knobs (:class:`SimConfig`), decided in this order by a ``random.Random(seed)`` owned by the server:
    ``rpm``            sliding 60 s window of accepted requests; over it -> 429.
    ``fault_429``      fraction answered 429 (``retry-after``/``retry-after-ms`` carry ``retry_after``).
    ``fault_500``      fraction answered 500.
    ``fault_timeout``  fraction that hang ``hang_seconds`` before answering.
``latency`` delays every successful answer. The rpm window counts requests that got past both 429 checks.
A request whose client has gone when its hang or latency ends is counted as status 499, not as completed.
``received`` counts only chat completion requests.
``x-ratelimit-reset-requests`` is the time until the window is empty again, OpenAI's "resets to its
initial state".

Run it in-process with :func:`start_server`, blocking with :func:`serve`, or as
``python -m providers.simserver --port 0 --rpm 600 --fault-429 0.1`` (prints one "listening" line).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import random
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

from aiohttp import web

__all__ = ["SimConfig", "SimServer", "main", "message_digest", "serve", "simulated_reply", "start_server"]

WINDOW = 60.0
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


@dataclass
class SimConfig:
    """The knobs of the simulated server; every field is also a command-line flag and a /sim/config key."""

    latency: float = 0.0  #: seconds added to each successful response
    rpm: int | None = None  #: requests accepted per sliding minute; None means unlimited
    fault_429: float = 0.0  #: fraction of requests answered 429 at random
    retry_after: float = 0.2  #: seconds, sent with every 429
    fault_500: float = 0.0  #: fraction answered 500
    fault_timeout: float = 0.0  #: fraction that hang for hang_seconds before answering
    hang_seconds: float = 30.0
    seed: int = 0  #: seeds the fault RNG only; answers never depend on it
    require_key: bool = True  #: 401 without a non-empty "Authorization: Bearer ..." header

    def __post_init__(self) -> None:
        _checked_updates(dataclasses.asdict(self))


_FIELD_KINDS: dict[str, type] = {f.name: int if f.name == "rpm" else type(f.default)
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
        if name == "rpm" and value is None:
            out[name] = None
        elif kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false")
            out[name] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value % 1):
            raise ValueError(f"{name} must be a{'n integer' if kind is int else ' number'}")
        elif value < 0 or (name.startswith("fault_") and value > 1):
            raise ValueError(f"{name} must be {'between 0 and 1' if name.startswith('fault_') else 'positive'}")
        else:
            out[name] = kind(value)
    return out


def _error(status: int, message: str, type_: str, code: str | None, headers: dict[str, str],
           param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.Response(status=status, body=json.dumps(body).encode(), headers={**_JSON_HEADERS, **headers})


def _bad_request(message: str, headers: dict[str, str], param: str | None = None) -> web.Response:
    return _error(400, message, "invalid_request_error", None, headers, param)


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


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def message_digest(messages: list[Any]) -> str:
    """The key of /sim/stats' completed_by_digest: SHA-256 of the messages list as canonical JSON."""
    return hashlib.sha256(_canonical(messages).encode()).hexdigest()


def simulated_reply(model: str, messages: list[Any], temperature: Any = None, max_tokens: int | None = None,
                    top_p: Any = None, stop: Any = None, seed: Any = None) -> tuple[str, str]:
    """The (content, finish_reason) the server answers for these request fields; a pure function."""
    return _reply(_canonical(messages), model, messages, temperature, max_tokens, top_p, stop, seed)


def _reply(messages_json: str, model: str, messages: list[Any], temperature: Any, max_tokens: int | None,
           top_p: Any, stop: Any, seed: Any) -> tuple[str, str]:
    # The messages' canonical JSON is passed in because the server also needs it for the digest.
    params = _canonical([model, temperature, max_tokens, top_p, stop, seed])
    h = hashlib.sha256(f"{params}{messages_json}".encode()).digest()
    last = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    letters = list(dict.fromkeys(_MC_OPTION.findall(_text_of(last.get("content")))))
    if len(letters) >= 2:
        text = letters[h[0] % len(letters)]
    else:
        # Byte 1 picks the length (8-30 words), bytes 2..31 pick the words.
        words = [_WORDS[b % len(_WORDS)] for b in h[2:2 + 8 + h[1] % 23]]
        text = " ".join(words).capitalize() + "."
    if stop:
        cuts = [i for s in ([stop] if isinstance(stop, str) else stop) if s and (i := text.find(s)) >= 0]
        if cuts:
            text = text[:min(cuts)]
    if max_tokens is not None:
        words = text.split(" ")
        if len(words) > max_tokens:
            return " ".join(words[:max_tokens]), "length"
    return text, "stop"


class SimServer:
    """A running simulated server: ``url`` ends in ``/v1``; ``stats()``, ``reset()``, ``configure()``."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.host = ""
        self.port = 0
        self._rng = random.Random(self.config.seed)
        self._window: deque[float] = deque()  # monotonic times of accepted requests, oldest first
        self._closing = asyncio.Event()
        self.clock: Callable[[], float] = time.monotonic  #: the rpm window's clock; tests may replace it
        self._runner: web.AppRunner | None = None
        self.reset()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        return {"received": self._received, "by_status": {str(k): v for k, v in self._by_status.items()},
                "completed_by_digest": dict(self._completed)}

    def reset(self) -> None:
        self._received = 0
        self._by_status: dict[int, int] = {}
        self._completed: dict[str, int] = {}
        self._window.clear()

    def configure(self, **changes: Any) -> SimConfig:
        """Change config fields at run time (validated); a new seed reseeds the fault RNG."""
        self.config = dataclasses.replace(self.config, **_checked_updates(changes))
        if "seed" in changes:
            self._rng.seed(self.config.seed)
        return self.config

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Self:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
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

    def _finish(self, response: web.Response) -> web.Response:
        self._by_status[response.status] = self._by_status.get(response.status, 0) + 1
        return response

    def _rate_headers(self, headers: dict[str, str], now: float) -> None:
        limit = self.config.rpm
        if limit is None:
            return
        window = self._window
        headers["x-ratelimit-limit-requests"] = str(limit)
        headers["x-ratelimit-remaining-requests"] = str(max(0, limit - len(window)))
        headers["x-ratelimit-reset-requests"] = _duration_text(window[-1] + WINDOW - now if window else 0.0)

    async def _chat(self, request: web.Request) -> web.Response:
        self._received += 1
        cfg = self.config
        headers = {"x-request-id": "req_" + os.urandom(12).hex()}
        if cfg.require_key:
            auth = request.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or not auth[7:].strip():
                return self._finish(_error(
                    401, "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    "invalid_request_error", "invalid_api_key", headers))
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self._finish(_bad_request("We could not parse the JSON body of your request.", headers))
        problem = _validate(body)
        if problem:
            return self._finish(_bad_request(problem[0], headers, problem[1]))

        now = self.clock()
        if cfg.rpm is not None:
            window = self._window
            while window and window[0] <= now - WINDOW:
                window.popleft()
            if len(window) >= cfg.rpm:
                return self._finish(self._too_many(body["model"], headers, now))
        rng = self._rng
        if cfg.fault_429 and rng.random() < cfg.fault_429:
            return self._finish(self._too_many(body["model"], headers, now))
        if cfg.rpm is not None:
            self._window.append(now)
        self._rate_headers(headers, now)
        if cfg.fault_500 and rng.random() < cfg.fault_500:
            return self._finish(_error(500, "The server had an error while processing your request.",
                                       "server_error", None, headers))
        hang = cfg.fault_timeout and rng.random() < cfg.fault_timeout
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
        return self._finish(self._answer(body, headers))

    def _too_many(self, model: str, headers: dict[str, str], now: float) -> web.Response:
        self._rate_headers(headers, now)
        retry = self.config.retry_after
        headers["retry-after"] = _seconds_text(retry)
        headers["retry-after-ms"] = str(round(retry * 1000))
        limit = self.config.rpm
        used = f" Limit {limit}, Used {len(self._window)}, Requested 1." if limit is not None else ""
        message = (f"Rate limit reached for {model} on requests per min (RPM):{used} "
                   f"Please try again in {_seconds_text(retry)}s.")
        return _error(429, message, "requests", "rate_limit_exceeded", headers)

    def _answer(self, body: dict[str, Any], headers: dict[str, str]) -> web.Response:
        messages = body["messages"]
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        messages_json = _canonical(messages)
        content, finish = _reply(messages_json, body["model"], messages, body.get("temperature"), max_tokens,
                                 body.get("top_p"), body.get("stop"), body.get("seed"))
        digest = hashlib.sha256(messages_json.encode()).hexdigest()
        self._completed[digest] = self._completed.get(digest, 0) + 1
        prompt_tokens = 3 + sum((len(_text_of(m.get("content"))) + 3) // 4 + 3 for m in messages)
        completion_tokens = max(1, (len(content) + 3) // 4)
        if max_tokens is not None:
            completion_tokens = min(completion_tokens, max_tokens)
        result = {
            "id": "chatcmpl-" + os.urandom(12).hex(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": _FINGERPRINT,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None},
                         "logprobs": None, "finish_reason": finish}],
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
        return web.Response(body=_compact(result).encode(), headers={**_JSON_HEADERS, **headers})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self.stats())

    async def _config(self, request: web.Request) -> web.Response:
        try:
            self.configure(**_checked_updates(json.loads(await request.read())))
        except (ValueError, TypeError) as exc:  # bad JSON, unknown field or bad value
            return _bad_request(str(exc), {})
        return web.json_response(dataclasses.asdict(self.config))


def _validate(body: Any) -> tuple[str, str | None] | None:
    """The first problem with a request body as (message, param), or None."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object.", None
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "You must provide a model parameter.", "model"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "Missing required parameter: 'messages'.", "messages"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "Each message must be an object with a 'role'.", "messages"
    if body.get("n") not in (None, 1):
        return "The simulated server supports only n=1.", "n"
    if body.get("stream"):
        return "The simulated server does not support streaming.", "stream"
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"Invalid '{name}': expected an integer of at least 1.", name
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        return "Invalid 'stop': expected a string or a list of strings.", "stop"
    return None


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
                                     description="Simulated OpenAI-compatible LLM server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    for field in dataclasses.fields(SimConfig):
        flag = "--" + field.name.replace("_", "-")
        if _FIELD_KINDS[field.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            parser.add_argument(flag, type=_FIELD_KINDS[field.name], default=field.default)
    args = vars(parser.parse_args(argv))
    try:
        config = SimConfig(**{f.name: args[f.name] for f in dataclasses.fields(SimConfig)})
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    serve(args["host"], args["port"], config)


if __name__ == "__main__":
    sys.exit(main())
