"""What the providers that speak over the lean wire and keep an SDK client beside it share (``openai_chat.py``'s
OpenAI-format servers, ``anthropic_messages.py``'s Messages API): the SDK's client built by ``start`` where the
lean wire does not serve, else on first use (a Batch API, which only the SDK speaks here), and the variable the key
is read from, which a refused key's message names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from .lean_http import LeanWire

Client = TypeVar("Client")

__all__ = ["LeanOrSDK"]


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
