"""Anthropic's Messages API, online over the lean wire (``runner/providers/lean_http.py``) or, where a proxy
applies, through the official SDK (async client, aiohttp transport, no SDK retries).

Models are named ``anthropic:claude-3-5-haiku-20241022``; the key comes from ANTHROPIC_API_KEY (or the
variable named by ``providers: {anthropic: {api_key_env: ...}}``).

The lean wire, because importing the SDK costs about 3.3 s of CPU (3,600 modules), which every process running an
``anthropic:`` model paid before its first request. It sends what the SDK sent: ``POST {base}/v1/messages`` with
the body of :meth:`AnthropicProvider.request_of`, its sampling fields at the top level as the SDK's ``extra_body``
put them, and ``GET {base}/v1/models/{model}`` for the probe; ``x-api-key`` and the pinned ``anthropic-version``
headers; the base the job's ``base_url``, else ANTHROPIC_BASE_URL, else https://api.anthropic.com (no ``/v1``: the
SDK's convention). A non-2xx answer is mapped by one function on both paths (``anthropic_errors.status_error``).

The SDK where a proxy applies, because the lean wire speaks to no proxy and the SDK's client does (httpx reads
HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY). The rule (``lean_or_sdk.proxied``): the standard library's
``urllib.request.getproxies()`` names a proxy for the base URL's scheme (or ``all``) and
``urllib.request.proxy_bypass`` (NO_PROXY) does not exempt its host; then :meth:`AnthropicProvider.start` builds the
SDK client as before, else the lean wire. The Message Batches API (``anthropic_batch.py``) always uses the SDK
client, built on first use; Claude on Bedrock and on Vertex keep their own SDK clients (they share the mapping).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from runner.errors import ModelSetupError, ProviderError, Refused, TransientError

from . import capabilities
from .answer_bounds import bounds_of
from .anthropic_errors import error_words, status_error, transport_errors
from .base import CacheMarks, Completion, Provider, ProviderSettings, RateWindow, register
from .lean_or_sdk import LeanOrSDK, proxied
from .tls import shared_context
from .token_counts import messages_count_request, read_count, with_estimate_margin
from .wire import quoted, words

if TYPE_CHECKING:  # the SDK is imported where it is used: discovering the providers must stay light
    import anthropic

    from .batching import Batches
    from .lean_http import LeanWire

#: the Messages API requires an output cap; used when the job sets no max_tokens
DEFAULT_MAX_TOKENS = 1024
#: the API's root when neither the job nor ANTHROPIC_BASE_URL names one (the SDK's default)
DEFAULT_BASE_URL = "https://api.anthropic.com"
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


def split_system(messages: list[dict[str, Any]]) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """The Messages API takes the system prompt beside the conversation, not in it: its text, or its text blocks
    when a message is in blocks (a prompt-cache breakpoint, :func:`cache_blocks`)."""
    system = [m["content"] for m in messages if m.get("role") == "system"]
    rest = [{"role": m["role"], "content": m["content"]} for m in messages if m.get("role") != "system"]
    if not system:
        return None, rest
    if all(isinstance(content, str) for content in system):
        return "\n\n".join(system), rest
    blocks: list[dict[str, Any]] = []
    for content in system:
        if blocks:
            blocks.append({"type": "text", "text": "\n\n"})
        blocks.extend(content if isinstance(content, list) else [{"type": "text", "text": content}])
    return blocks, rest


def cache_blocks(messages: list[dict[str, Any]], marks: CacheMarks) -> list[dict[str, Any]]:
    """The messages with a ``cache_control`` breakpoint where each shared prefix of ``marks`` ends: a message cut
    by one becomes text blocks split there (the same text in all), the block ending at the cut marked; a cut at a
    message's start marks the end of the message before. Docs: docs.claude.com/en/docs/build-with-claude/
    prompt-caching (``cache_control`` on a text block caches the prompt up to and including it)."""
    control: dict[str, Any] = {"type": "ephemeral", "ttl": marks.ttl} if marks.ttl != "5m" else {"type": "ephemeral"}
    at: dict[int, list[int]] = {}
    for index, offset in marks.cuts:
        if offset > 0:
            at.setdefault(index, []).append(offset)
        elif index > 0:
            at.setdefault(index - 1, []).append(-1)  # the end of the message before
    out = []
    for index, message in enumerate(messages):
        cuts = at.get(index)
        content = message.get("content")
        if not cuts or not isinstance(content, str):
            out.append(message)
            continue
        ends = sorted({len(content) if cut < 0 else min(cut, len(content)) for cut in cuts})
        blocks: list[dict[str, Any]] = []
        start = 0
        for end in ends:
            if end > start:
                blocks.append({"type": "text", "text": content[start:end], "cache_control": control})
                start = end
        if start < len(content):
            blocks.append({"type": "text", "text": content[start:]})
        out.append({**message, "content": blocks})
    return out


def _thinking(caps: capabilities.ModelCaps | None, reasoning: Mapping[str, Any]
              ) -> tuple[dict[str, Any] | None, str | None]:
    """(the ``thinking`` field, the ``output_config.effort``) for the job's ``reasoning:`` on this model: the
    budget form ``{type: enabled, budget_tokens}`` where the model takes budgets and the job gives one (or the
    model takes no effort), else adaptive thinking with an effort (Claude 4.6 and later; 4.7 and later only that)."""
    effort, budget = reasoning.get("effort"), reasoning.get("budget_tokens")
    if effort == "none" or budget == 0:
        # adaptive-only models (no budget form: Opus 4.7+) refuse ``disabled``: thinking left out (Bedrock's page)
        return ({"type": "disabled"} if caps is not None and caps.reasoning != "always" and caps.budget is not None
                else None), None
    takes_budget = caps is None or caps.budget is not None
    takes_effort = caps is not None and bool(caps.efforts)
    if takes_budget and (budget is not None or not takes_effort):
        sent = capabilities.budget_for(caps, reasoning) if caps is not None else int(budget or 1024)
        return {"type": "enabled", "budget_tokens": sent}, None
    # adaptive thinking returns no thinking text unless asked for a summary
    return {"type": "adaptive", "display": "summarized"}, effort


@register
class AnthropicProvider(LeanOrSDK["anthropic.AsyncAnthropic"], Provider):
    name: ClassVar[str] = "anthropic"
    sdk_modules: ClassVar[tuple[str, ...]] = ("anthropic",)
    sdk_package: ClassVar[str | None] = "anthropic"
    extra: ClassVar[str | None] = "anthropic"
    key_env_var: ClassVar[str | None] = "ANTHROPIC_API_KEY"
    default_concurrency: ClassVar[int] = 32
    adaptive: ClassVar[bool] = True
    price_id: ClassVar[str | None] = "anthropic"
    supports_batch: ClassVar[bool] = True
    #: caches a prompt up to each ``cache_control`` breakpoint a request marks (:func:`cache_blocks`)
    prompt_cache_style: ClassVar[str | None] = "explicit"
    #: online requests go over the lean wire unless a proxy applies (the module's docstring); False: the SDK always
    lean_wire: ClassVar[bool] = True

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self._client: anthropic.AsyncAnthropic | None = None
        self.wire: LeanWire | None = None
        self.where = f"anthropic at {settings.base_url or 'api.anthropic.com'}"
        #: the API version sent, pinned (capabilities.ANTHROPIC_VERSIONS): never the SDK's default, which changes
        #: with SDK majors (anthropic 2.0 moved to 2026-10-21, which refuses every sampling parameter)
        self.api_version = settings.api_version or capabilities.ANTHROPIC_DEFAULT_VERSION

    def _sdk_client(self) -> anthropic.AsyncAnthropic:
        import anthropic

        from .bounded_httpx import bounded_client

        return anthropic.AsyncAnthropic(
            api_key=self.api_key(),
            base_url=self.settings.base_url,
            max_retries=0,  # the runner owns retries (ARCHITECTURE.md invariant 4)
            timeout=self.settings.timeout,
            http_client=bounded_client(anthropic.DefaultAioHttpClient, self.settings,
                                       timeout=self.settings.timeout,
                                       verify=shared_context()),
            default_headers={"anthropic-version": self.api_version},
        )

    async def start(self) -> None:
        default_url = os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL  # the SDK reads it too
        if not self.lean_wire or proxied(self.settings.base_url or default_url):
            self.client = self._sdk_client()
            return
        from .lean_http import LeanWire

        key = self.api_key()
        self.wire = LeanWire(self.settings.base_url, key, self.settings.timeout, default_url=default_url,
                             headers={"x-api-key": key, "anthropic-version": self.api_version},
                             tls=shared_context, error_of=self._status_error, bounds=bounds_of(self.settings))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self.wire is not None:
            await self.wire.aclose()
            self.wire = None

    def _status_error(self, status: int, body: Any, headers: Mapping[str, str]) -> ProviderError:
        return status_error(self.where, self.key_variable, status, body, headers)

    async def _lean(self, method: str, path: str, body: Any = None, passing: tuple[int, ...] = ()) -> Any:
        assert self.wire is not None, "start() was not awaited"
        return await self.wire.request(method, path, body, where=self.where, passing=passing)

    async def probe(self, model: str) -> None:
        """``GET /v1/models/{model}`` (the SDK's ``models.retrieve``, which takes ids and aliases), not charged: a
        404 is a model the key cannot use (https://docs.anthropic.com/en/api/models)."""
        if self.wire is not None:
            from .lean_http import parsed_or_text, path_segment

            answer = await self._lean("GET", "/v1/models/" + path_segment(model), passing=(404,))
            if answer.status == 404:
                self._unknown_model(model, parsed_or_text(answer.content))
            return
        import anthropic

        assert self.client is not None, "start() was not awaited"
        with self.map_errors():
            try:
                await self.client.models.retrieve(model)
            except anthropic.NotFoundError as exc:
                self._unknown_model(model, exc.body, exc)

    def _unknown_model(self, model: str, body: Any, cause: BaseException | None = None) -> NoReturn:
        kind, message = error_words(body)
        raise ModelSetupError(f"{self.name}:{model} is not a model {self.where} knows "
                              f"({words(404, kind, None, None, message)}): check the model id") from cause

    def request_of(self, messages: list[dict[str, str]], params: dict[str, Any],
                   model: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
        """The Messages API request of the runner's messages and parameters (shaped for ``model`` by
        ``capabilities.shape``), but the model: (the fields ``messages.create`` names, the sampling fields it no
        longer names, which API version 2023-06-01 takes for the models that do). Online the second go in
        ``extra_body``; a batch request's params hold both."""
        system, conversation = split_system(messages)
        kwargs: dict[str, Any] = {"messages": conversation,
                                  "max_tokens": params.get("max_tokens") or DEFAULT_MAX_TOKENS}
        if system is not None:
            kwargs["system"] = system
        if params.get("stop") is not None:
            kwargs["stop_sequences"] = params["stop"]
        output_config: dict[str, Any] = {}
        response_format = params.get("response_format") or {}
        if response_format.get("type") == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema") or {}
            output_config["format"] = {"type": "json_schema", "schema": schema}
        reasoning = params.get("reasoning")
        caps = capabilities.capabilities(self.name, model, self.api_version)
        if not reasoning and caps is not None and caps.reasoning == "always" and caps.efforts:
            # a model that always thinks adaptively omits its thinking text unless asked for a summary: ask, so
            # the result line keeps it (the depth stays the model's default)
            kwargs["thinking"] = {"type": "adaptive", "display": "summarized"}
        if reasoning:
            thinking, effort = _thinking(caps, reasoning)
            if thinking is not None:
                kwargs["thinking"] = thinking
            if effort is not None:
                output_config["effort"] = effort
        if output_config:
            kwargs["output_config"] = output_config
        # This SDK's create() no longer names temperature and top_p (API version 2026-10-21 refuses them), but
        # 2023-06-01 takes them for the models that do; capabilities.shape left them out where they are refused.
        sampling = {name: params[name] for name in ("temperature", "top_p") if params.get(name) is not None}
        # The Messages API has no seed, no logprobs and no presence or frequency penalty: shape refuses them (or
        # drops them) before this.
        return kwargs, sampling

    def mark_prompt_cache(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                          marks: CacheMarks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return cache_blocks(messages, marks), params

    def batches(self) -> Batches:
        from .anthropic_batch import AnthropicBatches

        return AnthropicBatches(self)

    def count_request(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        return messages_count_request(self, model, messages, params)

    def count_reserved(self, model: str, counted: int) -> int:
        return with_estimate_margin(counted)  # Anthropic's count is an estimate (runner/providers/token_counts.py)

    async def count_tokens(self, model: str, request: dict[str, Any]) -> int:
        """``POST /v1/messages/count_tokens`` (runner/providers/token_counts.py), on the path requests take."""
        if self.wire is not None:
            content = (await self._lean("POST", "/v1/messages/count_tokens", request)).content
        else:
            assert self.client is not None, "start() was not awaited"
            with self.map_errors():
                content = (await self.client.messages.with_raw_response.count_tokens(**request)).http_response.content
        return read_count(self._json_body(content), "input_tokens", self.where)

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        kwargs, sampling = self.request_of(messages, params, model)
        if self.wire is not None:  # the body the SDK sends: its extra_body's fields at the top level
            answer = await self._lean("POST", "/v1/messages", {"model": model, **kwargs, **sampling})
            return self.completion_of(self._json_body(answer.content), answer.headers)
        assert self.client is not None, "start() was not awaited"
        if sampling:
            kwargs["extra_body"] = sampling
        with self.map_errors():
            raw = await self.client.messages.with_raw_response.create(model=model, **kwargs)
        response = raw.http_response
        return self.completion_of(self._json_body(response.content), response.headers)

    def _json_body(self, content: bytes) -> Any:
        try:
            return json.loads(content)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc

    def completion_of(self, body: Any, headers: Mapping[str, str] | None = None) -> Completion:
        """A Message (its JSON body, online or a batch result's) as a :class:`Completion`; ``headers`` (online
        only) carry the rate-limit windows."""
        try:
            blocks = body["content"]
            usage = body.get("usage") or {}
            if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks) \
                    or not isinstance(usage, dict):
                raise TypeError("content is not a list of blocks, or usage is not an object")
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            # an omitted thinking block (display "omitted", the default on the newest models) has empty text
            thoughts = [b["thinking"] for b in blocks if b.get("type") == "thinking" and b.get("thinking")]
            thinking = "\n\n".join(thoughts + ["[redacted thinking]" for b in blocks
                                                if b.get("type") == "redacted_thinking"]) or None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        stop_reason = body.get("stop_reason")
        cache_read = usage.get("cache_read_input_tokens") or 0
        cache_write = usage.get("cache_creation_input_tokens") or 0
        completion = Completion(
            text=text,
            finish_reason=stop_reason,
            # Anthropic counts cached input apart; the runner's input_tokens is all input, as OpenAI's is.
            input_tokens=(usage.get("input_tokens") or 0) + cache_read + cache_write,
            output_tokens=usage.get("output_tokens") or 0,
            cached_tokens=cache_read,
            cache_write_tokens=cache_write,
            cache_write_1h_tokens=(usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0,
            raw=body,
            rate=anthropic_rate(headers) if headers is not None else None,
            thinking=thinking,
            reasoning_tokens=(usage.get("output_tokens_details") or {}).get("thinking_tokens") or 0,
        )
        if stop_reason == "refusal":
            details = body.get("stop_details") or {}
            detail = details.get("explanation") or (details.get("type") if details.get("type") != "refusal" else None)
            raise Refused(f"{self.where}: the model refused (stop_reason refusal"
                          + (f": {quoted(detail)})" if detail else ")"), billed=completion)
        return completion

    @contextlib.contextmanager
    def map_errors(self) -> Iterator[None]:
        """The SDK's exceptions as the runner's classes, with messages of our own (the SDK path, the Message
        Batches API, Claude on Vertex)."""
        import anthropic

        where = self.where
        try:
            with transport_errors(where, self.settings.timeout):
                yield
        except anthropic.APIStatusError as exc:  # one mapping with the lean wire's (status_error)
            raise status_error(where, self.key_variable, exc.status_code, exc.body, exc.response.headers) from exc

