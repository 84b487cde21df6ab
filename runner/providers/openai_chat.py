"""Chat Completions as plain JSON over the lean wire (``runner/providers/lean_http.py``), which spares the
official OpenAI SDK's request transformation (about half the CPU of a request against a fast server) and its
import; the SDK (async client, aiohttp transport, no SDK retries) where a hosted API is reached through a proxy or
with OPENAI_CUSTOM_HEADERS (:meth:`OpenAIChatProvider.sdk_needed`), and for the Batch API.

Three providers share this code:

    openai              api.openai.com, key from OPENAI_API_KEY (here)
    openai-compatible   the user's own servers (vLLM, llama.cpp, Ollama), one per entry of the job's
                        ``endpoints:`` section, named in models as ``openai-compatible:ENDPOINT/MODEL``
                        (``runner/providers/openai_servers.py``)
    sim                 the simulated server (``runner sim``, ``simserver/cli.py``; ``openai_servers.py``)

Log-likelihoods (``loglikelihood``, for ``openai-compatible`` and ``sim``) go through the legacy Completions
endpoint as evaluation harnesses use it: one request for all (context, continuation) pairs of a task, each
``context + continuation`` a prompt of the list, with ``echo=True, logprobs=1, temperature=0`` and the fewest
generated tokens the server allows (1: llama.cpp's servers read ``max_tokens=0`` as no limit; the simulated
server takes 0), so that the answer carries every prompt token's ``token_logprobs`` and ``text_offset``
(:func:`score_echoed` reads one). A server that takes one prompt per request (llama-cpp-python's asserts it, a
500) is asked again one pair per request, and from then on. api.openai.com no longer returns prompt logprobs
with ``echo``, so ``openai:`` says it cannot score. Caveat: llama-cpp-python's server (0.3.36) shifts echoed
prompt logprobs by one token for models without a BOS token (each token gets the distribution predicting the
next one); the runner cannot tell from the answer, so score with ``local:`` or a server that aligns them (vLLM).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import BadRequest, ModelSetupError, Refused, TransientError
from runner.lazy_re import lazy_compile

from .answer_bounds import bounds_of, surfaced
from .base import (
    CacheMarks,
    Completion,
    Provider,
    ProviderSettings,
    RateWindow,
    loglikelihood_completion,
    register,
)
from .echo_scores import score_echoed
from .lean_or_sdk import LeanOrSDK, proxied
from .openai_errors import error_code, said, status_error
from .tiers import OPENAI_WIRE, STANDARD, served
from .tls import shared_context
from .wire import quoted

if TYPE_CHECKING:  # the SDK is imported where it is used: discovering the providers must stay light
    import openai

    from .batching import Batches
    from .lean_http import LeanWire

_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "seed", "response_format",
           "logprobs", "prompt_cache_key")
#: an open model's thinking at the start of its answer, as reasoning models on vLLM, llama.cpp and Ollama write it
#: when the server does not split it out (DeepSeek-R1, Qwen3, gpt-oss chat templates)
_THINK = lazy_compile(r"\A\s*<think>(.*?)(?:</think>|\Z)\s*", re.DOTALL)


def split_thinking(text: str) -> tuple[str, str | None]:
    """(answer, thinking) of a text that may open with ``<think>…</think>``; an unclosed block is all thinking."""
    found = _THINK.match(text)
    if found is None:
        return text, None
    return text[found.end():], found.group(1).strip()
_DURATION = lazy_compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


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


@register
class OpenAIChatProvider(LeanOrSDK["openai.AsyncOpenAI"], Provider):
    name: ClassVar[str] = "openai"
    key_env_var: ClassVar[str | None] = "OPENAI_API_KEY"
    default_concurrency: ClassVar[int] = 64
    adaptive: ClassVar[bool] = True
    price_id: ClassVar[str | None] = "openai"
    #: OpenAI's Batch API (Files + /v1/batches); the simulated server speaks it too
    supports_batch: ClassVar[bool] = True
    #: prompts of 1,024 tokens or more are cached automatically; ``prompt_cache_key`` keeps the requests of one
    #: prefix on the machines that cached it (platform.openai.com/docs/guides/prompt-caching)
    prompt_cache_style: ClassVar[str | None] = "keyed"
    default_base_url: ClassVar[str | None] = None
    #: the API's name for the output cap (``max_completion_tokens`` on api.openai.com; most compatible
    #: servers know only ``max_tokens``)
    max_tokens_field: ClassVar[str] = "max_completion_tokens"
    #: the API's words for the service tiers it sells (runner/providers/tiers.py); empty: none but standard, which
    #: is then not named
    service_tiers: ClassVar[Mapping[str, str]] = OPENAI_WIRE
    #: ``max_tokens`` of a scoring request: the fewest generated tokens the server allows
    scoring_max_tokens: ClassVar[int] = 1
    #: statuses with which a server may refuse a list of prompts (llama-cpp-python: 500)
    _LIST_REFUSED: ClassVar[frozenset[int]] = frozenset({400, 413, 422, 500})
    #: requests go over the lean wire (``lean_http.py``: JSON over h11, no SDK) rather than the SDK; the SDK client is
    #: then built only when something asks for it (the Batch API, a test). False: the SDK always
    lean_wire: ClassVar[bool] = True
    #: a server of the user's own or on this machine (sim, openai-compatible, ollama, vllm): the lean wire even where
    #: a proxy is set, as before; a hosted API keeps the SDK where a proxy applies or OPENAI_CUSTOM_HEADERS is set
    #: (:meth:`sdk_needed`)
    local_server: ClassVar[bool] = False
    sdk_package: ClassVar[str | None] = "openai"

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self._client: openai.AsyncOpenAI | None = None
        self.wire: LeanWire | None = None
        self.base_url = settings.base_url or self.default_base_url
        #: set once the server refused a list of prompts and took them one by one
        self.one_prompt_per_request = False

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

        return tokens.model_encoding_name(model)[1]

    @classmethod
    def count_encoding(cls, model: str) -> str | None:
        from . import tokens

        return tokens.model_encoding_name(model)[0]

    def _sdk_client(self) -> openai.AsyncOpenAI:
        import openai

        from .bounded_httpx import bounded_client

        return openai.AsyncOpenAI(
            api_key=self.api_key() or "no-key",  # servers that take no key still need a non-empty string
            base_url=self.base_url,
            max_retries=0,  # the runner owns retries (ARCHITECTURE.md invariant 4)
            timeout=self.settings.timeout,
            http_client=bounded_client(openai.DefaultAioHttpClient, self.settings,
                                       timeout=self.settings.timeout,
                                       verify=shared_context()),
        )

    def sdk_needed(self) -> bool:
        """Whether this provider's requests go through the SDK rather than the lean wire: its class says so, or a
        hosted API is reached through a proxy (``lean_or_sdk.proxied``) or with the SDK's OPENAI_CUSTOM_HEADERS, which
        the lean wire does not read."""
        if not self.lean_wire:
            return True
        if self.local_server:
            return False
        url = self.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        return "OPENAI_CUSTOM_HEADERS" in os.environ or proxied(url)

    def wire_headers(self) -> dict[str, str]:
        """The headers every lean request carries, as the SDK's client sends them: the key as a bearer token, and the
        organization and project from OPENAI_ORG_ID and OPENAI_PROJECT_ID where set (api.openai.com's)."""
        headers = {"Authorization": f"Bearer {self.api_key() or 'no-key'}"}
        if not self.local_server:
            for variable, header in (("OPENAI_ORG_ID", "OpenAI-Organization"), ("OPENAI_PROJECT_ID", "OpenAI-Project")):
                if os.environ.get(variable):
                    headers[header] = os.environ[variable]
        return headers

    async def start(self) -> None:
        if self.sdk_needed():
            self.client = self._sdk_client()
            return
        from .lean_http import LeanWire

        self.wire = LeanWire(self.base_url, "", self.settings.timeout, headers=self.wire_headers(),
                             tls=shared_context, bounds=bounds_of(self.settings))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self.wire is not None:
            await self.wire.aclose()
            self.wire = None

    async def _lean(self, method: str, path: str, body: Any = None, passing: tuple[int, ...] = ()) -> Any:
        """One request over the lean wire, for :meth:`execute`, :meth:`_echo` and the probes."""
        assert self.wire is not None, "start() was not awaited"
        return await self.wire.request(method, path, body, where=self.where, key_variable=self.key_variable,
                                       passing=passing)

    async def probe(self, model: str) -> None:
        """``GET /models/{model}`` (the SDK's ``models.retrieve``), which OpenAI and the simulated server answer
        without charge: a 404 ``model_not_found`` is an unknown model, any other 404 a base URL without the API."""
        if self.wire is not None:
            from .lean_http import parsed_or_text, path_segment
            from .openai_errors import sdk_body

            answer = await self._lean("GET", "/models/" + path_segment(model), passing=(404,))
            if answer.status == 404:
                self._unknown_model(model, sdk_body(parsed_or_text(answer.content)))
            return
        import openai

        assert self.client is not None, "start() was not awaited"
        with self.map_errors():
            try:
                await self.client.models.retrieve(model)
            except openai.NotFoundError as exc:
                self._unknown_model(model, exc.body, exc)

    def _unknown_model(self, model: str, body: Any, cause: BaseException | None = None) -> None:
        """The setup error of a 404 from the model lookup (``body`` as the SDK keeps it)."""
        if error_code(body) == "model_not_found":
            raise ModelSetupError(f"{self.name}:{model} is not a model {self.where} knows "
                                  f"({said(body, 404)}): check the model id") from cause
        raise ModelSetupError(f"{self.name}:{model}: {self.where} has no models endpoint (404): check its "
                              "base_url (the API's root, e.g. ending in /v1)") from cause

    def chat_path(self, model: str) -> str:
        """The Chat Completions path after the base URL, as the SDK's client asks it of ``model``."""
        return "/chat/completions"

    def request_body(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        """The Chat Completions body of one request: what :meth:`execute` sends, and a batch line's body."""
        body: dict[str, Any] = {"model": model, "messages": messages}
        body.update({name: params[name] for name in _PARAMS if params.get(name) is not None})
        if params.get("max_tokens") is not None:
            body[self.max_tokens_field] = params["max_tokens"]
        # a thinking budget alone is the runner's allowance inside the cap (capabilities.shape): not sent
        effort = (params.get("reasoning") or {}).get("effort")
        if effort is not None:
            body["reasoning_effort"] = effort
        tier = params.get("service_tier")
        if tier in self.service_tiers:
            body["service_tier"] = self.service_tiers[tier]
        elif tier not in (None, STANDARD):  # runner validate refuses it first (runner/spec/tiers.py)
            raise BadRequest(f"{self.name}:{model} is not sold at the {tier} tier (not sent)")
        return body

    def mark_prompt_cache(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                          marks: CacheMarks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return messages, {**params, "prompt_cache_key": marks.group}

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        if self.wire is not None:
            answer = await self._lean("POST", self.chat_path(model), self.request_body(model, messages, params))
            return self.completion_of(self._json_body(answer.content), answer.headers)
        assert self.client is not None, "start() was not awaited"
        with self.map_errors():
            # The raw response: its JSON body is what the memo stores, parsing it directly costs less than
            # the SDK's pydantic models, and its headers feed the rate limiters.
            raw = await self.client.chat.completions.with_raw_response.create(
                **self.request_body(model, messages, params)
            )
        response = raw.http_response
        return self.completion_of(self._json_body(response.content), response.headers)

    def _json_body(self, content: bytes) -> Any:
        try:
            return json.loads(content)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc

    def completion_of(self, body: Any, headers: Mapping[str, str] | None = None) -> Completion:
        """A Chat Completions answer (its JSON body, online or a batch line's) as a :class:`Completion`;
        ``headers`` (online only) carry the rate-limit windows. A body without the ``choices`` list (required of a
        CreateChatCompletionResponse by OpenAI's published OpenAPI document) is malformed, not an empty answer."""
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
            raise TransientError(f"{self.where}: the response was not a chat completion (no choices list)",
                                 error_class="malformed_response")
        try:
            choice = body["choices"][0] if body.get("choices") else {}
            usage = body.get("usage") or {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        details = usage.get("prompt_tokens_details") or {}
        headers = headers or {}
        message = choice.get("message") or {}
        text, thinking = message.get("content") or "", None
        # servers that split an open model's thinking out name it reasoning_content (vLLM, DeepSeek) or reasoning
        for name in ("reasoning_content", "reasoning"):
            if isinstance(message.get(name), str) and message[name]:
                thinking = message[name]
                break
        if thinking is None:
            text, thinking = split_thinking(text)
        completion = Completion(
            text=text,
            finish_reason=choice.get("finish_reason"),
            input_tokens=usage.get("prompt_tokens") or 0,
            output_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=details.get("cached_tokens") or 0,
            raw=body,
            rate=openai_rate(headers) if "x-ratelimit-limit-requests" in headers
            or "x-ratelimit-limit-tokens" in headers else None,
            thinking=thinking,
            reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0,
            tier=served(body.get("service_tier"), self.service_tiers),
        )
        if message.get("refusal"):
            raise Refused(f"{self.where}: the model refused: {quoted(message['refusal'])}", billed=completion)
        if choice.get("finish_reason") == "content_filter":
            raise Refused(f"{self.where}: the answer was withheld by the content filter", billed=completion)
        return completion

    def batches(self) -> Batches:
        if not self.supports_batch:
            return super().batches()
        from .openai_batch import OpenAIBatches

        return OpenAIBatches(self)

    async def loglikelihood(self, model: str, pairs: list[tuple[str, str]]) -> Completion:
        if not self.supports_loglikelihood:
            raise BadRequest(f"{self.name}:{model} cannot score log-likelihoods (OpenAI's completions endpoint no "
                             "longer returns prompt logprobs with echo); use a local model, an openai-compatible "
                             "completions server, or the stage's prompt form")
        prompts = [context + continuation for context, continuation in pairs]
        if len(prompts) > 1 and not self.one_prompt_per_request:
            try:
                bodies = [await self._echo(model, prompts)]
            except (BadRequest, TransientError) as exc:
                if exc.status not in self._LIST_REFUSED:
                    raise
                bodies = [await self._echo(model, [prompt]) for prompt in prompts]
                self.one_prompt_per_request = True
        else:
            bodies = [await self._echo(model, [prompt]) for prompt in prompts]
        choices = [choice for body, _ in bodies for choice in sorted(body["choices"], key=lambda c: c.get("index", 0))]
        if len(choices) != len(pairs):
            raise TransientError(f"{self.where}: {len(choices)} choices came back for {len(pairs)} prompts",
                                 error_class="malformed_response")
        scores = []
        for index, ((context, _), prompt, choice) in enumerate(zip(pairs, prompts, choices, strict=True)):
            try:
                scores.append(score_echoed(choice.get("logprobs") or {}, prompt, len(context)))
            except (ValueError, TypeError, AttributeError) as exc:
                raise BadRequest(f"{self.where}: pair {index} cannot be scored from the server's echoed logprobs "
                                 f"({exc})") from exc
        input_tokens = sum((body.get("usage") or {}).get("prompt_tokens") or 0 for body, _ in bodies)
        raw = bodies[0][0] if len(bodies) == 1 else {"object": "list", "data": [body for body, _ in bodies]}
        completion = loglikelihood_completion(scores, input_tokens or sum(s.tokens for s in scores), raw)
        completion.rate = bodies[-1][1]
        return completion

    async def _echo(self, model: str, prompts: list[str]) -> tuple[dict[str, Any], dict[str, RateWindow] | None]:
        """One legacy Completions request echoing ``prompts`` with their logprobs: (JSON body, rate windows)."""
        request = {"model": model, "prompt": prompts[0] if len(prompts) == 1 else prompts, "echo": True,
                   "logprobs": 1, "max_tokens": self.scoring_max_tokens, "temperature": 0}
        if self.wire is not None:
            response: Any = await self._lean("POST", "/completions", request)
        else:
            assert self.client is not None, "start() was not awaited"
            with self.map_errors():
                response = (await self.client.completions.with_raw_response.create(**request)).http_response
        try:
            body = json.loads(response.content)
            if not isinstance(body.get("choices"), list):
                raise TypeError("no choices")
        except (ValueError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        headers = response.headers
        rate = openai_rate(headers) if "x-ratelimit-limit-requests" in headers \
            or "x-ratelimit-limit-tokens" in headers else None
        return body, rate

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
        with surfaced(where):
            try:
                yield
            except openai.APITimeoutError as exc:
                if "Connect" in type(exc.__cause__).__name__:  # the aiohttp transport reports a refusal as this
                    raise TransientError(f"{where}: connection failed ({exc.__cause__})",
                                         error_class="connection") from exc
                raise TransientError(f"{where}: timed out after {self.settings.timeout:g} s",
                                     error_class="timeout") from exc
            except openai.APIConnectionError as exc:
                raise TransientError(f"{where}: connection failed ({type(exc.__cause__ or exc).__name__})",
                                     error_class="connection") from exc
            except openai.APIStatusError as exc:  # one mapping with the lean wire's (openai_errors.py)
                raise status_error(where, self.key_variable, exc.status_code, exc.body, exc.response.headers) from exc
            except openai.APIResponseValidationError as exc:
                raise TransientError(f"{where}: the response was not valid JSON",
                                     error_class="malformed_response") from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                     error_class="connection") from exc

