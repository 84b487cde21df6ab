"""What the three Batch APIs share: batches and their lines in memory, when a batch ends, and how a line is
answered. The wire formats live in :mod:`simserver.batch_openai`, :mod:`simserver.batch_anthropic` and
:mod:`simserver.batch_gemini`.

Time. A batch made with ``batch_delay`` = ``d`` seconds (the value when it was created; or its turnaround drawn
from ``batch_median`` and ``batch_p95``: :mod:`simserver.clock`) ends ``d`` seconds after its creation, by the
server's ``clock`` (scaled by ``time_scale``), at the first look after that (a retrieve, a list, a cancel, a
results download); ``d = 0`` means done at the first look. Its line ``i`` of ``n`` counts as done at
``d * (i + 1) / n``, which decides what a cancel (or a forced expiry) keeps: lines done by then are answered,
the others are canceled (expired). A batch still running ``batch_window`` seconds after its creation ends
expired, its lines done by then answered. Nothing runs in the background.

Lines. A line whose custom id hashes (SHA-256 of ``"expire\\0" + id``, as a fraction of 2**64) below
``batch_expire`` never completes: when its batch ends it is expired, and the batch ends expired. One whose
``"error\\0" + id`` hash is below ``batch_line_errors`` gets a simulated 500. So the same custom ids always
pick the same lines. Every other line is answered exactly as its online endpoint answers the same body
(:func:`simserver.respond.answer_body`, usage included, response script applied), except that the random
ids differ; a body the online endpoint would reject with a 400 is an errored line carrying that 400, strict
mode's refusals (:mod:`simserver.strict`) included: an Anthropic line is checked under the ``anthropic-version``
header of its batch-create request, a Gemini line as a v1beta request. Rate
limits and the ``fault_*`` knobs do not apply to batch lines; ``POST /sim/batches/{id}/expire`` (or
:meth:`BatchStore.expire`) ends a running batch as expired at once.

Stats. Once a batch exists, /sim/stats adds ``batches`` (created), ``batch_lines`` (their lines),
``batch_results`` (lines by outcome: succeeded, errored, expired, canceled) and ``batch_completed_by_digest``
(answered lines by message digest, like ``completed_by_digest`` for online answers). ``reset`` forgets all
batches, files and these counters. Batch HTTP calls are not counted in ``received`` or ``by_status``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import strict
from .answers import canonical, count_prompt_tokens
from .clock import batch_delay
from .openai import OPENAI
from .respond import answer_body
from .wire import Invalid, WireFormat

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["OUTCOMES", "Batch", "BatchStore", "Line", "LineError", "StoredFile", "key_error", "new_id",
           "page", "rfc3339"]

OUTCOMES = ("succeeded", "errored", "expired", "canceled")


def new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def rfc3339(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fraction(salt: str, custom_id: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{salt}\0{custom_id}".encode()).digest()[:8], "big") / 2.0**64


@dataclass(slots=True)
class LineError:
    """Why a line errored: 400 (the body was invalid) or 500 (``batch_line_errors``)."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None  #: OpenAI's error code (strict mode's refusals carry one)


@dataclass(slots=True)
class Line:
    custom_id: str
    body: Any  #: the request body, as the online endpoint takes it
    fmt: WireFormat
    model: str = ""  #: Gemini: the model its URL names
    metadata: Any = None  #: Gemini: the request's metadata, echoed with its response
    #: the batch-create request's headers a line is checked with (Anthropic: ``anthropic-version``)
    headers: dict[str, str] | None = None
    outcome: str | None = None  #: one of OUTCOMES once the batch ended
    asked: tuple[str, str] | None = None  #: once answered: the model asked and the messages' digest (the request log)
    answer: dict[str, Any] | None = None
    error: LineError | None = None


@dataclass(slots=True, eq=False)
class Batch:
    id: str
    provider: str
    lines: list[Line]
    created: float  #: wall-clock seconds
    start: float  #: the server clock at creation
    delay: float
    info: dict[str, Any] = field(default_factory=dict)  #: what the provider's wire format keeps
    end: str | None = None  #: "completed", "expired", "cancelled" or "failed" once ended
    ended_at: float | None = None
    cancel_at: float | None = None  #: wall-clock seconds a cancel was asked
    cancel_elapsed: float = 0.0  #: seconds after creation a cancel was asked
    on_end: Callable[[Batch], None] | None = None

    def count(self, outcome: str) -> int:
        return sum(1 for line in self.lines if line.outcome == outcome)


