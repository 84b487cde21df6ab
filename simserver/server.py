"""The simulated server: its routes, the key check and fault draw, the counters, and ways to run it.

Endpoints (``SimServer.url`` is the OpenAI base ending in ``/v1``; ``SimServer.root_url`` the bare origin
that the anthropic and google-genai SDKs take as ``base_url``)
    ``POST /v1/chat/completions``                    OpenAI Chat Completions; key ``Authorization: Bearer``.
    ``POST /v1/completions``                         OpenAI legacy Completions with ``echo`` and ``logprobs``
                                                     (:mod:`simserver.completions`); counted as ``openai``.
    ``POST /v1/messages``                            Anthropic Messages; key ``x-api-key`` (or ``Authorization:
                                                     Bearer``, which is what anthropic 2.x sends for ``api_key``).
    ``POST /v1beta/models/{model}:generateContent``  Gemini generateContent, also under ``/v1/``; key
                                                     ``x-goog-api-key`` or ``?key=``.
    Batch APIs: OpenAI Files and Batches (:mod:`simserver.batch_openai`), Anthropic Message Batches
    (:mod:`simserver.batch_anthropic`), Gemini batch mode (:mod:`simserver.batch_gemini`); shared state and the
    ``batch_*`` knobs in :mod:`simserver.batches`.
    ``/v1beta/cachedContents``  Gemini's explicit caches (:mod:`simserver.cached_contents`).
    ``GET  /sim/stats``   ``{"received", "by_status", "by_route", "completed_by_digest"}``, and with a response
                          script loaded ``"scripted"`` (answers whose text it gave) and ``"unmatched"``
                          (requests none of its entries matched); once a batch exists, the ``batch*`` counters;
                          once an explicit cache was made, ``cached_contents``; once a prompt's tokens were
                          counted, ``count_tokens``.
    Token counting: Anthropic's ``/v1/messages/count_tokens``, Gemini's ``:countTokens`` and the clouds' own
    (:mod:`simserver.count_tokens`), counting as the model routes bill.
    ``POST /sim/reset``   zeroes the counters, refills the rate-limit buckets, rewinds the script's entries and
                          forgets all batches and files.
    ``GET  /sim/in_flight``  ``{"in_flight": n}``: model requests being answered now (hanging, waiting out the
                          latency). A reset does not end them and they count when they end: one server reused
                          for another test waits for 0 first.
    ``GET  /sim/log?after=N``  ``{"on", "entries"}``: with ``log_requests`` on, each model request, batch and batch
                          line after entry N, with its outcome and whether it was billed (:mod:`simserver.request_log`);
                          a reset empties it.
    ``POST /sim/batches/{id}/expire``  ends a running batch (any provider's id) now as expired.
    ``POST /sim/config``  JSON object of :class:`SimConfig` fields to change at run time; ``"script"`` loads
                          that file (a 400 if it cannot be loaded), ``null`` drops the script.

Fault knobs (:class:`SimConfig`) are decided in this order, each drawing from a ``random.Random(seed)`` owned
by the server only when its fraction is non-zero (so adding a knob never shifts the others' dice):
    key check          missing / wrong key (``require_key``, ``api_key``); no draw.
    ``fault_401``      auth failure.
    (body validation)  400: what the format module cannot read, then (``strict``, on by default) what the real
                       API refuses, checked against its published definition (:mod:`simserver.strict`: OpenAI's
                       OpenAPI document, the anthropic SDK's request types and the version header, the Gemini
                       protos of v1 and v1beta, and the capability table's rules per model), with the real
                       status and error body. ``--lenient`` / ``strict: false`` leaves only the first.
    (response script)  the first matching entry is picked (:mod:`simserver.script`); with ``strict: true``
                       a request no entry matches is a 400 "no scripted response matches this request".
    ``fault_quota``    out of credit: OpenAI 429 ``insufficient_quota``, Anthropic 402 ``billing_error``, Gemini
                       429 with a per-day ``QuotaFailure``; the 429s carry ``retry_after`` like random 429s.
    rate limits        429 from the buckets; no draw.
    ``fault_429``      rate-limit 429 with ``retry-after`` = ``retry_after``. Requests past here are charged.
    (service tiers)    a tier refused (strict), flex shed (``flex_shed``), priority downgraded: :mod:`simserver.tiers`.
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
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import random
import signal
from collections.abc import Callable
from typing import Any, Self

from aiohttp import web

from . import azure, bedrock, cached_contents, count_tokens, strict, tiers, vertex
from . import models as model_lookups
from .answers import canonical, count_prompt_tokens, message_digest
from .anthropic import ANTHROPIC
from .batch_anthropic import AnthropicBatches
from .batch_gemini import GeminiBatches
from .batch_openai import OpenAIBatches
from .batches import BatchStore
from .buckets import DEFAULT_MAX_TOKENS, LIMITS, PER_MINUTE, Bucket, wait_ms, why_blocked
from .clock import ScaledClock
from .completions import COMPLETIONS
from .config import SimConfig, checked_updates
from .gemini import GEMINI
from .openai import OPENAI
from .prompt_cache import PromptCache
from .request_log import RequestLog
from .respond import answer_body
from .script import Script, load_script
from .wire import JSON_HEADERS, Ask, Invalid, WireFormat, compact

__all__ = ["SimServer", "serve", "start_server"]

#: modules adding routes of their own (``add_routes(server, app)``): the token-counting endpoints (first: Vertex's
#: ``{model}:rawPredict`` would take Claude's ``count-tokens:rawPredict``), the clouds' paths to the same formats,
#: and the model lookups a pre-flight check asks
EXTRA_ROUTES = (count_tokens, azure, bedrock, vertex, model_lookups, cached_contents, tiers)


class SimServer:
    """A running simulated server: ``url`` (OpenAI base, ends in ``/v1``), ``root_url``; ``stats()``,
    ``reset()``, ``configure()``. A ``config.script`` that cannot be loaded raises ScriptError (a ValueError)."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.script: Script | None = load_script(self.config.script) if self.config.script else None
        self.host = ""
        self.port = 0
        self._rng = random.Random(self.config.seed)
        self._buckets: dict[str, list[Bucket]] = {}  # per model, the configured limits' buckets
        self._closing = asyncio.Event()
        #: the rate limits' and batches' clock, scaled by ``time_scale`` (simserver.clock); tests may replace it
        self.clock: Callable[[], float] = ScaledClock(self.config.time_scale)
        self._runner: web.AppRunner | None = None
        #: model requests being answered now (a reset leaves them be: they may count after it)
        self.in_flight = 0
        self.batches = BatchStore(self)  #: the Batch APIs' batches and files (simserver.batches)
        #: the clouds' object stores, by service ("gcs", "s3"): (bucket, name) -> object; emptied by a reset
        self.stored_objects: dict[str, dict[Any, Any]] = {}
        #: provider prompt caching (simserver.prompt_cache), on the rate limits' clock
        self.prompt_cache = PromptCache(lambda: self.clock())
        #: Gemini's explicit caches (simserver.cached_contents), on the same clock
        self.cached_contents = cached_contents.CachedContents(lambda: self.clock())
        #: the token-counting endpoints' requests (simserver.count_tokens)
        self.counted = count_tokens.Counted()
        #: the service tiers asked, shed and served (simserver.tiers)
        self.tiers = tiers.TierDesk(self)
        #: what was answered and billed, request by request, while ``log_requests`` is on (simserver.request_log)
        self.log = RequestLog()
        self.log.on = self.config.log_requests
        self.reset()

    @property
    def root_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.root_url + "/v1"

    def stats(self) -> dict[str, Any]:
        stats = {"received": self._received, "by_status": {str(k): v for k, v in self._by_status.items()},
                 "by_route": dict(self._by_route), "completed_by_digest": dict(self._completed)}
        if self.script is not None:
            stats["scripted"], stats["unmatched"] = self._scripted, self._unmatched
        stats.update(self.batches.stats())
        if any(self.prompt_cache.stats.values()):
            stats["prompt_cache"] = dict(self.prompt_cache.stats)
        if (explicit := self.cached_contents.stats()) is not None:
            stats["cached_contents"] = explicit
        for name, part in (("count_tokens", self.counted), ("tiers", self.tiers)):
            if (figures := part.stats()) is not None:
                stats[name] = figures
        return stats

    def reset(self) -> None:
        self._received = 0
        self._by_status: dict[int, int] = {}
        self._by_route = {"openai": 0, "anthropic": 0, "gemini": 0}
        self._completed: dict[str, int] = {}
        self._scripted = self._unmatched = 0
        self._buckets.clear()
        self.batches.clear()
        self.prompt_cache.clear()
        self.cached_contents.clear()
        self.counted.clear()
        self.tiers.clear()
        self.log.clear()
        for held in self.stored_objects.values():
            held.clear()
        if self.script is not None:
            self.script.rewind()

    def configure(self, **changes: Any) -> SimConfig:
        """Change config fields at run time (validated); a new seed reseeds the fault RNG, a new limit
        starts full buckets, a new script is loaded (and a bad one leaves everything unchanged)."""
        updates = checked_updates(changes)
        script = self.script
        if "script" in updates:
            script = load_script(updates["script"]) if updates["script"] is not None else None
        self.config = dataclasses.replace(self.config, **updates)
        self.script = script
        self.log.on = self.config.log_requests
        if "seed" in changes:
            self._rng.seed(self.config.seed)
        if any(name in changes for name, _ in LIMITS):
            self._buckets.clear()
        if "time_scale" in changes and isinstance(self.clock, ScaledClock):
            self.clock.rescale(self.config.time_scale)
        return self.config

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Self:
        app = web.Application(client_max_size=200 * 1024 * 1024)  # OpenAI's batch input files go up to 200 MB
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1beta/models/{model}:generateContent", self._gemini)
        app.router.add_post("/v1/models/{model}:generateContent", self._gemini)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_post("/sim/reset", self._reset)
        app.router.add_get("/sim/in_flight", self._in_flight)
        app.router.add_get("/sim/log", self._log)
        app.router.add_post("/sim/config", self._config)
        app.router.add_post("/sim/batches/{batch_id}/expire", self._expire_batch)
        for batches in (OpenAIBatches(self), AnthropicBatches(self), GeminiBatches(self)):
            batches.add_routes(app)
        for routes in EXTRA_ROUTES:
            routes.add_routes(self, app)
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
        return await self._serve(request, OPENAI)

    async def _completions(self, request: web.Request) -> web.Response:
        return await self._serve(request, COMPLETIONS)

    async def _anthropic(self, request: web.Request) -> web.Response:
        return await self._serve(request, ANTHROPIC)

    async def _gemini(self, request: web.Request) -> web.Response:
        return await self._serve(request, GEMINI)

    def _finish(self, response: web.Response, fmt: WireFormat | None = None, ask: Ask | None = None,
                outcome: str = "refused") -> web.Response:
        self._by_status[response.status] = self._by_status.get(response.status, 0) + 1
        if self.log.on and fmt is not None:
            digest = message_digest(ask.messages) if ask is not None else None
            self.log.request(fmt.name, ask.model if ask is not None else None, digest, response.status, outcome)
        return response

    def _buckets_at(self, model: str, now: float) -> list[Bucket]:
        buckets = self._buckets.get(model)
        if buckets is None:
            cfg = self.config
            buckets = self._buckets[model] = [Bucket(kind, limit, now) for name, kind in LIMITS
                                              if (limit := getattr(cfg, name)) is not None]
        for bucket in buckets:
            bucket.refill(now)
        return buckets

    def _admit(self, fmt: WireFormat, ask: Ask, prompt_tokens: int, headers: dict[str, str],
               request: web.Request) -> web.Response | None:
        """The out-of-credit fault, the rate limits, the random 429, then a tier refused or shed: the response that
        turns the request away, or None once it is charged to the model's buckets (their headers in ``headers``)."""
        cfg, rng = self.config, self._rng
        buckets: list[Bucket] = []
        if cfg.rpm is not None or cfg.tpm is not None or cfg.itpm is not None or cfg.otpm is not None:
            buckets = self._buckets_at(ask.model, self.clock())
        if cfg.fault_quota and rng.random() < cfg.fault_quota:
            fmt.rate_headers(buckets, headers)
            return fmt.quota(ask.model, cfg.retry_after * cfg.time_scale, headers)
        output_tokens = ask.max_tokens or DEFAULT_MAX_TOKENS
        if buckets and (blocked := why_blocked(buckets, prompt_tokens, output_tokens)) is not None:
            fmt.rate_headers(buckets, headers)
            if blocked.wait == math.inf:
                b = blocked.bucket
                return fmt.bad_request(f"Request too large for {ask.model} on {PER_MINUTE[b.kind]}: Limit "
                                       f"{b.capacity}, Requested {blocked.cost}. The input or output tokens must "
                                       "be reduced.", None, headers)
            return fmt.limited(ask.model, blocked, wait_ms(blocked.wait) / 1000 * cfg.time_scale, headers)
        if cfg.fault_429 and rng.random() < cfg.fault_429:
            fmt.rate_headers(buckets, headers)
            return fmt.limited(ask.model, None, cfg.retry_after * cfg.time_scale, headers)
        if buckets:
            for bucket in buckets:
                bucket.level -= bucket.cost(prompt_tokens, output_tokens)
            fmt.rate_headers(buckets, headers)
        return self.tiers.turn_away(fmt, ask, request, headers, rng)

    async def answer(self, request: web.Request, fmt: WireFormat) -> web.Response:
        """Serve one model request in ``fmt``: what the routes of the other modules (the clouds' paths) call."""
        return await self._serve(request, fmt)

    async def _serve(self, request: web.Request, fmt: WireFormat) -> web.Response:
        self.in_flight += 1
        try:
            return await self._serve_one(request, fmt)
        finally:
            self.in_flight -= 1

    async def _serve_one(self, request: web.Request, fmt: WireFormat) -> web.Response:
        self._received += 1
        self._by_route[fmt.name] = self._by_route.get(fmt.name, 0) + 1
        cfg = self.config
        headers = fmt.new_headers()
        if cfg.require_key or cfg.api_key is not None:
            key = fmt.key(request)
            if not key:
                return self._finish(fmt.missing_key(headers), fmt)
            if cfg.api_key is not None and key != cfg.api_key:
                return self._finish(fmt.wrong_key(headers), fmt)
        rng = self._rng
        if cfg.fault_401 and rng.random() < cfg.fault_401:
            return self._finish(fmt.wrong_key(headers), fmt)
        try:
            body = json.loads(await request.read())
        except ValueError:
            return self._finish(fmt.bad_request("We could not parse the JSON body of your request.", None, headers),
                                fmt)
        try:
            ask = fmt.parse(body, request)
        except Invalid as exc:
            return self._finish(fmt.bad_request(exc.message, exc.param, headers), fmt)
        if cfg.strict and (refused := strict.refusal(fmt.name, body, model=ask.model, headers=request.headers,
                                                     path=request.path)) is not None:
            return self._finish(strict.render(fmt, refused, headers), fmt, ask)
        ask.tier = self.tiers.asked(fmt, body)
        entry = None
        if self.script is not None and (entry := self.script.match(ask.model, ask.messages)) is None:
            self._unmatched += 1
            if self.script.strict:
                return self._finish(fmt.bad_request("no scripted response matches this request", None, headers),
                                    fmt, ask)

        prompt_tokens = count_prompt_tokens(ask.messages)
        turned_away = self._admit(fmt, ask, prompt_tokens, headers, request)
        if turned_away is not None:
            return self._finish(turned_away, fmt, ask)
        rule = fmt.cache_rule if cfg.prompt_cache else None
        cache_scope = f"{rule}\0{fmt.cache_owner(request)}\0{ask.model}"
        if ask.cache is None:  # a request naming an explicit cache reads that alone (simserver.cached_contents)
            ask.cache = self.prompt_cache.look_up(rule, cache_scope, ask.messages, body, ask.model,
                                                  cfg.cache_min_tokens)
        if cfg.fault_500 and rng.random() < cfg.fault_500:
            return self._finish(fmt.server_error(headers), fmt, ask)
        if cfg.fault_503 and rng.random() < cfg.fault_503:
            return self._finish(fmt.overloaded(headers), fmt, ask)
        hang = cfg.fault_timeout and rng.random() < cfg.fault_timeout
        malformed = cfg.fault_malformed and rng.random() < cfg.fault_malformed
        filtered = cfg.fault_filter and rng.random() < cfg.fault_filter
        delay = (cfg.latency + self.tiers.delay(ask.tier)) * cfg.time_scale
        if hang:
            try:  # close() sets _closing, so shutting down never waits out a hang
                await asyncio.wait_for(self._closing.wait(), cfg.hang_seconds * cfg.time_scale)
            except TimeoutError:
                pass
            except asyncio.CancelledError:  # aiohttp with handler_cancellation=True: the client left
                self._finish(web.Response(status=499), fmt, ask, "hung")
                raise
        elif delay > 0:
            await asyncio.sleep(delay)
        if (hang or delay > 0) and (request.transport is None or request.transport.is_closing()):
            # The client gave up while we waited: nothing was delivered, so nothing counts as completed.
            return self._finish(web.Response(status=499), fmt, ask, "hung" if hang else "abandoned")

        messages_json = canonical(ask.messages)
        body, text = answer_body(fmt, ask, entry, messages_json, prompt_tokens, bool(filtered and not malformed),
                                 cfg.fault_refusal)
        self.tiers.stamp(fmt, body, headers, ask.tier)  # the answer names the tier that served it
        data = compact(body).encode()
        if malformed:
            data = data[:len(data) // 2]
        else:
            digest = hashlib.sha256(messages_json.encode()).hexdigest()
            self._completed[digest] = self._completed.get(digest, 0) + 1
            if isinstance(ask.cache, cached_contents.ExplicitRead):
                self.cached_contents.answered(ask.cache)
            else:
                self.prompt_cache.answered(cache_scope, ask.cache)
            if entry is not None and text is not None:  # delivered: the entry moves to its next text
                entry.served += 1
                self._scripted += 1
        outcome = "malformed" if malformed else "filtered" if filtered else "answered"
        return self._finish(web.Response(body=data, headers={**JSON_HEADERS, **headers}), fmt, ask, outcome)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self.stats())

    async def _in_flight(self, request: web.Request) -> web.Response:
        return web.json_response({"in_flight": self.in_flight})

    async def _log(self, request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            return OPENAI.bad_request("after must be an integer", "after", {})
        return web.json_response({"on": self.log.on, "entries": self.log.after(after)})

    def expire_batch(self, batch_id: str, at: float | None = None) -> bool:
        """End a running batch of any provider now as expired (its lines done by ``at`` seconds after its creation
        answered, when given); False when there is no such batch."""
        batch = self.batches.batches.get(batch_id.removeprefix("batches/"))
        if batch is None:
            return False
        self.batches.advance(batch)
        self.batches.expire(batch, at)
        return True

    async def _expire_batch(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        if not self.expire_batch(batch_id):
            return web.json_response({"error": f"no batch {batch_id}"}, status=404)
        batch = self.batches.batches[batch_id.removeprefix("batches/")]
        return web.json_response({"id": batch_id, "end": batch.end})

    async def _config(self, request: web.Request) -> web.Response:
        try:
            self.configure(**checked_updates(json.loads(await request.read())))
        except (ValueError, TypeError) as exc:  # bad JSON, unknown field or bad value
            return OPENAI.bad_request(str(exc), None, {})
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
