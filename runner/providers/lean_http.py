"""The lean wire: Chat Completions (and the legacy Completions, the models lookups) as JSON over one aiohttp
session, without the OpenAI SDK's typed request transformation and its httpx layer, which cost about half the CPU
of an uncached request against a fast server (issue 25's profile). For the servers that speak the OpenAI format
and nothing more: the simulated server (``sim``), the user's own (``openai-compatible``) and the local presets
(``ollama``, ``vllm``); api.openai.com and Azure keep the SDK, whose error types and auth matter there.

It behaves as the SDK path does: the same headers a server reads (``Authorization: Bearer``, JSON in and out), the
same timeouts (the setting bounds connecting and each read, not the whole answer), a non-2xx answer mapped by the
one mapping both paths share (:func:`runner.providers.openai_errors.status_error`), and the transport's failures
worded as the SDK path words them (a read that timed out; a connection that failed, with aiohttp's reason)."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from runner.errors import TransientError

from .openai_errors import sdk_body, status_error

__all__ = ["Answer", "LeanWire", "parsed_or_text", "path_segment"]

#: the characters RFC 3986 allows in a path segment unescaped (as the SDK quotes a model id into a path)
_SEGMENT_SAFE = "!$&'()*+,;=:@-._~"


def path_segment(value: str) -> str:
    return quote(value, safe=_SEGMENT_SAFE)


class Answer:
    """One HTTP answer: its status, headers (case-insensitive) and body bytes."""

    __slots__ = ("status", "headers", "content")

    def __init__(self, status: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content


class LeanWire:
    """JSON requests to one OpenAI-compatible base URL; :meth:`open` inside the event loop, :meth:`aclose` after."""

    def __init__(self, base_url: str | None, api_key: str, timeout: float, *, connections: int = 1000) -> None:
        root = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        self.base_url = root.rstrip("/")
        self.timeout = timeout
        self.connections = connections
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                         "Accept": "application/json"}
        self.session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections),
                # as the SDK's aiohttp transport applies its timeout: to connecting and to each read
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_connect=self.timeout,
                                              sock_read=self.timeout),
                headers=self._headers, auto_decompress=True, raise_for_status=False,
            )

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def request(self, method: str, path: str, body: Any = None, *, where: str, key_variable: str,
                      passing: Collection[int] = ()) -> Answer:
        """Send one request (``path`` after the base URL, e.g. ``/chat/completions``) and return its answer; a
        non-2xx answer whose status is not in ``passing`` raises the runner's error for it, a failed transport
        a :class:`TransientError`."""
        assert self.session is not None, "open() was not called"
        data = None if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        try:
            async with self.session.request(method, self.base_url + path, data=data, allow_redirects=False) as reply:
                content = await reply.read()
                status, headers = reply.status, reply.headers
        except aiohttp.SocketTimeoutError as exc:
            raise TransientError(f"{where}: timed out after {self.timeout:g} s", error_class="timeout") from exc
        except aiohttp.ClientConnectionError as exc:  # refused, reset, a connect that timed out
            raise TransientError(f"{where}: connection failed ({exc})", error_class="connection") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                 error_class="connection") from exc
        if 200 <= status < 300 or status in passing:
            return Answer(status, headers, content)
        raise status_error(where, key_variable, status, sdk_body(parsed_or_text(content)), headers)


def parsed_or_text(content: bytes) -> Any:
    """An error answer's body as the SDK reads it: JSON when it parses, else its text stripped."""
    text = content.decode("utf-8", errors="replace").strip()
    try:
        return json.loads(text)
    except ValueError:
        return text
