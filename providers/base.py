"""The one small protocol every provider implements, and the registry that names them.

A provider turns the runner's request (messages + generation parameters) into one API call and the answer
back into a :class:`Completion`. It raises only the runner's own errors (``runner.errors``); each provider
translates its SDK's exceptions in one place.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class ProviderSettings(BaseModel):
    """Per-provider settings from the job file's ``providers:`` section (all optional)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    #: the environment variable holding the key; the key itself never appears in a job file
    api_key_env: str | None = None
    rpm: int | None = Field(default=None, gt=0)
    tpm: int | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, gt=0)
    timeout: float = Field(default=60.0, gt=0)
    model_path: str | None = None
    n_ctx: int = Field(default=2048, gt=0)


@dataclass(slots=True)
class Completion:
    """What came back from one request."""

    text: str
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    #: the provider's response as JSON-able data, stored in the memo
    raw: dict[str, Any] = field(default_factory=dict)


class Provider(ABC):
    """Base class: set the class attributes, implement :meth:`execute`."""

    #: the prefix used in job files: ``name:model``
    name: ClassVar[str]
    #: environment variable read for the key when the job does not name another
    key_env_var: ClassVar[str | None] = None
    #: in-flight requests per endpoint when the job sets no ``concurrency``
    default_concurrency: ClassVar[int] = 16

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    @classmethod
    def model_id(cls, model: str) -> str:
        """The id that goes into the cache key (a provider may resolve aliases here)."""
        return model

    def endpoint_key(self, model: str) -> str:
        """Requests sharing this string share rate limiters (provider + key + model)."""
        return f"{self.name}:{self.settings.base_url or ''}:{model}"

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open clients or load weights; raise ``ModelSetupError`` with the fix when that fails."""

    @abstractmethod
    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        """Send one request and return its completion, or raise a ``runner.errors.ProviderError``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release clients and files."""


#: built-in provider modules, imported only when a job names their provider
BUILTIN: dict[str, str] = {
    "local": "providers.local:LocalProvider",
    "sim": "providers.openai_chat:SimProvider",
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