@dataclass(slots=True)
class StoredFile:
    """An OpenAI file: an uploaded batch input or a batch's output or error file."""

    id: str
    filename: str
    purpose: str
    data: bytes
    created: float


class _Request:
    """What a format's ``parse`` reads from a request besides the body: the model Gemini's URL names."""

    def __init__(self, model: str) -> None:
        self.match_info = {"model": model}


def _line_path(line: Line) -> str:
    """The online route a line's body stands for: Gemini's batch mode is v1beta; OpenAI's completions lines are
    not checked by :mod:`simserver.strict`, its chat lines are."""
    if line.fmt.name == "gemini":
        return f"/v1beta/models/{line.model}:generateContent"
    if line.fmt.name == "anthropic":
        return "/v1/messages"
    return "/v1/chat/completions" if line.fmt is OPENAI else "/v1/completions"


class BatchStore:
    """All batches and files of one server, kept in memory until ``clear``."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.clear()

    def clear(self) -> None:
        self.batches: dict[str, Batch] = {}
        self.files: dict[str, StoredFile] = {}
        self.created = 0
        self.lines = 0
        self.results = dict.fromkeys(OUTCOMES, 0)
        self.completed: dict[str, int] = {}

    def stats(self) -> dict[str, Any]:
        if not self.created:
            return {}
        return {"batches": self.created, "batch_lines": self.lines, "batch_results": dict(self.results),
                "batch_completed_by_digest": dict(self.completed)}

    def add(self, batch_id: str, provider: str, lines: list[Line], info: dict[str, Any] | None = None,
            on_end: Callable[[Batch], None] | None = None) -> Batch:
        batch = Batch(batch_id, provider, lines, time.time(), self.server.clock(),
                      batch_delay(self.server.config, self.created), info or {}, on_end=on_end)
        self.batches[batch_id] = batch
        self.created += 1
        self.lines += len(lines)
        self.server.log.batch(provider, batch_id, len(lines))
        return batch

    def add_file(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        stored = StoredFile(new_id("file-"), filename, purpose, data, time.time())
        self.files[stored.id] = stored
        return stored

    def get(self, batch_id: str, provider: str) -> Batch | None:
        """The batch, brought up to date, or None when there is none of that provider by that id."""
        batch = self.batches.get(batch_id)
        if batch is None or batch.provider != provider:
            return None
        self.advance(batch)
        return batch

    def listed(self, provider: str) -> list[Batch]:
        """The provider's batches, newest first, brought up to date."""
        batches = [b for b in self.batches.values() if b.provider == provider]
        for batch in batches:
            self.advance(batch)
        return batches[::-1]

    def elapsed(self, batch: Batch) -> float:
        return self.server.clock() - batch.start

    def advance(self, batch: Batch) -> None:
        """End the batch if its time has come or a cancel is pending."""
        if batch.end is not None:
            return
        if batch.cancel_at is not None:
            self._settle(batch, "canceled", batch.cancel_elapsed)
        elif self.elapsed(batch) >= batch.delay:
            self._settle(batch, None, 0.0)
        elif batch.delay > (window := self.server.config.batch_window) and self.elapsed(batch) >= window:
            self._settle(batch, "expired", window)  # the Batch APIs' window: what is done by then is answered

    def cancel(self, batch: Batch) -> None:
        """Ask to cancel a running batch: it ends, canceled, at the next look."""
        if batch.end is None and batch.cancel_at is None:
            batch.cancel_at = time.time()
            batch.cancel_elapsed = self.elapsed(batch)

    def expire(self, batch: Batch, at: float | None = None) -> None:
        """End a running batch now as expired: lines done by now (or by ``at`` seconds after its creation: a test's
        expiry that does not depend on when it ran) are answered, the others expire."""
        if batch.end is None:
            self._settle(batch, "expired", self.elapsed(batch) if at is None else at)

    def fail(self, batch: Batch) -> None:
        """End a batch whose input could not be used (OpenAI's ``failed``)."""
        batch.end, batch.ended_at = "failed", time.time()

    def _settle(self, batch: Batch, fate: str | None, elapsed: float) -> None:
        """End the batch: at its deadline (``fate`` None) every line is answered or expires; on a cancel or a
        forced expiry, lines done ``elapsed`` seconds in are answered and the others get ``fate``."""
        cfg = self.server.config
        n = len(batch.lines)
        for i, line in enumerate(batch.lines):
            doomed = bool(cfg.batch_expire) and _fraction("expire", line.custom_id) < cfg.batch_expire
            if fate is None and doomed:
                line.outcome = "expired"
            elif fate is None or (batch.delay * (i + 1) / n <= elapsed and not doomed):
                self._answer(line)
            else:
                line.outcome = fate
            self.results[line.outcome] += 1
            model, digest = line.asked or (line.model or None, None)
            self.server.log.line(batch.provider, batch.id, line.custom_id, model, digest, line.outcome)
        if fate == "canceled":
            batch.end = "cancelled"
        else:
            batch.end = "expired" if fate == "expired" or batch.count("expired") else "completed"
        batch.ended_at = time.time()
        if batch.on_end is not None:
            batch.on_end(batch)

    def _answer(self, line: Line) -> None:
        server, cfg = self.server, self.server.config
        line.outcome = "errored"
        if cfg.batch_line_errors and _fraction("error", line.custom_id) < cfg.batch_line_errors:
            line.error = LineError(500, "The server had an error while processing your request.")
            return
        try:
            ask = line.fmt.parse(line.body, _Request(line.model))  # type: ignore[arg-type]
        except Invalid as exc:
            line.error = LineError(400, exc.message, exc.param)
            return
        if cfg.strict and (refused := strict.refusal(line.fmt.name, line.body, model=ask.model,
                                                     headers=line.headers or {}, path=_line_path(line))) is not None:
            line.error = LineError(refused.status, refused.message, refused.param, refused.code)
            return
        entry = None
        if server.script is not None and (entry := server.script.match(ask.model, ask.messages)) is None:
            server._unmatched += 1
            if server.script.strict:
                line.error = LineError(400, "no scripted response matches this request")
                return
        messages_json = canonical(ask.messages)
        line.answer, text = answer_body(line.fmt, ask, entry, messages_json, count_prompt_tokens(ask.messages),
                                        False)
        line.outcome = "succeeded"
        digest = hashlib.sha256(messages_json.encode()).hexdigest()
        self.completed[digest] = self.completed.get(digest, 0) + 1
        line.asked = (ask.model, digest)
        if entry is not None and text is not None:
            entry.served += 1
            server._scripted += 1


