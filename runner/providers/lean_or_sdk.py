"""What the providers that speak over the lean wire and keep an SDK client beside it share (``openai_chat.py``'s
Chat Completions, ``azure_openai.py``'s, ``anthropic_messages.py``'s Messages API, ``gemini.py``'s generateContent):
the SDK's client built by ``start`` where the lean wire does not serve (:func:`proxied`), else on first use (a
Batch API, which only the SDKs speak here), and the variable the key is read from, which a refused key's message
names."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Generic, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .lean_http import LeanWire

Client = TypeVar("Client")

__all__ = ["LeanOrSDK", "proxied"]


def proxied(url: str) -> bool:
    """Whether the environment sends requests to ``url`` through a proxy, as the standard library reads it: one
    for its scheme (or ALL_PROXY) that NO_PROXY does not exempt its host from. The lean wire speaks to no proxy;
    the SDKs' httpx clients do (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY), so a provider keeps its SDK there."""
    if sys.platform not in ("darwin", "win32") and not any(name[-6:].lower() == "_proxy" for name in os.environ):
        return False  # elsewhere the standard library reads proxies from these variables alone: none is set
    import urllib.request  # about 10 ms, once per start

    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.netloc.rpartition("@")[2])


class LeanOrSDK(Generic[Client]):
    """Mixed in before :class:`~runner.providers.base.Provider`; the class defines ``_sdk_client``, which builds its
    SDK's client, and ``key_variables``."""

    _client: Client | None = None
    wire: LeanWire | None = None

    @property
    def client(self) -> Client | None:
        """The SDK's client: built by ``start`` where the lean wire does not serve, or on first use once started
        over the lean wire; a provider may set its own."""
        if self._client is None and self.wire is not None:
            self._client = self._sdk_client()
        return self._client

    @client.setter
    def client(self, value: Client | None) -> None:
        self._client = value

    @property
    def key_variable(self) -> str:
        return (self.key_variables() or [""])[0]
