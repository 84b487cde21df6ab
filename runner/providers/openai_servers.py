"""The servers other than api.openai.com that speak Chat Completions, through :class:`OpenAIChatProvider`'s wire
mapping (``runner/providers/openai_chat.py``): the user's own (``openai-compatible``: vLLM, llama.cpp, Ollama, one
client per entry of the job's ``endpoints:`` section) and the simulated server (``sim``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from runner.errors import ModelSetupError

from .base import Completion, Provider, ProviderSettings, register
from .openai_chat import OpenAIChatProvider
from .sim_tokens import count_prompt_tokens


@register
class OpenAICompatibleProvider(Provider):
    """The user's own OpenAI-compatible servers, each an entry of the job's ``endpoints:`` section."""

    name: ClassVar[str] = "openai-compatible"
    key_env_var: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 32
    adaptive: ClassVar[bool] = True
    supports_loglikelihood: ClassVar[bool] = True

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self.endpoints = endpoints or {}
        self.clients: dict[str, _CompatibleEndpoint] = {}

    @staticmethod
    def split(model: str) -> tuple[str, str]:
        """``"my-vllm/meta-llama/Llama-3-8B"`` -> ``("my-vllm", "meta-llama/Llama-3-8B")``."""
        endpoint, _, name = model.partition("/")
        return endpoint, name

    @classmethod
    def model_id(cls, model: str, endpoints: dict[str, ProviderSettings] | None = None,
                 settings: ProviderSettings | None = None) -> str:
        """The server and the model it serves, not the job's label for the server: pointing a label at
        another server must not return the first one's answers, and renaming a label keeps the cache."""
        label, served = cls.split(model)
        settings = (endpoints or {}).get(label)
        if settings is None or not settings.base_url:
            return model
        return f"{settings.base_url.rstrip('/')}/{served}"

    def _client(self, model: str) -> _CompatibleEndpoint:
        endpoint, _ = self.split(model)
        client = self.clients.get(endpoint)
        if client is None:
            settings = self.endpoints.get(endpoint)
            if settings is None:  # spec validation names the missing entry; this guards direct use
                raise ModelSetupError(f"no endpoint named {endpoint!r} in the job's endpoints: section")
            client = self.clients[endpoint] = _CompatibleEndpoint(settings, endpoint)
        return client

    def settings_for(self, model: str) -> ProviderSettings:
        return self._client(model).settings

    def check_key(self, model: str) -> None:
        self._client(model).check_key(model)

    def endpoint_key(self, model: str) -> str:
        client = self._client(model)
        return f"{self.name}:{client.base_url}:{client.key_variable}:{self.split(model)[1]}"

    async def start(self) -> None:
        for label in self.endpoints:  # every declared endpoint's client, once, before any request
            await self._client(label + "/").start()

    async def probe(self, model: str) -> None:
        await self._client(model).probe(self.split(model)[1])

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        return await self._client(model).execute(self.split(model)[1], messages, params)

    async def loglikelihood(self, model: str, pairs: list[tuple[str, str]]) -> Completion:
        return await self._client(model).loglikelihood(self.split(model)[1], pairs)

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


class _CompatibleEndpoint(OpenAIChatProvider):
    name: ClassVar[str] = "openai-compatible"
    key_env_var: ClassVar[str | None] = None
    price_id: ClassVar[str | None] = None
    supports_loglikelihood: ClassVar[bool] = True
    supports_batch: ClassVar[bool] = False  # vLLM, llama.cpp and Ollama have no Batch API in general
    prompt_cache_style: ClassVar[str | None] = None  # a server's own prefix cache needs no planning here
    max_tokens_field: ClassVar[str] = "max_tokens"
    local_server: ClassVar[bool] = True  # vLLM, llama.cpp and Ollama: the lean wire, proxy or not
    service_tiers: ClassVar[Mapping[str, str]] = {}  # a server of one's own sells no tier

    def __init__(self, settings: ProviderSettings, label: str) -> None:
        super().__init__(settings)
        self.label = label

    @property
    def where(self) -> str:
        return f"endpoint {self.label} ({self.base_url})"

    async def probe(self, model: str) -> None:
        """``GET /models`` (``models.list``): vLLM's and llama.cpp's servers have no per-model lookup, Ollama and
        LM Studio list theirs too. A model the list does not name is unknown, unless the server lists one model
        only: llama.cpp's servers answer any name with their one model (vLLM refuses it on the first request)."""
        named = f"{self.name}:{self.label}/{model}"
        answer = await self._lean("GET", "/models", passing=(404,))
        if answer.status == 404:
            raise ModelSetupError(f"{named}: {self.where} has no models endpoint (404): check the endpoint's "
                                  "base_url (vLLM, llama.cpp and Ollama serve the API under /v1)")
        listed = self._json_body(answer.content)
        entries = listed.get("data") if isinstance(listed, dict) else None
        served = [str(entry["id"]) for entry in entries or () if isinstance(entry, dict) and "id" in entry]
        if len(served) <= 1 or any(_same_model(model, entry) for entry in served):
            return
        listed = ", ".join(served[:10]) + (f" and {len(served) - 10} more" if len(served) > 10 else "")
        raise ModelSetupError(f"{named}: {self.where} does not serve {model} (it lists {listed}): name one of "
                              "those")


def _same_model(name: str, served: str) -> bool:
    """Whether the server's ``served`` id is ``name`` (Ollama lists ``llama3:latest`` for ``llama3``)."""
    return served == name or (":" not in name and served == f"{name}:latest")


@register
class SimProvider(OpenAIChatProvider):
    """The simulated server (``runner sim``): any model name, no real key needed, free unless priced."""

    name: ClassVar[str] = "sim"
    key_env_var: ClassVar[str | None] = "RUNNER_SIM_KEY"
    price_id: ClassVar[str | None] = None
    default_base_url: ClassVar[str | None] = "http://127.0.0.1:8765/v1"
    max_tokens_field: ClassVar[str] = "max_tokens"
    supports_loglikelihood: ClassVar[bool] = True
    scoring_max_tokens: ClassVar[int] = 0  # the simulated server generates nothing for 0
    local_server: ClassVar[bool] = True

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self.base_url = settings.base_url or os.environ.get("RUNNER_SIM_URL") or self.default_base_url

    def api_key(self) -> str:
        return super().api_key() or "sim-key"

    @classmethod
    def count_input_tokens(cls, model: str, messages: Iterable[Mapping[str, Any]]) -> int:
        """The simulated server's own rule, so exact."""
        return count_prompt_tokens([dict(message) for message in messages])

    @classmethod
    def tokens_exact(cls, model: str) -> bool:
        return True

    needs_encoding = False  # the simulated server's rule needs no tokenizer

    @classmethod
    def count_encoding(cls, model: str) -> str | None:
        return None
