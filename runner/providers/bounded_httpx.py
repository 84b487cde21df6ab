"""The SDKs' HTTP clients with every answer bounded (``answer_bounds.py``): the openai and anthropic SDKs' clients,
and google-genai's, are httpx2 clients, whose transports read an answer as the server sends it, with no bound on its
size or its total time. :class:`BoundedTransport` wraps whichever transport a client made (direct, or through a
proxy) and reads the answer through the bounds; it decompresses gzip and deflate itself, so that httpx2 never
inflates an answer beyond them. Imported only where an SDK client is built."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from .answer_bounds import READABLE_CODINGS, AnswerBounds, Bound, Inflater, coding_refused, too_large, too_slow

__all__ = ["BoundedTransport", "bounded_client"]

_RECODED = (b"content-encoding", b"content-length")


class BoundedTransport(httpx2.AsyncBaseTransport):
    """``inner``'s answers read within ``bounds``: past one, iterating the body raises
    :class:`~runner.providers.answer_bounds.OutOfBounds`, which the SDK wraps in its connection error."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, bounds: AnswerBounds) -> None:
        self.inner = inner
        self.bounds = bounds

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
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
        stream = _BoundedStream(response.stream, bound, inflater, deadline)
        return httpx2.Response(status_code=response.status_code, headers=headers, stream=stream,
                               request=request, extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _BoundedStream(httpx2.AsyncByteStream):
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


class _Bounding:
    """Mixed into an httpx2 client class: every transport it makes, direct or through a proxy, bounded."""

    answer_bounds: AnswerBounds

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return BoundedTransport(super()._init_transport(*args, **kwargs), self.answer_bounds)  # type: ignore[misc]

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return BoundedTransport(super()._init_proxy_transport(*args, **kwargs),  # type: ignore[misc]
                                self.answer_bounds)


@functools.cache
def _bounded_class(base: type[httpx2.AsyncClient], bounds: AnswerBounds) -> type[httpx2.AsyncClient]:
    return type(f"Bounded{base.__name__}", (_Bounding, base), {"answer_bounds": bounds})


def bounded_client(base: type[httpx2.AsyncClient], bounds: AnswerBounds, **kwargs: Any) -> httpx2.AsyncClient:
    """An instance of ``base`` (``openai.DefaultAioHttpClient``, ``anthropic.DefaultAioHttpClient``,
    ``httpx2.AsyncClient``) made with ``kwargs``, whose answers are read within ``bounds``."""
    return _bounded_class(base, bounds)(**kwargs)
