"""The lean wire: JSON requests over HTTP/1.1 connections of our own, kept alive and reused, with h11
(python-hyper's HTTP/1.1 protocol library, which httpx's transport uses too) reading and writing the messages on
asyncio streams. It replaces the SDKs on the hot path: the OpenAI SDK's typed request transformation and httpx layer
cost about half the CPU of an uncached request against a fast server (issue 25's profile), google-genai's about
two thirds (issue 39). It carries the OpenAI format (``openai_chat.py``: api.openai.com, Azure, the hosted presets,
the simulated server, the user's own servers), Anthropic's Messages API (``anthropic_messages.py``, whose SDK costs
3 s of CPU to import) and Gemini's generateContent (``gemini.py``): each caller gives its own auth headers, default
base URL, TLS context and mapping of an error answer; without them a wire speaks as the OpenAI SDK does. The SDKs
stay for what only they speak here (the Batch APIs, Gemini's cachedContents) and where a proxy applies.

Why not aiohttp's client: importing it costs 0.1 s of every start (it builds two TLS contexts, reading the system's
certificates, at import), and its requests cost half as much CPU again as these (``bench/throughput.py``). Here a
TLS context is made only for an ``https`` base URL, when its first connection opens.

It behaves as the SDK path does: the same headers a server reads (``Authorization: Bearer``, JSON in and out), the
same timeout (it bounds connecting and each read), a non-2xx answer mapped by the one
mapping both paths share (:func:`runner.providers.openai_errors.status_error`), and the transport's failures
worded as the SDK path words them (a read that timed out; a connection that could not be made, with the reason).
HTTP(S)_PROXY is not read: a hosted API's provider keeps its SDK where a proxy applies (``lean_or_sdk.proxied``),
and the user's own or local servers are reached directly. Every answer is bounded in size, as received and as
decompressed, and in total time (``answer_bounds.py``), as the SDKs' clients are (``bounded_httpx.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
import zlib
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import h11

from runner.errors import TransientError

from .answer_bounds import (
    READABLE_CODINGS,
    AnswerBounds,
    Bound,
    Inflater,
    OutOfBounds,
    coding_refused,
    default_bounds,
    too_large,
    too_slow,
)
from .openai_errors import sdk_body, status_error

__all__ = ["Answer", "ErrorOf", "LeanWire", "parsed_or_text", "path_segment"]

#: seconds past its time a read's timer may fire before the delay is taken as this process's, not the server's
LATE_S = 1.0
#: the characters RFC 3986 allows in a path segment unescaped (as the SDK quotes a model id into a path)
_SEGMENT_SAFE = "!$&'()*+,;=:@-._~"
#: seconds an idle connection is kept for reuse (a server closes its idle ones after a while: vLLM's uvicorn after 5)
IDLE_SECONDS = 4.0
_READ = 1 << 16

#: a caller's mapping of a non-2xx answer (status, body as :func:`parsed_or_text` reads it, headers) to the
#: runner's error
ErrorOf = Callable[[int, Any, Mapping[str, str]], Exception]


def path_segment(value: str) -> str:
    return quote(value, safe=_SEGMENT_SAFE)


def parsed_or_text(content: bytes) -> Any:
    """An error answer's body as the SDK reads it: JSON when it parses, else its text stripped."""
    text = content.decode("utf-8", errors="replace").strip()
    try:
        return json.loads(text)
    except ValueError:
        return text