def key_error(server: SimServer, fmt: WireFormat, request: web.Request) -> web.Response | None:
    """The format's missing- or wrong-key response, or None when the key passes (as on the online routes)."""
    cfg = server.config
    if cfg.require_key or cfg.api_key is not None:
        key = fmt.key(request)
        if not key:
            return fmt.missing_key(fmt.new_headers())
        if cfg.api_key is not None and key != cfg.api_key:
            return fmt.wrong_key(fmt.new_headers())
    return None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BatchRoutes:
    """What the three Batch APIs' route classes share: the server, its batch store, and the key check in front of
    every route. A subclass sets ``wire`` (its wire format) and adds its routes."""

    wire: WireFormat

    def __init__(self, server: SimServer) -> None:
        self.server = server

    @property
    def store(self) -> BatchStore:
        return self.server.batches

    def _keyed(self, handler: Handler) -> Handler:
        async def run(request: web.Request) -> web.StreamResponse:
            refused = key_error(self.server, self.wire, request)  # (a response is an empty mapping: falsy)
            return refused if refused is not None else await handler(request)
        return run


def page(items: Iterable[Any], ident: Callable[[Any], str], limit: Any, after: str | None = None,
         before: str | None = None) -> tuple[list[Any], bool]:
    """A page of ``items`` (newest first) after / before the one with that id: (items, has_more)."""
    items = list(items)
    ids = [ident(item) for item in items]
    if after and after in ids:
        items = items[ids.index(after) + 1:]
    elif before and before in ids:
        items = items[:ids.index(before)]
    try:
        size = max(1, min(int(limit), 1000)) if limit is not None else 20
    except ValueError:
        size = 20
    if before:
        return items[-size:], len(items) > size
    return items[:size], len(items) > size
