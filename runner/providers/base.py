"""The one small protocol every provider implements, and the registry that names them.

A provider turns the runner's request (messages + generation parameters) into one API call and the answer
back into a :class:`Completion`. It raises only the runner's own errors (``runner.errors``); each provider
translates its SDK's exceptions in one place.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from runner.errors import ModelSetupError


class ProviderSettings(BaseModel):
    """Per-provider settings from the job file's ``providers:`` section (all optional)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    #: the environment variable holding the key; the key itself never appears in a job file
    api_key_env: str | None = None
    rpm: int | None = Field(default=None, gt=0)
    tpm: int | None = Field(default=None, gt=0)
    #: input and output tokens per minute, for providers that limit them separately (Anthropic)
    itpm: int | None = Field(default=None, gt=0)
    otpm: int | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, gt=0)
    timeout: float = Field(default=60.0, gt=0)
    model_path: str | None = None
    n_ctx: int = Field(default=2048, gt=0)


@dataclass(slots=True, frozen=True)
class RateWindow:
    """One limit as a response's headers told it: its size, what is left, and seconds until it is full."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None


@dataclass(slots=True)
class Completion:
    """What came back from one request."""

    text: str
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    #: input tokens written to a prompt cache (Anthropic prices them apart)
    cache_write_tokens: int = 0
    #: the provider's response as JSON-able data, stored in the memo
    raw: dict[str, Any] = field(default_factory=dict)
    #: rate-limit windows from the response headers, by kind: requests, tokens, input_tokens, output_tokens
    rate: dict[str, RateWindow] | None = None


class Provider(ABC):
    """Base class: set the class attributes, implement :meth:`execute`."""

    #: the prefix used in job files: ``name:model``
    name: ClassVar[str]
    #: environment variable read for the key when the job does not name another
    key_env_var: ClassVar[str | None] = None
    #: in-flight requests per endpoint when the job sets no ``concurrency``
    default_concurrency: ClassVar[int] = 16
    #: whether an endpoint with no configured limits adapts its concurrency until the server's rate-limit
    #: headers say what they are (network providers); the bound is then ``concurrency`` or the default
    adaptive: ClassVar[bool] = False

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        self.settings = settings

    def key_variables(self) -> list[str]:
        """The environment variables this provider reads its key from, in order of preference."""
        variable = self.settings.api_key_env or self.key_env_var
        return [variable] if variable else []

    def api_key(self) -> str:
        """The key from the environment ('' when none is set); never stored, logged or shown."""
        return next((os.environ[v] for v in self.key_variables() if os.environ.get(v)), "")

    def check_key(self, model: str) -> None:
        """Raise ``ModelSetupError`` naming the variable to set when this provider needs a key it lacks."""
        variables = self.key_variables()
        if variables and not self.api_key():
            names = " or ".join(variables)
            raise ModelSetupError(f"{self.name}:{model} needs an API key: export {names} (no request was sent)")

    @classmethod
    def model_id(cls, model: str, endpoints: dict[str, ProviderSettings] | None = None) -> str:
        """The id that goes into the cache key (a provider may resolve aliases here)."""
        return model

    def settings_for(self, model: str) -> ProviderSettings:
        """The settings (limits, timeout) that apply to ``model``'s endpoint."""
        return self.settings

    def endpoint_key(self, model: str) -> str:
        """Requests sharing this string share rate limiters (provider + key + model): the key is named by its
        variable, never by its value."""
        return f"{self.name}:{self.settings.base_url or ''}:{','.join(self.key_variables())}:{model}"

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open clients or load weights; raise ``ModelSetupError`` with the fix when that fails."""

    @abstractmethod
    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        """Send one request and return its completion, or raise a ``runner.errors.ProviderError``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release clients and files."""


#: built-in provider modules, imported only when a job names their provider
BUILTIN: dict[str, str] = {
    "anthropic": "runner.providers.anthropic_messages:AnthropicProvider",
    "gemini": "runner.providers.gemini:GeminiProvider",
    "local": "runner.providers.local:LocalProvider",
    "openai": "runner.providers.openai_chat:OpenAIChatProvider",
    "openai-compatible": "runner.providers.openai_chat:OpenAICompatibleProvider",
    "sim": "runner.providers.openai_chat:SimProvider",
}


def provider_names() -> list[str]:
    return sorted(BUILTIN)


def provider_class(name: str) -> type[Provider]:
    module_name, _, attr = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def split_model(spec: str) -> tuple[str, str]:
    """``"sim:gpt-4o"`` -> ``("sim", "gpt-4o")``."""
    provider, sep, model = spec.partition(":")
    if not sep or not provider or not model:
        raise ValueError(f"model {spec!r} must be written provider:model, e.g. local:smollm2")
    return provider, model