class Answer:
    """One HTTP answer: its status, headers (names in lower case) and body bytes."""

    __slots__ = ("content", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content


class _Closed(Exception):
    """A kept-alive connection the server had closed before answering (sent again on a new one)."""


class _Connection:
    __slots__ = ("idle_since", "protocol", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def close(self) -> None:
        self.writer.close()


class LeanWire:
    """JSON requests to one base URL over kept-alive connections; :meth:`aclose` at the end.

    ``headers`` (the auth header and any others every request carries), ``default_url`` (the base URL when
    ``base_url`` is None), ``tls`` (the TLS context of an https URL) and ``error_of`` (the error of a non-2xx answer)
    are the caller's API's; each left out is the OpenAI SDK's: ``Authorization: Bearer api_key``, OPENAI_BASE_URL or
    api.openai.com, the system's certificates, :func:`~runner.providers.openai_errors.status_error`. ``bounds``
    are how large and how long an answer may be (the providers' defaults when None)."""

    def __init__(self, base_url: str | None, api_key: str, timeout: float, *,
                 headers: Mapping[str, str] | None = None, default_url: str | None = None,
                 tls: Callable[[], ssl.SSLContext] = ssl.create_default_context,
                 error_of: ErrorOf | None = None, bounds: AnswerBounds | None = None) -> None:
        url = urlsplit(base_url or default_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        self.timeout = timeout
        self.bounds = bounds or default_bounds(timeout)
        host = url.netloc.rpartition("@")[2]
        #: the Host header every request carries (a signature that covers it signs this value)
        self.host_header = host
        auth = list(headers.items()) if headers is not None else [("Authorization", f"Bearer {api_key}")]
        self._headers = [("Host", host), *auth, ("Accept", "application/json"), ("Accept-Encoding", "gzip, deflate"),
                         ("User-Agent", "runner-lean-wire")]
        self._error_of = error_of
        self._tls = tls
        self._idle: list[_Connection] = []
        self._context: ssl.SSLContext | None = None
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True  # connections still answering are closed when they end
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def request(self, method: str, path: str, body: Any = None, *, where: str, key_variable: str | None = None,
                      passing: Collection[int] = (), headers: Mapping[str, str] | None = None,
                      content: bytes | None = None) -> Answer:
        """Send one request (``path`` after the base URL, e.g. ``/chat/completions``, with its query if any) and
        return its answer; a non-2xx answer whose status is not in ``passing`` raises the runner's error for it (the
        caller's ``error_of``, else the OpenAI mapping, which names ``key_variable`` in a refused key's message), a
        failed transport a :class:`TransientError`. ``headers``: this request's own besides the wire's (a token
        that changes, as Entra ID's). ``content``: a JSON body already written, sent as it is (in place of
        ``body``: a signature covers its bytes, as AWS's does)."""
        headers = [*self._headers, *headers.items()] if headers else list(self._headers)
        data = b""
        if content is not None:
            data = content
        elif body is not None:
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        if data:
            headers += [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        target = self.prefix + path
        message = h11.Request(method=method, target=target, headers=headers)
        # One send per call, on a kept-alive connection or a new one: a connection the server closed or reset,
        # before or during its answer, is a connection error the runner's retry policy counts as an attempt, never
        # a send of our own besides it (issue 41: a reset mid-answer was sent again outside the retry count)
        bound = self.bounds.of(target)
        whole = asyncio.timeout(bound.seconds)
        try:
            async with whole:
                status, answer_headers, content = await self._exchange(
                    self._reused(), message, data, bound)
        except OutOfBounds as exc:
            raise TransientError(f"{where}: {exc}", error_class=exc.error_class) from exc
        except TimeoutError as exc:
            if whole.expired():
                slow = too_slow(bound)
                raise TransientError(f"{where}: {slow}", error_class=slow.error_class) from exc
            raise TransientError(f"{where}: timed out after {self.timeout:g} s", error_class="timeout") from exc
        except (OSError, h11.ProtocolError, zlib.error, _Closed) as exc:
            raise TransientError(f"{where}: connection failed ({self._reason(exc)})",
                                 error_class="connection") from exc
        if 200 <= status < 300 or status in passing:
            return Answer(status, answer_headers, content)
        if self._error_of is not None:
            raise self._error_of(status, parsed_or_text(content), answer_headers)
        assert key_variable is not None, "the OpenAI mapping names the key's variable"
        raise status_error(where, key_variable, status, sdk_body(parsed_or_text(content)), answer_headers)

    async def _read(self, reader: asyncio.StreamReader) -> bytes:
        """The next bytes of the answer, within the timeout. A timer that fired more than :data:`LATE_S` late was
        held up by this process (stopped, swapped out, its loop blocked), not by the server, whose answer may have
        come meanwhile: the read gets another window rather than the request being sent, and paid for, again."""
        while True:
            began = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout):
                    return await reader.read(_READ)  # a cut read leaves what came in the reader's buffer
            except TimeoutError:
                if time.monotonic() - began < self.timeout + LATE_S:
                    raise

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, _ConnectFailed):  # as aiohttp words it, which the SDK path passes on
            return f"Cannot connect to host {self.host}:{self.port} ssl:default [{exc.reason}]"
        if isinstance(exc, _Closed | h11.ProtocolError):
            return "Server disconnected"
        return type(exc).__name__

    def _reused(self) -> _Connection | None:
        """The most recently used idle connection still open, or None."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < IDLE_SECONDS and not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        if self.tls and self._context is None:
            self._context = self._tls()
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self._context if self.tls else None, limit=_READ)
        except TimeoutError as exc:
            raise _ConnectFailed("connection timed out") from exc
        except OSError as exc:
            raise _ConnectFailed(exc.strerror or str(exc)) from exc
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection | None, message: h11.Request, data: bytes,
                        bound: Bound) -> tuple[int, dict[str, str], bytes]:
        """One request and its answer on ``connection`` (a new one when None). A reused connection that ends
        before any byte of the answer, or is reset, raises :class:`_Closed` (worded as the server disconnecting).
        An answer of more than ``bound.bytes``, as received or decompressed, raises :class:`OutOfBounds`."""
        reused = connection is not None
        if connection is None:
            connection = await self._connect()
        protocol, reader, writer = connection.protocol, connection.reader, connection.writer
        kept = False
        try:
            out = protocol.send(message)
            if data:
                out += protocol.send(h11.Data(data=data))
            writer.write(out + protocol.send(h11.EndOfMessage()))
            await writer.drain()
            status, headers, chunks, started, size = 0, {}, [], False, 0
            inflater: Inflater | None = None
            while True:
                event = protocol.next_event()
                if event is h11.NEED_DATA:
                    received = await self._read(reader)
                    if not received and reused and not started:
                        raise _Closed
                    started = True
                    size += len(received)
                    if size > bound.bytes:
                        raise too_large(bound)
                    protocol.receive_data(received)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
                    coding = headers.get("content-encoding", "identity").strip().lower()
                    if coding not in READABLE_CODINGS:
                        raise coding_refused(coding)
                    if coding != "identity":
                        inflater = Inflater(bound)
                elif isinstance(event, h11.Data):
                    chunks.append(event.data if inflater is None else inflater.feed(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise h11.RemoteProtocolError("the connection closed before the answer ended")
            if inflater is not None:
                chunks.append(inflater.end())
            content = b"".join(chunks)
            if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE and not self._closed:
                protocol.start_next_cycle()
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
                kept = True
            return status, headers, content
        except (ConnectionResetError, BrokenPipeError) as exc:
            if reused:
                raise _Closed from exc
            raise
        finally:
            if not kept:
                connection.close()


class _ConnectFailed(OSError):
    """No connection could be made (refused, unreachable, timed out)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
