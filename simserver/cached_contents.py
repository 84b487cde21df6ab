"""Gemini's explicit context caching as the simulated server speaks it: the ``cachedContents`` resource and what a
generateContent naming one reads from it.

    ``POST   /v1beta/cachedContents``       create: ``{"model": "models/X", "contents", "systemInstruction",
                                            "ttl": "300s" | "expireTime": RFC 3339, "displayName"}`` -> the
                                            CachedContent (``name``, ``model``, ``displayName``, ``createTime``,
                                            ``updateTime``, ``expireTime``, ``usageMetadata.totalTokenCount``; the
                                            contents are never echoed). Neither ttl nor expireTime: one hour.
    ``GET    /v1beta/cachedContents``       ``{"cachedContents": [...]}`` (``pageSize``, ``pageToken``).
    ``GET    /v1beta/cachedContents/{id}``  the CachedContent.
    ``PATCH  /v1beta/cachedContents/{id}``  a new ``ttl`` (from now) or ``expireTime`` (``updateMask``, when given,
                                            names which; the google-genai SDK sends none).
    ``DELETE /v1beta/cachedContents/{id}``  ``{}``.

The same on Vertex's paths, ``/{v1,v1beta1}/projects/{p}/locations/{l}/cachedContents[/{id}]``, with Google Cloud's
OAuth token (:mod:`simserver.vertex`), names ``projects/{p}/locations/{l}/cachedContents/{id}`` and models
``projects/{p}/locations/{l}/publishers/google/models/X``; a cache is seen only from its project and location.
Vertex's minimums and error wording are taken as the Gemini API's (no separate table was at hand).

Source: ai.google.dev/gemini-api/docs/caching ("Explicit caching") and the REST reference ai.google.dev/api/caching.
A cache's tokens N are counted by the server's own rule (:mod:`runner.providers.sim_tokens`), as a prompt made of
its system instruction and contents is; fewer than the model's minimum (4,096 for gemini-2.5-pro and gemini-3-pro*,
1,024 for the others, the docs' table; ``cache_min_tokens`` replaces it) is a 400 "Cached content is too small".
A name that does not exist, was deleted or has expired is a 403 "CachedContent not found (or permission denied)",
as users report the real API answers. Caches belong to the key that made them (to the project on Vertex's paths),
held by the key's SHA-256, never the key.

A generateContent with ``cachedContent`` (:func:`read_cache`, called by the Gemini parser) is answered as the whole
prompt: the cache's system instruction and contents, then the request's, so answers, scripted matches, prompt
tokens and completion digests are those of the same prompt sent whole; usage reports ``cachedContentTokenCount``
N. It is refused (400) when it also sets systemInstruction, tools or toolConfig, or names another model than the
cache's. The implicit prompt cache (:mod:`simserver.prompt_cache`) is not looked up for it, and reading a cache
never extends its life. Expiry runs on the server's clock (``SimServer.clock``); the RFC 3339 times shown are that
clock read against the wall clock at the first creation after a reset.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from . import strict_gemini
from .answers import count_prompt_tokens
from .gemini import GEMINI, PERMISSION_DENIED, GeminiFormat, gemini_messages
from .vertex import _bearer, _unauthenticated
from .wire import Ask, Invalid, response

__all__ = ["CACHED_CONTENTS", "CachedContents", "ExplicitRead", "add_routes", "minimum_tokens", "read_cache"]

DEFAULT_TTL = 3600.0
NOT_FOUND = "CachedContent not found (or permission denied)"
CONFLICT = ("CachedContent can not be used with GenerateContent request setting system_instruction, tools or "
            "tool_config.\n\nProposed fix: move those values to CachedContent from GenerateContent request.")
_DURATION = re.compile(r"(\d+)(\.\d{1,9})?s")


def minimum_tokens(model: str) -> int:
    """The fewest tokens a cached content of ``model`` (``models/X``, or Vertex's full name) may hold (the docs'
    table)."""
    name = model.rsplit("/", 1)[-1]
    return 4096 if name.startswith(("gemini-2.5-pro", "gemini-3-pro")) else 1024


@dataclass(slots=True)
class _Cache:
    name: str  #: ``cachedContents/{id}``, on Vertex ``projects/{p}/locations/{l}/cachedContents/{id}``
    owner: str  #: SHA-256 of the key that made it (on Vertex: of its project and location)
    model: str  #: ``models/X``, on Vertex ``projects/{p}/locations/{l}/publishers/google/models/X``
    display_name: str | None
    messages: list[dict[str, str]]
    tokens: int
    created: float  #: server clock
    updated: float
    expires: float


@dataclass(slots=True)
class ExplicitRead:
    """What a generateContent read from a cached content: its ``read`` tokens (``cachedContentTokenCount``); it
    writes nothing (the fields the other formats' usage reads are zero)."""

    name: str
    read: int
    written: int = 0
    written_1h: int = 0


class Refused(Exception):
    """A cachedContents call the API turns away: status, Google's status name, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _not_found() -> Refused:
    return Refused(403, PERMISSION_DENIED, NOT_FOUND)


def _invalid(message: str) -> Refused:
    return Refused(400, "INVALID_ARGUMENT", message)


def _parent(request: web.Request) -> str:
    """What a cache's and its model's names start with: nothing on the Gemini API, the project and location on
    Vertex."""
    info = request.match_info
    return f"projects/{info['project']}/locations/{info['location']}/" if "project" in info else ""


def _owner(request: web.Request) -> str:
    """Whose caches a request sees: its key's on the Gemini API, its project and location's on Vertex."""
    held = _parent(request) or GEMINI.key(request)
    return hashlib.sha256(held.encode()).hexdigest()


def _model_name(parent: str, model: str) -> str:
    return f"{parent}publishers/google/models/{model}" if parent else f"models/{model}"


class CachedContents:
    """The server's cached contents, on its clock, and their counters (``/sim/stats`` ``cached_contents``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.clear()

    def clear(self) -> None:
        self._caches: dict[str, _Cache] = {}
        self._anchor: tuple[float, float] | None = None  # (wall clock, server clock) at the first creation
        self._ended_token_seconds = 0.0  # of caches deleted or expired
        self._counts = {"created": 0, "deleted": 0, "reads": 0, "read_tokens": 0}

    def stats(self) -> dict[str, Any] | None:
        """The counters, or None before the first creation since a reset."""
        if not self._counts["created"]:
            return None
        now = self._sweep()
        stored = self._ended_token_seconds + sum(c.tokens * (now - c.created) for c in self._caches.values())
        return {**self._counts, "live": len(self._caches), "stored_token_seconds": round(stored, 3)}

    def _sweep(self) -> float:
        """Forget the caches that have expired (their storage ends at expiry); returns now."""
        now = self.clock()
        for cache in [c for c in self._caches.values() if c.expires <= now]:
            self._ended_token_seconds += cache.tokens * (cache.expires - cache.created)
            del self._caches[cache.name]
        return now

    # -- times ------------------------------------------------------------------------------------------

    def _rfc3339(self, at: float) -> str:
        wall, clock = self._anchor or (time.time(), self.clock())
        moment = datetime.fromtimestamp(wall + (at - clock), UTC)
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")

    def _expiry(self, body: dict[str, Any], now: float, where: str) -> float | None:
        """The clock time ``body``'s ``ttl`` or ``expireTime`` sets, or None when it has neither."""
        ttl, expire = body.get("ttl"), body.get("expireTime", body.get("expire_time"))
        if ttl is not None and expire is not None:
            raise _invalid(f"* {where}: set ttl or expire_time, not both\n")
        if ttl is not None:
            match = _DURATION.fullmatch(ttl) if isinstance(ttl, str) else None
            if match is None:
                raise _invalid(f"Invalid value at '{where}.ttl' (type.googleapis.com/google.protobuf.Duration), "
                               f"{ttl!r}: a duration in seconds ending in 's', such as \"300s\"")
            seconds = float(match.group(0)[:-1])
            if seconds <= 0:
                raise _invalid(f"* {where}.ttl: must be positive\n")
            return now + seconds
        if expire is not None:
            try:
                moment = datetime.fromisoformat(expire) if isinstance(expire, str) else None
            except ValueError:
                moment = None
            if moment is None or moment.tzinfo is None:
                raise _invalid(f"Invalid value at '{where}.expire_time' (type.googleapis.com/google.protobuf."
                               f"Timestamp), {expire!r}: an RFC 3339 time with its offset, such as "
                               "\"2026-01-01T00:00:00Z\"")
            wall, clock = self._anchor or (time.time(), now)
            at = clock + (moment.timestamp() - wall)
            if at <= now:
                raise _invalid(f"* {where}.expire_time: must be in the future\n")
            return at
        return None

    # -- the resource -----------------------------------------------------------------------------------

    def resource(self, cache: _Cache) -> dict[str, Any]:
        shown: dict[str, Any] = {"name": cache.name, "model": cache.model}
        if cache.display_name is not None:
            shown["displayName"] = cache.display_name
        shown.update({"createTime": self._rfc3339(cache.created), "updateTime": self._rfc3339(cache.updated),
                      "expireTime": self._rfc3339(cache.expires), "usageMetadata": {"totalTokenCount": cache.tokens}})
        return shown

    def create(self, owner: str, parent: str, body: Any, minimum: int | None) -> _Cache:
        if not isinstance(body, dict):
            raise _invalid("Invalid JSON payload received. Expected an object.")
        model = body.get("model")
        if not isinstance(model, str) or not re.fullmatch(re.escape(_model_name(parent, "")) + r"[^/]+", model):
            raise _invalid(f"* CachedContent.model: a model name of the form {_model_name(parent, '{model}')} is "
                           "required\n")
        display = body.get("displayName", body.get("display_name"))
        if display is not None and (not isinstance(display, str) or len(display) > 128):
            raise _invalid("* CachedContent.display_name: at most 128 characters\n")
        if body.get("tools") or body.get("toolConfig", body.get("tool_config")):
            raise _invalid("* CachedContent.tools: the simulated server caches only text contents\n")
        try:
            messages = gemini_messages(body, "CachedContent")
        except Invalid as exc:
            raise _invalid(exc.message) from exc
        tokens = count_prompt_tokens(messages)
        floor = minimum_tokens(model) if minimum is None else minimum
        if tokens < floor:
            raise _invalid(f"Cached content is too small. total_token_count={tokens}, min_total_token_count={floor}")
        now = self._sweep()
        if self._anchor is None:
            self._anchor = (time.time(), now)
        expires = self._expiry(body, now, "cached_content")
        cache = _Cache(f"{parent}cachedContents/{os.urandom(8).hex()}", owner, model, display, messages, tokens, now,
                       now, now + DEFAULT_TTL if expires is None else expires)
        self._caches[cache.name] = cache
        self._counts["created"] += 1
        return cache

    def find(self, owner: str, name: str) -> _Cache:
        """The live cache ``name`` (its full name) of ``owner``; Refused 403 if none."""
        self._sweep()
        cache = self._caches.get(name)
        if cache is None or cache.owner != owner:
            raise _not_found()
        return cache

    def update(self, owner: str, name: str, body: Any, mask: str | None) -> _Cache:
        cache = self.find(owner, name)
        if not isinstance(body, dict):
            raise _invalid("Invalid JSON payload received. Expected an object.")
        if mask is not None:
            fields = {f.strip() for f in mask.split(",") if f.strip()}
            if not fields or not fields <= {"ttl", "expireTime", "expire_time"}:
                raise _invalid(f"* update_mask: only ttl or expire_time can be updated, got {mask!r}\n")
            body = {k: v for k, v in body.items() if k in fields}
        now = self.clock()
        expires = self._expiry(body, now, "cached_content")
        if expires is None:
            raise _invalid("* cached_content: ttl or expire_time is required to update a cached content\n")
        cache.expires, cache.updated = expires, now
        return cache

    def delete(self, owner: str, name: str) -> None:
        cache = self.find(owner, name)
        now = self.clock()
        self._ended_token_seconds += cache.tokens * (now - cache.created)
        del self._caches[cache.name]
        self._counts["deleted"] += 1

    def listed(self, owner: str) -> list[_Cache]:
        self._sweep()
        return [c for c in self._caches.values() if c.owner == owner]

    # -- generateContent ---------------------------------------------------------------------------------

    def read(self, owner: str, parent: str, body: dict[str, Any], ask: Ask) -> None:
        """Put the named cache's messages before ``ask``'s and note the read; Invalid (a 400, or a 403 with
        ``param`` PERMISSION_DENIED) when the request cannot use it."""
        if any(body.get(k) is not None for k in ("systemInstruction", "system_instruction", "tools", "toolConfig",
                                                 "tool_config")):
            raise Invalid(CONFLICT)
        named = body.get("cachedContent", body.get("cached_content"))
        if not isinstance(named, str):
            raise Invalid("* GenerateContentRequest.cached_content: must be a string\n")
        try:
            cache = self.find(owner, named)
        except Refused as exc:
            raise Invalid(exc.message, PERMISSION_DENIED) from exc
        model = _model_name(parent, ask.model.removeprefix("models/"))
        if model != cache.model:
            raise Invalid(f"Model used by GenerateContent request ({model}) and CachedContent ({cache.model}) has "
                          "to be the same.")
        ask.messages[:0] = [dict(m) for m in cache.messages]
        ask.cache = ExplicitRead(cache.name, cache.tokens)

    def answered(self, read: ExplicitRead) -> None:
        """A request that read ``read`` was answered."""
        self._counts["reads"] += 1
        self._counts["read_tokens"] += read.read


#: the store, on the app, for the Gemini parser to reach
CACHED_CONTENTS = web.AppKey("cached_contents", CachedContents)


def read_cache(body: dict[str, Any], request: web.Request, ask: Ask) -> None:
    """The Gemini parser's step for a request naming a cached content (see :meth:`CachedContents.read`)."""
    app = getattr(request, "app", None)
    store = app.get(CACHED_CONTENTS) if app is not None else None
    if store is None:  # a batch line: no request of its own
        raise Invalid("* GenerateContentRequest.cached_content: the simulated server takes cached contents only in "
                      "online requests\n")
    store.read(_owner(request), _parent(request), body, ask)


def add_routes(server: Any, app: web.Application) -> None:
    """The cachedContents routes (see the module docstring) over ``server.cached_contents``, on the Gemini API's
    paths and on Vertex's."""
    store: CachedContents = server.cached_contents
    app[CACHED_CONTENTS] = store

    def refused_key(request: web.Request) -> web.Response | None:
        cfg = server.config
        if _parent(request):  # Vertex: a token the server issued
            return _unauthenticated({}) if cfg.require_key and not _bearer(request) else None
        key = GEMINI.key(request)
        if (cfg.require_key or cfg.api_key is not None) and not key:
            return GEMINI.missing_key({})
        if cfg.api_key is not None and key != cfg.api_key:
            return GEMINI.wrong_key({})
        return None

    async def handle(request: web.Request, action: Callable[[str, str], Any]) -> web.Response:
        if (refused := refused_key(request)) is not None:
            return refused
        try:
            return response(200, action(_owner(request), _parent(request)), {})
        except Refused as exc:
            return GeminiFormat.error(exc.status, exc.code, exc.message, {})

    async def body_of(request: web.Request) -> Any:
        try:
            return json.loads(await request.read() or b"{}")
        except ValueError:
            return None

    def named(request: web.Request) -> str:
        return f"{_parent(request)}cachedContents/{request.match_info['id']}"

    async def create(request: web.Request) -> web.Response:
        body = await body_of(request)
        if server.config.strict and isinstance(body, dict) and (
                refused := strict_gemini.cached_content_refusal(body)) is not None:
            return GEMINI.bad_request(refused.message, None, {})
        minimum = server.config.cache_min_tokens
        return await handle(request, lambda who, parent: store.resource(store.create(who, parent, body, minimum)))

    async def listed(request: web.Request) -> web.Response:
        def page(who: str, parent: str) -> dict[str, Any]:
            caches = store.listed(who)
            size, start = request.query.get("pageSize", ""), request.query.get("pageToken", "")
            size_n = int(size) if size.isdigit() and int(size) > 0 else 100
            start_n = int(start) if start.isdigit() else 0
            shown: dict[str, Any] = {"cachedContents": [store.resource(c) for c in caches[start_n:start_n + size_n]]}
            if start_n + size_n < len(caches):
                shown["nextPageToken"] = str(start_n + size_n)
            return shown

        return await handle(request, page)

    async def get(request: web.Request) -> web.Response:
        return await handle(request, lambda who, parent: store.resource(store.find(who, named(request))))

    async def patch(request: web.Request) -> web.Response:
        body = await body_of(request)
        mask = request.query.get("updateMask", request.query.get("update_mask"))
        return await handle(request, lambda who, parent: store.resource(store.update(who, named(request), body,
                                                                                     mask)))

    async def delete(request: web.Request) -> web.Response:
        def gone(who: str, parent: str) -> dict[str, Any]:
            store.delete(who, named(request))
            return {}

        return await handle(request, gone)

    for collection in ("/v1beta/cachedContents", "/{version:v1|v1beta1}/projects/{project}/locations/{location}/"
                       "cachedContents"):
        app.router.add_post(collection, create)
        app.router.add_get(collection, listed)
        app.router.add_get(collection + "/{id}", get)
        app.router.add_patch(collection + "/{id}", patch)
        app.router.add_delete(collection + "/{id}", delete)
