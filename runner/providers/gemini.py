"""Gemini's generateContent over the lean wire (``runner/providers/lean_http.py``: the JSON of
``runner/providers/gemini_wire.py``, the key as ``x-goog-api-key``), the ``google-genai`` SDK (the maintained
successor of the deprecated ``google-generativeai``) kept for what only it speaks here: the Batch API, explicit
caching's cachedContents, and every request where a proxy applies (``lean_or_sdk.proxied``). The SDK goes async
over an httpx2 client of the runner's whose answers are bounded (``bounded_httpx.py``), its retries off
(``HttpRetryOptions(attempts=1)``).

Models are named ``gemini:gemini-2.0-flash``; the key comes from GEMINI_API_KEY, else GOOGLE_API_KEY; the base URL
from the job's ``base_url``, else GOOGLE_GEMINI_BASE_URL, else https://generativelanguage.googleapis.com (as the SDK
reads them), on ``v1beta`` (``capabilities.GEMINI_API_VERSION``). With its retries off the SDK lets raw httpx2 (or,
on Vertex with a client certificate, aiohttp) and timeout errors through: :meth:`map_errors` classifies those too;
an error answer is the same error on both paths (``gemini_wire.status_error``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import FlexUnavailable, ModelSetupError, ProviderError, Refused, TransientError

from . import capabilities
from .answer_bounds import bounds_of, surfaced
from .base import CacheMarks, Completion, Provider, ProviderSettings, StoredPrompt, register
from .gemini_wire import model_path, read_answer, request_body, sdk_fields, sdk_header, status_error, thinking_config
from .lean_or_sdk import LeanOrSDK, proxied
from .tiers import FLEX, GEMINI_TIER_HEADER, GEMINI_WIRE, served
from .tls import shared_context
from .token_counts import gemini_count_fields, read_count
from .wire import quoted, words

if TYPE_CHECKING:  # the SDK is imported where it is used: discovering the providers must stay light
    from google import genai
    from google.genai import types

    from .batching import Batches
    from .lean_http import Answer, LeanWire

#: the Gemini API's root when neither the job nor GOOGLE_GEMINI_BASE_URL names one (google-genai's default)
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
#: the error of a request naming a cached content that expired or was deleted meanwhile (as the API words it)
_CACHE_GONE = "cachedcontent not found"

#: finish reasons that mean the answer was withheld
_FILTERED = {"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION", "IMAGE_SAFETY"}


@register
class GeminiProvider(LeanOrSDK["genai.Client"], Provider):
    name: ClassVar[str] = "gemini"
    sdk_modules: ClassVar[tuple[str, ...]] = ("google.genai",)
    sdk_package: ClassVar[str | None] = "google-genai"
    extra: ClassVar[str | None] = "gemini"
    key_env_var: ClassVar[str | None] = "GEMINI_API_KEY"
    default_concurrency: ClassVar[int] = 32
    adaptive: ClassVar[bool] = True
    price_id: ClassVar[str | None] = "google"
    supports_batch: ClassVar[bool] = True
    #: implicit caching: repeated prefixes are cached without a mark (ai.google.dev/gemini-api/docs/caching)
    prompt_cache_style: ClassVar[str | None] = "implicit"
    #: and explicit caching: a prefix of whole messages kept as a cachedContents resource, read at the cached price
    #: by every request that names it, its storage billed per token-hour (same page, "Explicit caching")
    stores_prompts: ClassVar[bool] = True

    class Options(Provider.Options):
        #: false: never store prompt prefixes as cached contents (prompt_cache: auto then orders requests only)
        explicit_cache: bool = True

    options: Options

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self._client: genai.Client | None = None
        self.wire: LeanWire | None = None
        self.http: Any = None
        self.where = f"gemini at {settings.base_url or 'generativelanguage.googleapis.com'}"
        #: stored prefixes a request found gone (expired, deleted): the runner stores them again or does without
        self.gone_prompts: set[str] = set()

    def key_variables(self) -> list[str]:
        if self.settings.api_key_env:
            return [self.settings.api_key_env]
        return ["GEMINI_API_KEY", "GOOGLE_API_KEY"]

    @property
    def base_url(self) -> str:
        return (self.settings.base_url or os.environ.get("GOOGLE_GEMINI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")

    async def start(self) -> None:
        if proxied(self.base_url):
            self.client = self._sdk_client()
            return
        from .lean_http import LeanWire

        self.wire = LeanWire(f"{self.base_url}/{capabilities.GEMINI_API_VERSION}", "", self.settings.timeout,
                             headers={"x-goog-api-key": self.api_key() or ""}, tls=shared_context,
                             error_of=self._status_error, bounds=bounds_of(self.settings))

    def _status_error(self, status: int, body: Any, headers: Mapping[str, str]) -> ProviderError:
        return status_error(self.where, self.key_variables(), status, body, headers)

    def _sdk_client(self) -> genai.Client:
        from google import genai
        from google.genai import types

        options = types.HttpOptions(
            base_url=self.settings.base_url,
            # pinned: google-genai 3.x calls v1 unless told, which has no systemInstruction, responseMimeType,
            # responseJsonSchema or thinkingConfig (capabilities.GEMINI_API_VERSION)
            api_version=capabilities.GEMINI_API_VERSION,
            timeout=int(self.settings.timeout * 1000),  # milliseconds
            retry_options=types.HttpRetryOptions(attempts=1),  # runner-owned retries (ARCHITECTURE.md invariant 4)
            client_args={"verify": shared_context()},
            # an httpx2 client of the runner's, whose answers are bounded (bounded_httpx.py), in place of the
            # aiohttp session google-genai makes, whose are not
            httpx_async_client=self.http_client(),
        )
        return genai.Client(api_key=self.api_key(), http_options=options)

    def http_client(self) -> Any:
        """The httpx2 client the SDK sends with, its answers bounded; closed by :meth:`aclose`."""
        import httpx2

        from .bounded_httpx import bounded_client

        if self.http is None:
            self.http = bounded_client(httpx2.AsyncClient, self.settings, verify=shared_context(),
                                       timeout=self.settings.timeout)
        return self.http

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aio.aclose()
            self._client = None
        if self.wire is not None:
            await self.wire.aclose()
            self.wire = None
        if self.http is not None:  # the SDK closes only the clients it made
            await self.http.aclose()
            self.http = None

    async def probe(self, model: str) -> None:
        """``GET /v1beta/models/{model}`` (the SDK's ``models.get``), not charged: a 404 NOT_FOUND is a model the
        API does not serve (https://ai.google.dev/api/models#method:-models.get)."""
        if self.wire is not None:
            from .lean_http import parsed_or_text

            answer = await self.wire.request("GET", "/" + model_path(model), where=self.where, passing=(404,))
            if answer.status == 404:
                _, status, message = sdk_fields(404, parsed_or_text(answer.content))
                self._unknown_model(model, status, message)
            return
        from google.genai import errors

        with self.map_errors():
            try:
                await self.client.aio.models.get(model=model)  # type: ignore[union-attr]
            except errors.ClientError as exc:
                if exc.code != 404:
                    raise
                self._unknown_model(model, exc.status, exc.message, exc)

    def _unknown_model(self, model: str, status: Any, message: Any, cause: BaseException | None = None) -> None:
        raise ModelSetupError(f"{self.name}:{model} is not a model {self.where} knows "
                              f"({words(404, status, None, None, message)}): check the model id") from cause

    @staticmethod
    def request_of(messages: list[dict[str, str]], params: dict[str, Any],
                   model: str = "") -> tuple[list[types.Content], types.GenerateContentConfig]:
        """The runner's messages and parameters (shaped for ``model`` by ``capabilities.shape``) as
        generateContent's contents and config."""
        from google.genai import types

        stored = params.get("cached_content")
        if stored:  # the leading messages (every system message among them) are in the cached content
            messages = messages[params.get("cached_messages") or 0:]
        system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system") or None
        contents = [
            types.Content(role="model" if m["role"] == "assistant" else "user", parts=[types.Part(text=m["content"])])
            for m in messages if m.get("role") != "system"
        ]
        config: dict[str, Any] = {"system_instruction": system, "candidate_count": 1}
        if stored:
            config["cached_content"] = stored
        for ours, theirs in (("temperature", "temperature"), ("max_tokens", "max_output_tokens"),
                             ("top_p", "top_p"), ("stop", "stop_sequences"), ("seed", "seed"),
                             ("logprobs", "response_logprobs"), ("presence_penalty", "presence_penalty"),
                             ("frequency_penalty", "frequency_penalty")):
            if params.get(ours) is not None:
                config[theirs] = params[ours]
        response_format = params.get("response_format") or {}
        if response_format.get("type") in ("json_object", "json_schema"):
            config["response_mime_type"] = "application/json"
            schema = (response_format.get("json_schema") or {}).get("schema")
            if schema is not None:
                config["response_json_schema"] = schema
        reasoning = params.get("reasoning")
        if reasoning:
            config["thinking_config"] = types.ThinkingConfig(
                **thinking_config(capabilities.capabilities("gemini", model), reasoning))
        if params.get("service_tier") is not None:  # sent by google-genai as the request's serviceTier
            config["service_tier"] = GEMINI_WIRE[params["service_tier"]]
        return contents, types.GenerateContentConfig(**config)

    def batches(self) -> Batches:
        from .gemini_batch import GeminiBatches

        return GeminiBatches(self)

    def count_request(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        return {"generateContentRequest": {"model": f"models/{model}", **gemini_count_fields(messages, params)}}

    async def count_tokens(self, model: str, request: dict[str, Any]) -> int:
        """``POST /v1beta/models/{model}:countTokens`` (runner/providers/token_counts.py), over the lean wire, else the
        provider's httpx2 client: google-genai's ``count_tokens`` refuses a system instruction on the Gemini API,
        which only this request's ``generateContentRequest`` form carries. An error answer is mapped as the SDK's."""
        path = f"/{model_path(model)}:countTokens"
        if self.wire is not None:
            answer = await self.wire.request("POST", path, request, where=self.where)
            return read_count(self._json_body(answer.content), "totalTokens", self.where)
        from google.genai import errors

        with self.map_errors():
            response = await self.http_client().post(f"{self.base_url}/{capabilities.GEMINI_API_VERSION}{path}",
                                                     json=request, headers={"x-goog-api-key": self.api_key()})
            await errors.APIError.raise_for_async_response(response)
            body = response.json()
        return read_count(body, "totalTokens", self.where)

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        try:
            if self.wire is not None:
                answer = await self._generate_lean(model, messages, params)
                return self.completion_of(self._json_body(answer.content), answer.headers)
            with self.map_errors():
                response = await self.generate(model, messages, params)
        except TransientError as exc:
            # flex "is sheddable and fails with 503 errors" (google-gemini/cookbook quickstarts/Inference_tiers.ipynb)
            if exc.status == 503 and params.get("service_tier") == FLEX:
                raise FlexUnavailable(f"{self.where}: the flex tier had no capacity for the request (503; not "
                                      "billed)", status=503) from exc
            raise
        return self.completion_of(response)

    async def _generate_lean(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Answer:
        """generateContent over the lean wire; a request naming a cached content that lapsed is sent again whole,
        as :meth:`generate` does."""
        assert self.wire is not None, "start() was not awaited"
        path = self.generate_path(model)
        stored = params.get("cached_content")
        if not stored:
            return await self.wire.request("POST", path, self.wire_body(messages, params, model), where=self.where,
                                           headers=await self.wire_headers())
        answer = await self.wire.request("POST", path, self.wire_body(messages, params, model), where=self.where,
                                         passing=(403, 404), headers=await self.wire_headers())
        if answer.status < 400:
            return answer
        from .lean_http import parsed_or_text

        body = parsed_or_text(answer.content)
        if _CACHE_GONE not in str(sdk_fields(answer.status, body)[2]).lower():
            raise self._status_error(answer.status, body, answer.headers)
        self.gone_prompts.add(stored)
        whole = {k: v for k, v in params.items() if k not in ("cached_content", "cached_messages")}
        return await self.wire.request("POST", path, self.wire_body(messages, whole, model), where=self.where,
                                       headers=await self.wire_headers())

    # -- what Gemini on Vertex (vertex.py) sends otherwise over the same mapping ---------------------------------
    def generate_path(self, model: str) -> str:
        """generateContent's path after the wire's base URL."""
        return f"/{model_path(model)}:generateContent"

    def wire_body(self, messages: list[dict[str, str]], params: dict[str, Any], model: str) -> dict[str, Any]:
        """generateContent's body (:func:`gemini_wire.request_body`)."""
        return request_body(messages, params, model)

    async def wire_headers(self) -> Mapping[str, str] | None:
        """A request's own headers besides the wire's: none here (the key is the wire's ``x-goog-api-key``)."""
        return None

    def _json_body(self, content: bytes) -> Any:
        try:
            return json.loads(content)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc

    async def generate(self, model: str, messages: list[dict[str, str]],
                       params: dict[str, Any]) -> types.GenerateContentResponse:
        """generateContent through the SDK (its errors let through); a request naming a cached content that lapsed
        between the runner's look and the send is sent again whole (the runner stores the prefix again for the
        next)."""
        from google.genai import errors

        client = self.client
        assert client is not None, "start() was not awaited"
        contents, config = self.request_of(messages, params, model)
        try:
            return await client.aio.models.generate_content(model=model, contents=contents, config=config)
        except errors.ClientError as exc:
            stored = params.get("cached_content")
            if not stored or exc.code not in (403, 404) or _CACHE_GONE not in str(exc.message).lower():
                raise
            self.gone_prompts.add(stored)
            whole = {k: v for k, v in params.items() if k not in ("cached_content", "cached_messages")}
            contents, config = self.request_of(messages, whole, model)
            return await client.aio.models.generate_content(model=model, contents=contents, config=config)

    # -- explicit caching: prompt prefixes stored as cachedContents (runner/engine/stored_prompts.py) -------------
    def stores_prompts_for(self, model: str) -> bool:
        return self.options.explicit_cache

    def mark_prompt_cache(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                          marks: CacheMarks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A request whose leading messages are stored names the cached content and sends the rest (the messages
        stay whole here: :meth:`request_of` leaves out the stored ones, and a request that finds its cached
        content gone is sent whole)."""
        if marks.stored is None:
            return messages, params
        return messages, {**params, "cached_content": marks.stored, "cached_messages": marks.held}

    def prompt_gone(self, name: str) -> bool:
        if name in self.gone_prompts:
            self.gone_prompts.discard(name)
            return True
        return False

    @staticmethod
    def _stored(cached: types.CachedContent) -> StoredPrompt:
        usage = cached.usage_metadata
        return StoredPrompt(str(cached.name), int((usage.total_token_count if usage else 0) or 0),
                            cached.expire_time.timestamp() if cached.expire_time else 0.0,
                            cached.display_name or "")

    async def store_prompt(self, model: str, messages: list[dict[str, Any]], seconds: float,
                           label: str) -> StoredPrompt:
        """``POST /v1beta/cachedContents`` (the SDK's ``caches.create``): the system messages as its
        systemInstruction, the others as its contents (ai.google.dev/api/caching#method:-cachedcontents.create)."""
        from google.genai import types

        assert self.client is not None, "start() was not awaited"
        contents, config = self.request_of(messages, {}, model)
        with self.map_errors():
            cached = await self.client.aio.caches.create(model=model, config=types.CreateCachedContentConfig(
                contents=contents or None, system_instruction=config.system_instruction,
                ttl=f"{max(1, round(seconds))}s", display_name=label))
        return self._stored(cached)

    async def keep_prompt(self, name: str, seconds: float) -> float:
        from google.genai import types

        assert self.client is not None, "start() was not awaited"
        with self.map_errors():
            cached = await self.client.aio.caches.update(
                name=name, config=types.UpdateCachedContentConfig(ttl=f"{max(1, round(seconds))}s"))
        return self._stored(cached).expires

    async def drop_prompt(self, name: str) -> None:
        from google.genai import errors

        assert self.client is not None, "start() was not awaited"
        with self.map_errors():
            try:
                await self.client.aio.caches.delete(name=name)
            except errors.ClientError as exc:
                if exc.code not in (403, 404):  # gone already (expired): nothing left to pay for
                    raise

    async def stored_prompts(self, model: str) -> list[StoredPrompt]:
        assert self.client is not None, "start() was not awaited"
        found = []
        with self.map_errors():
            async for cached in await self.client.aio.caches.list():
                if str(cached.model or "").rsplit("/", 1)[-1] == model:
                    found.append(self._stored(cached))
        return found

    def completion_of(self, response: Any, headers: Mapping[str, str] | None = None) -> Completion:
        """A generateContent answer as a :class:`Completion`: its JSON (the lean wire's, with its ``headers``; a
        batch line's) or the SDK's ``GenerateContentResponse`` (the SDK path, a batch job's inlined response), read
        as its JSON. One with neither candidates nor prompt feedback (which says why there are none) is
        malformed, not an empty answer."""
        if hasattr(response, "model_dump"):
            tier = sdk_header(response, GEMINI_TIER_HEADER)
            response = response.model_dump(mode="json", by_alias=True, exclude_none=True,
                                           exclude={"sdk_http_response"})
        else:  # JSON: an object, or anything else a server sent (read_answer finds it malformed)
            tier = (headers or {}).get(GEMINI_TIER_HEADER)
        try:
            got = read_answer(response)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not a generateContent answer (no candidates, no "
                                 "prompt feedback)", error_class="malformed_response") from exc
        except (KeyError, TypeError, AttributeError) as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        finish = got["finish"]
        completion = Completion(
            text=got["text"],
            finish_reason=finish,
            input_tokens=got["input"],
            output_tokens=got["output"] + got["thinking"],  # thinking tokens are billed as output
            cached_tokens=got["cached"],
            raw=response,
            thinking="\n\n".join(got["thoughts"]) if got["thoughts"] else None,
            reasoning_tokens=got["thinking"],
            tier=served(tier, GEMINI_WIRE),
        )
        if got["blocked"] is not None:
            raise Refused(f"{self.where}: the prompt was blocked ({quoted(got['blocked'])})", billed=completion)
        if finish in _FILTERED:
            raise Refused(f"{self.where}: the answer was withheld (finish reason {finish})", billed=completion)
        return completion

    @contextlib.contextmanager
    def map_errors(self) -> Iterator[None]:
        """The SDK's exceptions (and, with its retries off, raw httpx2 and aiohttp ones) as the runner's classes; an
        error answer as the lean wire maps it (``gemini_wire.status_error``)."""
        import aiohttp
        import httpx2
        from google.genai import errors

        where = self.where
        with surfaced(where):
            try:
                yield
            except errors.APIError as exc:
                headers = getattr(exc.response, "headers", None)
                raise status_error(where, self.key_variables(), exc.code, exc.details, headers) from exc
            except httpx2.ConnectTimeout as exc:
                raise TransientError(f"{where}: connection failed (ConnectTimeout)", error_class="connection") from exc
            except (TimeoutError, aiohttp.ServerTimeoutError, httpx2.TimeoutException) as exc:
                raise TransientError(f"{where}: timed out after {self.settings.timeout:g} s",
                                     error_class="timeout") from exc
            except httpx2.TransportError as exc:
                raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                     error_class="connection") from exc
            except aiohttp.ClientResponseError as exc:
                raise TransientError(f"{where}: bad response ({exc.status})", status=exc.status) from exc
            except aiohttp.ClientError as exc:
                raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                     error_class="connection") from exc
            except ValueError as exc:  # the body was not JSON (json.JSONDecodeError and pydantic's errors)
                raise TransientError(f"{where}: the response was not valid JSON ({type(exc).__name__})",
                                     error_class="malformed_response") from exc
