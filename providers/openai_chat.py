"""Chat Completions through the official OpenAI SDK (async client, aiohttp transport, no SDK retries).

``sim`` is this provider pointed at the simulated server (``providers/simserver.py``); the cloud and
OpenAI-compatible providers build on the same class.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import aiohttp
import openai

from runner.errors import AuthError, BadRequest, QuotaExceeded, RateLimited, TransientError

from .base import Completion, Provider, ProviderSettings

_PARAMS = ("temperature", "max_tokens", "top_p", "stop", "seed", "response_format", "logprobs")


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds); None when absent or a date."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            continue
    return None


def _error_code(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    return str(inner.get("code") or inner.get("type") or "")


class OpenAIChatProvider(Provider):
    name: ClassVar[str] = "openai-chat"
    key_env_var: ClassVar[str | None] = "OPENAI_API_KEY"
    default_concurrency: ClassVar[int] = 64
    default_base_url: ClassVar[str | None] = None

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__(settings)
        self.client: openai.AsyncOpenAI | None = None
        self.base_url = settings.base_url or self.default_base_url
        self.key_variable = settings.api_key_env or self.key_env_var or ""

    def api_key(self) -> str:
        return os.environ.get(self.key_variable, "")

    async def start(self) -> None:
        self.client = openai.AsyncOpenAI(
            api_key=self.api_key() or None,
            base_url=self.base_url,
            max_retries=0,  # the runner owns retries (DESIGN invariant 4)
            timeout=self.settings.timeout,
            http_client=openai.DefaultAioHttpClient(timeout=self.settings.timeout),
        )

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        assert self.client is not None, "start() was not awaited"
        kwargs = {name: params[name] for name in _PARAMS if params.get(name) is not None}
        with self.map_errors():
            # The raw response: its JSON body is what the memo stores, and parsing it directly costs less
            # than the SDK's pydantic models (the headers will feed the rate limiters).
            raw = await self.client.chat.completions.with_raw_response.create(
                model=model, messages=messages, **kwargs
            )
        try:
            body = json.loads(raw.http_response.content)
            choice = body["choices"][0] if body.get("choices") else {}
            usage = body.get("usage") or {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.name}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        details = usage.get("prompt_tokens_details") or {}
        return Completion(
            text=(choice.get("message") or {}).get("content") or "",
            finish_reason=choice.get("finish_reason"),
            input_tokens=usage.get("prompt_tokens") or 0,
            output_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=details.get("cached_tokens") or 0,
            raw=body,
        )

    @contextlib.contextmanager
    def map_errors(self) -> Iterator[None]:
        """Translate the SDK's exceptions into the runner's classes. Messages are our own: a provider's
        401 text may quote part of the key."""
        where = f"{self.name} at {self.base_url or 'the default endpoint'}"
        try:
            yield
        except openai.RateLimitError as exc:
            if _error_code(exc) == "insufficient_quota":
                raise QuotaExceeded(f"{where}: insufficient quota (429); add credit or change the key") from exc
            retry_after = retry_after_seconds(exc.response.headers)
            raise RateLimited(f"{where}: rate limited (429)", retry_after=retry_after) from exc
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise AuthError(
                f"{where}: the key was refused ({exc.status_code}); check the variable {self.key_variable}",
                status=exc.status_code,
            ) from exc
        except openai.APITimeoutError as exc:
            raise TransientError(f"{where}: timed out after {self.settings.timeout:g} s",
                                 error_class="timeout") from exc
        except openai.APIConnectionError as exc:
            raise TransientError(f"{where}: connection failed ({type(exc.__cause__ or exc).__name__})",
                                 error_class="connection") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status >= 500 or status in (408, 409):
                raise TransientError(f"{where}: server error {status}", status=status) from exc
            raise BadRequest(f"{where}: request rejected ({status} {_error_code(exc) or 'bad request'})",
                             status=status) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                 error_class="connection") from exc


class SimProvider(OpenAIChatProvider):
    """The simulated server (``runner sim``): any model name, no real key needed, free unless priced."""

    name: ClassVar[str] = "sim"
    key_env_var: ClassVar[str | None] = "RUNNER_SIM_KEY"
    default_base_url: ClassVar[str | None] = "http://127.0.0.1:8765/v1"

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__(settings)
        self.base_url = settings.base_url or os.environ.get("RUNNER_SIM_URL") or self.default_base_url

    def api_key(self) -> str:
        return super().api_key() or "sim-key"
