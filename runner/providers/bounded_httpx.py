"""The SDKs' HTTP clients with every answer bounded (``answer_bounds.py``): the openai and anthropic SDKs' clients,
and google-genai's, are httpx2 clients (httpx ones for openai before 3.0, which pyproject.toml allows), whose
transports read an answer as the server sends it, with no bound on its size or its total time.
:class:`BoundedTransport` wraps whichever transport a client made (direct, or through a proxy) and reads the answer
through the bounds; it decompresses gzip and deflate itself, so that the client never inflates an answer beyond
them. Imported only where an SDK client is built."""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from .answer_bounds import (
    READABLE_CODINGS,
    AnswerBounds,
    Bound,
    Inflater,
    bounds_of,
    coding_refused,
    too_large,
    too_slow,
)
from .base import ProviderSettings

__all__ = ["BoundedTransport", "bounded_client", "http_library", "http_limits"]

_RECODED = (b"content-encoding", b"content-length")


def http_library(client_class: type) -> ModuleType:
    """The HTTP library an SDK's client class is built on: httpx2, or httpx (the openai SDK before 3.0; its
    responses and streams must be that library's own: httpx asserts an answer's stream is its AsyncByteStream)."""
    for klass in client_class.__mro__:
        root = klass.__module__.partition(".")[0]
        if root in ("httpx2", "httpx"):
            return importlib.import_module(root)
    raise TypeError(f"{client_class.__qualname__} is neither an httpx2 nor an httpx client")


class BoundedTransport:
    """``inner``'s answers read within ``bounds``: past one, iterating the body raises
    :class:`~runner.providers.answer_bounds.OutOfBounds`, which the SDK wraps in its connection error. ``http``:
    the library of the client that holds it (:func:`http_library`), whose ``Response`` it answers with."""

    def __init__(self, inner: Any, bounds: AnswerBounds, http: ModuleType) -> None:
        self.inner = inner
        self.bounds = bounds
        self.http = http

    async def handle_async_request(self, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        bound = self.bounds.of(request.url.path)
        deadline = loop.time() + bound.seconds
        request.headers["Accept-Encoding"] = ", ".join(READABLE_CODINGS[1:])
        try:
            async with asyncio.timeout_at(deadline):
                response = await self.inner.handle_async_request(request)
        except TimeoutError as exc:
            if loop.time() < deadline:
                raise
            raise too_slow(bound) from exc
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if coding not in READABLE_CODINGS:
            await response.aclose()
            raise coding_refused(coding)
        inflater = Inflater(bound) if coding != "identity" else None
        headers = response.headers.raw
        if inflater is not None:  # the body handed on is decompressed here
            headers = [(name, value) for name, value in headers if name.lower() not in _RECODED]
        stream = _stream_class(self.http)(response.stream, bound, inflater, deadline)
        return self.http.Response(status_code=response.status_code, headers=headers, stream=stream,
                                  request=request, extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _BoundedStream:
    """An answer's body read within its bound (mixed with the client library's ``AsyncByteStream``:
    :func:`_stream_class`)."""

    def __init__(self, inner: Any, bound: Bound, inflater: Inflater | None, deadline: float) -> None:
        self.inner = inner
        self.bound = bound
        self.inflater = inflater
        self.deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self.inner)
        size = 0
        while True:
            try:
                async with asyncio.timeout_at(self.deadline):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except TimeoutError as exc:
                if asyncio.get_running_loop().time() < self.deadline:
                    raise
                raise too_slow(self.bound) from exc
            size += len(chunk)
            if size > self.bound.bytes:
                raise too_large(self.bound)
            yield chunk if self.inflater is None else self.inflater.feed(chunk)
        if self.inflater is not None:
            yield self.inflater.end()

    async def aclose(self) -> None:
        await self.inner.aclose()


@functools.cache
def _stream_class(http: ModuleType) -> type[_BoundedStream]:
    return type("BoundedStream", (_BoundedStream, http.AsyncByteStream), {})


class _Bounding:
    """Mixed into an SDK's client class: every transport it makes, direct or through a proxy, bounded."""

    answer_bounds: AnswerBounds
    http: ModuleType

    def _init_transport(self, *args: Any, **kwargs: Any) -> Any:
        return BoundedTransport(super()._init_transport(*args, **kwargs), self.answer_bounds,  # type: ignore[misc]
                                self.http)

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> Any:
        return BoundedTransport(super()._init_proxy_transport(*args, **kwargs),  # type: ignore[misc]
                                self.answer_bounds, self.http)


@functools.cache
def _bounded_class(base: type, bounds: AnswerBounds) -> type:
    return type(f"Bounded{base.__name__}", (_Bounding, base), {"answer_bounds": bounds, "http": http_library(base)})


def http_limits(settings: ProviderSettings, client: type) -> Any:
    """The connection pool of an SDK's client (``limits=`` of ``client``, in its own library), as large as the
    requests the engine lets go to one endpoint at once (``settings.pool_size``, which the engine sets when it
    builds the providers): the SDKs' default of 1,000 would queue the rest inside the SDK, unseen by the runner."""
    size = settings.pool_size
    return http_library(client).Limits(max_connections=size, max_keepalive_connections=size)


def bounded_client(base: type, settings: ProviderSettings, **kwargs: Any) -> Any:
    """An instance of ``base`` (``openai.DefaultAioHttpClient``, ``anthropic.DefaultAioHttpClient``,
    ``httpx2.AsyncClient``) made with ``kwargs``, its answers read within the bounds of ``settings`` and its
    connection pool sized by them (:func:`http_limits`)."""
    return _bounded_class(base, bounds_of(settings))(limits=http_limits(settings, base), **kwargs)
