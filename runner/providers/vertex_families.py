"""The gemini and anthropic providers' mappings at Vertex AI's paths, which ``VertexProvider`` (vertex.py) composes,
one per model family (neither registered): over the lean wire with Google's access token (each request's headers
from :meth:`VertexProvider.token_headers`), or over the family's SDK client in Vertex mode, which the provider
builds (where the wire does not serve, and for what only the SDK does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from . import vertex_wire
from .anthropic_messages import AnthropicProvider
from .base import ProviderSettings
from .gemini import GeminiProvider
from .gemini_wire import request_body

if TYPE_CHECKING:
    import anthropic
    from google import genai

    from .vertex import VertexProvider

__all__ = ["VertexClaude", "VertexGemini"]


class VertexGemini(GeminiProvider):
    """The gemini provider's mapping at Vertex's paths, over the lean wire with Google's tokens or a Vertex-mode
    client (not registered)."""

    key_env_var: ClassVar[str | None] = "GOOGLE_APPLICATION_CREDENTIALS"

    def __init__(self, settings: ProviderSettings, vertex: VertexProvider) -> None:
        super().__init__(settings)
        self.vertex = vertex
        self._paths: dict[str, str] = {}

    def key_variables(self) -> list[str]:
        return ["GOOGLE_APPLICATION_CREDENTIALS"]

    def _sdk_client(self) -> genai.Client:
        return self.vertex._gemini_client()

    def generate_path(self, model: str) -> str:
        """Gemini's generateContent path under the client's project and location, once per model."""
        path = self._paths.get(model)
        if path is None:
            path = self._paths[model] = vertex_wire.gemini_path(model, self.vertex.project, self.vertex.location)
        return path

    def wire_body(self, messages: list[dict[str, str]], params: dict[str, Any], model: str) -> dict[str, Any]:
        """The gemini body, a cached content named in full (google-genai's ``t_cached_content_name`` in Vertex mode:
        the runner's stored prompts are, as the SDK's ``caches.create`` names them)."""
        body = request_body(messages, params, model)
        if "cachedContent" in body:
            body["cachedContent"] = vertex_wire.cached_content_name(body["cachedContent"], self.vertex.project,
                                                                    self.vertex.location)
        return body

    async def wire_headers(self) -> Mapping[str, str] | None:
        return await self.vertex.token_headers(quota_project=True)


class VertexClaude(AnthropicProvider):
    """The anthropic provider's mapping at Vertex's rawPredict, over the lean wire with Google's tokens or
    ``AsyncAnthropicVertex`` (not registered); API version 2023-06-01's rules, which ``vertex-2023-10-16`` tracks
    (sampling parameters taken where the model takes them)."""

    key_env_var: ClassVar[str | None] = "GOOGLE_APPLICATION_CREDENTIALS"

    def __init__(self, settings: ProviderSettings, vertex: VertexProvider) -> None:
        super().__init__(settings)
        self.vertex = vertex

    def _sdk_client(self) -> anthropic.AsyncAnthropicVertex:
        import anthropic

        return self.vertex._claude_sdk(anthropic)
