"""Anthropic's Messages API through the official SDK (async client, aiohttp transport, no SDK retries).

Models are named ``anthropic:claude-3-5-haiku-20241022``; the key comes from ANTHROPIC_API_KEY (or the
variable named by ``providers: {anthropic: {api_key_env: ...}}``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import AuthError, BadRequest, QuotaExceeded, RateLimited, TransientError

from .base import Completion, Provider, ProviderSettings, RateWindow, register
from .openai_chat import retry_after_seconds

if TYPE_CHECKING:  # the SDK is imported where it is used: discovering the providers must stay light
    import anthropic

    from .batching import Batches

#: the Messages API requires an output cap; used when the job sets no max_tokens
DEFAULT_MAX_TOKENS = 1024
_RATE_KINDS = ("requests", "tokens", "input_tokens", "output_tokens")


def _reset_seconds(value: str | None) -> float | None:
    """Anthropic's resets are RFC 3339 times; the limiter wants seconds from now."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def anthropic_rate(headers: Mapping[str, str]) -> dict[str, RateWindow] | None:
    """``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}``."""
    windows = {}
    for kind in _RATE_KINDS:
        prefix = "anthropic-ratelimit-" + kind.replace("_", "-")
        limit, remaining = headers.get(prefix + "-limit"), headers.get(prefix + "-remaining")
        if limit is None and remaining is None:
            continue
        try:
            windows[kind] = RateWindow(int(limit) if limit else None, int(remaining) if remaining else None,
                                       _reset_seconds(headers.get(prefix + "-reset")))
        except ValueError:
            continue
    return windows or None


def split_system(messages: list[dict[str, str]]) -> tuple[str | None, list[dict[str, str]]]:
    """The Messages API takes the system prompt beside the conversation, not in it."""
    system = [m["content"] for m in messages if m.get("role") == "system"]
    rest = [{"role": m["role"], "content": m["content"]} for m in messages if m.get("role") != "system"]
    return ("\n\n".join(system) if system else None), rest


def _error_type(exc: anthropic.APIStatusError) -> tuple[str, str]:
    body = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error") if isinstance(body.get("error"), dict) else {}
    return str(inner.get("type") or ""), str(inner.get("message") or "")


@register
class AnthropicProvider(Provider):
    name: ClassVar[str] = "anthropic"
    key_env_var: ClassVar[str | None] = "ANTHROPIC_API_KEY"
    default_concurrency: ClassVar[int] = 32
    adaptive: ClassVar[bool] = True
    price_id: ClassVar[str | None] = "anthropic"
    supports_batch: ClassVar[bool] = True

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self.client: anthropic.AsyncAnthropic | None = None
        self.where = f"anthropic at {settings.base_url or 'api.anthropic.com'}"

    async def start(self) -> None:
        import anthropic

        self.client = anthropic.AsyncAnthropic(
            api_key=self.api_key(),
            base_url=self.settings.base_url,
            max_retries=0,  # the runner owns retries (DESIGN invariant 4)
            timeout=self.settings.timeout,
            http_client=anthropic.DefaultAioHttpClient(timeout=self.settings.timeout),
        )

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    @staticmethod
    def request_of(messages: list[dict[str, str]], params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The Messages API request of the runner's messages and parameters, but the model: (the fields
        ``messages.create`` names, the sampling fields it no longer names but the wire format takes). Online
        the second go in ``extra_body``; a batch request's params hold both."""
        system, conversation = split_system(messages)
        kwargs: dict[str, Any] = {"messages": conversation,
                                  "max_tokens": params.get("max_tokens") or DEFAULT_MAX_TOKENS}
        if system is not None:
            kwargs["system"] = system
        if params.get("stop") is not None:
            kwargs["stop_sequences"] = params["stop"]
        # This SDK's create() no longer names temperature and top_p (newer models reject them), but the wire
        # format still takes them for the models that do: they go in the body as they are.
        sampling = {name: params[name] for name in ("temperature", "top_p") if params.get(name) is not None}
        # The Messages API has no seed and no logprobs: they stay in the cache key but are not sent.
        return kwargs, sampling

    def batches(self) -> Batches:
        from .anthropic_batch import AnthropicBatches

        return AnthropicBatches(self)

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        assert self.client is not None, "start() was not awaited"
        kwargs, sampling = self.request_of(messages, params)
        if sampling:
            kwargs["extra_body"] = sampling
        with self.map_errors():
            raw = await self.client.messages.with_raw_response.create(model=model, **kwargs)
        response = raw.http_response
        try:
            body = json.loads(response.content)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        return self.completion_of(body, response.headers)

    def completion_of(self, body: Any, headers: Mapping[str, str] | None = None) -> Completion:
        """A Message (its JSON body, online or a batch result's) as a :class:`Completion`; ``headers`` (online
        only) carry the rate-limit windows."""
        try:
            blocks = body["content"]
            usage = body.get("usage") or {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        stop_reason = body.get("stop_reason")
        if stop_reason == "refusal":
            raise BadRequest(f"{self.where}: the model refused for safety reasons (stop_reason refusal)",
                             error_class="content_filtered")
        cache_read = usage.get("cache_read_input_tokens") or 0
        cache_write = usage.get("cache_creation_input_tokens") or 0
        return Completion(
            text="".join(b.get("text", "") for b in blocks if b.get("type") == "text"),
            finish_reason=stop_reason,
            # Anthropic counts cached input apart; the runner's input_tokens is all input, as OpenAI's is.
            input_tokens=(usage.get("input_tokens") or 0) + cache_read + cache_write,
            output_tokens=usage.get("output_tokens") or 0,
            cached_tokens=cache_read,
            cache_write_tokens=cache_write,
            raw=body,
            rate=anthropic_rate(headers) if headers is not None else None,
        )

    @contextlib.contextmanager
    def map_errors(self) -> Iterator[None]:
        """The SDK's exceptions as the runner's classes, with messages of our own."""
        import aiohttp
        import anthropic

        where = self.where
        try:
            yield
        except anthropic.RateLimitError as exc:
            raise RateLimited(f"{where}: rate limited (429)",
                              retry_after=retry_after_seconds(exc.response.headers)) from exc
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise AuthError(f"{where}: the key was refused ({exc.status_code}); check the variable "
                            f"{self.key_variables()[0]}", status=exc.status_code) from exc
        except anthropic.APITimeoutError as exc:
            raise TransientError(f"{where}: timed out after {self.settings.timeout:g} s",
                                 error_class="timeout") from exc
        except anthropic.APIConnectionError as exc:
            raise TransientError(f"{where}: connection failed ({type(exc.__cause__ or exc).__name__})",
                                 error_class="connection") from exc
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            kind, message = _error_type(exc)
            if status == 402 or kind == "billing_error" or "credit balance" in message.lower():
                raise QuotaExceeded(f"{where}: the account's credit is exhausted ({status}); add credit or "
                                    "change the key") from exc
            if status >= 500 or status in (408, 409):  # 529 is overloaded_error
                raise TransientError(f"{where}: server error {status} {kind}".rstrip(), status=status) from exc
            raise BadRequest(f"{where}: request rejected ({status} {kind or 'bad request'})", status=status) from exc
        except anthropic.APIResponseValidationError as exc:
            raise TransientError(f"{where}: the response was not valid JSON",
                                 error_class="malformed_response") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                 error_class="connection") from exc
