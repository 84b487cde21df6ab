"""OpenAI-compatible services named by their service: ``openrouter:vendor/model``, ``together:...``, ``groq:...``,
``deepseek:...``, ``mistral:...``, ``fireworks:...``, ``ollama:...``, ``vllm:...``. Each is
:class:`OpenAIChatProvider`'s wire mapping with the service's documented base URL, key variable and genai-prices
id; ``providers: {NAME: {base_url: ...}}`` points one elsewhere (a proxy, another port), ``api_key_env`` reads
its key from another variable.

Their model ids differ from OpenAI's (``meta-llama/Llama-3.3-70B-Instruct-Turbo``), so OpenAI's tokenizer counts
their prompts as an estimate (``tokens_exact`` is False). The cache key holds the provider's name, so two services
serving one model id never share answers. None of them is offered a Batch API here: the services that have one
(Groq, Together, Mistral, Fireworks) each speak their own variant of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from .openai_chat import OpenAIChatProvider
from .tiers import GROQ_WIRE


class _Preset(OpenAIChatProvider):
    """An OpenAI-compatible service at a known address: only the class attributes differ."""

    supports_batch: ClassVar[bool] = False
    prompt_cache_style: ClassVar[str | None] = None  # what each service caches is its own (not planned)
    # every one of these services documents max_tokens; max_completion_tokens is api.openai.com's own
    max_tokens_field: ClassVar[str] = "max_tokens"
    #: no service tier but standard, unless a service's own documents say otherwise (Groq)
    service_tiers: ClassVar[Mapping[str, str]] = {}
    #: where the service documents its OpenAI-compatible endpoint (the base URL's source)
    documented_at: ClassVar[str]

    @classmethod
    def tokens_exact(cls, model: str) -> bool:
        return False

    @classmethod
    def capability_model(cls, model: str) -> tuple[str, str] | None:
        """The (table provider, model) whose rules in ``runner.providers.capabilities`` this service's model
        follows, or None when the table does not know it (the service then takes what it takes)."""
        return None

    @property
    def where(self) -> str:
        return f"{self.name} ({self.base_url})"


class OpenRouterProvider(_Preset):
    name: ClassVar[str] = "openrouter"
    key_env_var: ClassVar[str | None] = "OPENROUTER_API_KEY"
    price_id: ClassVar[str | None] = "openrouter"
    default_base_url: ClassVar[str | None] = "https://openrouter.ai/api/v1"
    documented_at: ClassVar[str] = "https://openrouter.ai/docs/quickstart"

    @classmethod
    def capability_model(cls, model: str) -> tuple[str, str] | None:
        """``openai/gpt-4o`` is OpenAI's gpt-4o, passed on with OpenAI's own parameter names."""
        vendor, _, name = model.partition("/")
        return ("openai", name) if vendor == "openai" and name else None


class TogetherProvider(_Preset):
    name: ClassVar[str] = "together"
    key_env_var: ClassVar[str | None] = "TOGETHER_API_KEY"
    price_id: ClassVar[str | None] = "together"
    default_base_url: ClassVar[str | None] = "https://api.together.ai/v1"
    documented_at: ClassVar[str] = "https://docs.together.ai/docs/inference/openai-compatibility"


class GroqProvider(_Preset):
    name: ClassVar[str] = "groq"
    key_env_var: ClassVar[str | None] = "GROQ_API_KEY"
    price_id: ClassVar[str | None] = "groq"
    default_base_url: ClassVar[str | None] = "https://api.groq.com/openai/v1"
    documented_at: ClassVar[str] = "https://console.groq.com/docs/openai"
    #: on_demand (standard) and flex, which Groq sheds with a 498 (runner/providers/openai_errors.py)
    service_tiers: ClassVar[Mapping[str, str]] = GROQ_WIRE


class DeepSeekProvider(_Preset):
    name: ClassVar[str] = "deepseek"
    key_env_var: ClassVar[str | None] = "DEEPSEEK_API_KEY"
    price_id: ClassVar[str | None] = "deepseek"
    default_base_url: ClassVar[str | None] = "https://api.deepseek.com"
    documented_at: ClassVar[str] = "https://api-docs.deepseek.com/"


class MistralProvider(_Preset):
    name: ClassVar[str] = "mistral"
    key_env_var: ClassVar[str | None] = "MISTRAL_API_KEY"
    price_id: ClassVar[str | None] = "mistral"
    default_base_url: ClassVar[str | None] = "https://api.mistral.ai/v1"
    documented_at: ClassVar[str] = "https://docs.mistral.ai/api/"


class FireworksProvider(_Preset):
    name: ClassVar[str] = "fireworks"
    key_env_var: ClassVar[str | None] = "FIREWORKS_API_KEY"
    price_id: ClassVar[str | None] = "fireworks"
    default_base_url: ClassVar[str | None] = "https://api.fireworks.ai/inference/v1"
    documented_at: ClassVar[str] = "https://docs.fireworks.ai/tools-sdks/openai-compatibility"


class OllamaProvider(_Preset):
    """A local Ollama server: no key, free unless the job prices its models."""

    name: ClassVar[str] = "ollama"
    key_env_var: ClassVar[str | None] = None
    price_id: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 4  # one machine's model; Ollama queues the rest (OLLAMA_NUM_PARALLEL)
    default_base_url: ClassVar[str | None] = "http://127.0.0.1:11434/v1"
    documented_at: ClassVar[str] = "https://docs.ollama.com/openai"
    local_server: ClassVar[bool] = True  # a local server: the lean wire, proxy or not (lean_http.py)


class VLLMProvider(_Preset):
    """A vLLM server (``vllm serve``): no key unless it was started with ``--api-key`` (then set ``api_key_env``),
    free unless the job prices its models."""

    name: ClassVar[str] = "vllm"
    key_env_var: ClassVar[str | None] = None
    price_id: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 32
    default_base_url: ClassVar[str | None] = "http://127.0.0.1:8000/v1"
    documented_at: ClassVar[str] = "https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html"
    local_server: ClassVar[bool] = True  # a local server: the lean wire, proxy or not (lean_http.py)


#: every preset by its name, for the providers' reference (scripts/gen_reference.py) and the tests
PRESETS: dict[str, type[_Preset]] = {cls.name: cls for cls in (
    OpenRouterProvider, TogetherProvider, GroqProvider, DeepSeekProvider, MistralProvider, FireworksProvider,
    OllamaProvider, VLLMProvider)}
