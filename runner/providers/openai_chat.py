"""Chat Completions through the official OpenAI SDK (async client, aiohttp transport, no SDK retries).

Three providers share this code:

    openai              api.openai.com, key from OPENAI_API_KEY
    openai-compatible   the user's own servers (vLLM, llama.cpp, Ollama), one per entry of the job's
                        ``endpoints:`` section, named in models as ``openai-compatible:ENDPOINT/MODEL``
    sim                 the simulated server (``runner sim``, ``simserver/cli.py``)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import AuthError, BadRequest, ModelSetupError, QuotaExceeded, RateLimited, TransientError

from .base import Completion, Provider, ProviderSettings, RateWindow, register

if TYPE_CHECKING:  # the SDK is imported where it is used: discovering the providers must stay light
    import openai

_PARAMS = ("temperature", "top_p", "stop", "seed", "response_format", "logprobs")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
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


def duration_seconds(text: str | None) -> float | None:
    """OpenAI's reset durations: ``"1s"``, ``"6m0s"``, ``"120ms"``, ``"1h2m3.5s"``."""
    if not text:
        return None
    parts = _DURATION.findall(text)
    if not parts:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def openai_rate(headers: Mapping[str, str]) -> dict[str, RateWindow] | None:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``; None when the server sends none."""
    windows = {}
    for kind in ("requests", "tokens"):
        limit = headers.get(f"x-ratelimit-limit-{kind}")
        remaining = headers.get(f"x-ratelimit-remaining-{kind}")
        if limit is None and remaining is None:
            continue
        windows[kind] = RateWindow(_int(limit), _int(remaining),
                                   duration_seconds(headers.get(f"x-ratelimit-reset-{kind}")))
    return windows or None


def _error_code(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    return str(inner.get("code") or inner.get("type") or "")


@register
class OpenAIChatProvider(Provider):
    name: ClassVar[str] = "openai"
    key_env_var: ClassVar[str | None] = "OPENAI_API_KEY"
    default_concurrency: ClassVar[int] = 64
    adaptive: ClassVar[bool] = True
    price_id: ClassVar[str | None] = "openai"
    default_base_url: ClassVar[str | None] = None
    #: the API's name for the output cap (``max_completion_tokens`` on api.openai.com; most compatible
    #: servers know only ``max_tokens``)
    max_tokens_field: ClassVar[str] = "max_completion_tokens"

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self.client: openai.AsyncOpenAI | None = None
        self.base_url = settings.base_url or self.default_base_url

    @property
    def key_variable(self) -> str:
        return (self.key_variables() or [""])[0]

    @classmethod
    def count_input_tokens(cls, model: str, messages: Iterable[Mapping[str, Any]]) -> int:
        """Exactly as the Chat Completions API counts plain text messages, with tiktoken (OpenAI's cookbook,
        "How to count tokens with tiktoken"; the framing constants are in ``tokens``)."""
        from . import tokens

        enc, _ = tokens.model_encoding(model)
        total = tokens.REPLY_PRIMING
        for message in messages:
            total += tokens.TOKENS_PER_MESSAGE + len(enc.encode_ordinary(str(message.get("role", ""))))
            total += len(enc.encode_ordinary(tokens.message_text(message.get("content"))))
            name = message.get("name")
            if name:
                total += tokens.TOKENS_PER_NAME + len(enc.encode_ordinary(str(name)))
        return total

    @classmethod
    def tokens_exact(cls, model: str) -> bool:
        """Exact for the models tiktoken knows; a newer model is counted with o200k_base and said not to be."""
        from . import tokens

        return tokens.model_encoding(model)[1]

    async def start(self) -> None:
        import openai

        self.client = openai.AsyncOpenAI(
            api_key=self.api_key() or "no-key",  # servers that take no key still need a non-empty string
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
        if params.get("max_tokens") is not None:
            kwargs[self.max_tokens_field] = params["max_tokens"]
        with self.map_errors():
            # The raw response: its JSON body is what the memo stores, parsing it directly costs less than
            # the SDK's pydantic models, and its headers feed the rate limiters.
            raw = await self.client.chat.completions.with_raw_response.create(
                model=model, messages=messages, **kwargs
            )
        response = raw.http_response
        try:
            body = json.loads(response.content)
            choice = body["choices"][0] if body.get("choices") else {}
            usage = body.get("usage") or {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        if choice.get("finish_reason") == "content_filter":
            raise BadRequest(f"{self.where}: the answer was withheld by the content filter",
                             error_class="content_filtered")
        details = usage.get("prompt_tokens_details") or {}
        headers = response.headers
        return Completion(
            text=(choice.get("message") or {}).get("content") or "",
            finish_reason=choice.get("finish_reason"),
            input_tokens=usage.get("prompt_tokens") or 0,
            output_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=details.get("cached_tokens") or 0,
            raw=body,
            rate=openai_rate(headers) if "x-ratelimit-limit-requests" in headers
            or "x-ratelimit-limit-tokens" in headers else None,
        )

    @property
    def where(self) -> str:
        return f"{self.name} at {self.base_url or 'api.openai.com'}"

    @contextlib.contextmanager
    def map_errors(self) -> Iterator[None]:
        """Translate the SDK's exceptions into the runner's classes. Messages are our own: a provider's
        401 text may quote part of the key."""
        import aiohttp
        import openai

        where = self.where
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
            if "Connect" in type(exc.__cause__).__name__:  # the aiohttp transport reports a refusal as this
                raise TransientError(f"{where}: connection failed ({exc.__cause__})", error_class="connection") from exc
            raise TransientError(f"{where}: timed out after {self.settings.timeout:g} s",
                                 error_class="timeout") from exc
        except openai.APIConnectionError as exc:
            raise TransientError(f"{where}: connection failed ({type(exc.__cause__ or exc).__name__})",
                                 error_class="connection") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status >= 500 or status in (408, 409):
                raise TransientError(f"{where}: server error {status}", status=status) from exc
            code = _error_code(exc)
            if code == "content_filter" or code == "content_policy_violation":
                raise BadRequest(f"{where}: the request was blocked by the content filter ({status})",
                                 status=status, error_class="content_filtered") from exc
            raise BadRequest(f"{where}: request rejected ({status} {code or 'bad request'})", status=status) from exc
        except openai.APIResponseValidationError as exc:
            raise TransientError(f"{where}: the response was not valid JSON",
                                 error_class="malformed_response") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                 error_class="connection") from exc


@register
class OpenAICompatibleProvider(Provider):
    """The user's own OpenAI-compatible servers, each an entry of the job's ``endpoints:`` section."""

    name: ClassVar[str] = "openai-compatible"
    key_env_var: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 32
    adaptive: ClassVar[bool] = True

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
    def model_id(cls, model: str, endpoints: dict[str, ProviderSettings] | None = None) -> str:
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

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        return await self._client(model).execute(self.split(model)[1], messages, params)

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


class _CompatibleEndpoint(OpenAIChatProvider):
    name: ClassVar[str] = "openai-compatible"
    key_env_var: ClassVar[str | None] = None
    price_id: ClassVar[str | None] = None
    max_tokens_field: ClassVar[str] = "max_tokens"

    def __init__(self, settings: ProviderSettings, label: str) -> None:
        super().__init__(settings)
        self.label = label

    @property
    def where(self) -> str:
        return f"endpoint {self.label} ({self.base_url})"


@register
class SimProvider(OpenAIChatProvider):
    """The simulated server (``runner sim``): any model name, no real key needed, free unless priced."""

    name: ClassVar[str] = "sim"
    key_env_var: ClassVar[str | None] = "RUNNER_SIM_KEY"
    price_id: ClassVar[str | None] = None
    default_base_url: ClassVar[str | None] = "http://127.0.0.1:8765/v1"
    max_tokens_field: ClassVar[str] = "max_tokens"

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self.base_url = settings.base_url or os.environ.get("RUNNER_SIM_URL") or self.default_base_url

    def api_key(self) -> str:
        return super().api_key() or "sim-key"

    @classmethod
    def count_input_tokens(cls, model: str, messages: Iterable[Mapping[str, Any]]) -> int:
        """The simulated server's own rule, so exact."""
        from simserver.answers import count_prompt_tokens

        return count_prompt_tokens([dict(message) for message in messages])

    @classmethod
    def tokens_exact(cls, model: str) -> bool:
        return True
