"""Google Vertex AI: Gemini and Claude on Vertex, online over the lean wire (``runner/providers/lean_http.py``) with
Google's OAuth tokens, the SDKs (google-genai in Vertex mode, the anthropic SDK's ``AsyncAnthropicVertex``, their
retries off) kept for what only they do here.

Models are named ``vertex:gemini-2.5-flash`` and ``vertex:claude-sonnet-4-5@20250929`` (a ``claude-`` model goes to
Claude on Vertex). The project and location come from ``providers: {vertex: {project: ..., location: ...}}``, else
GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION (the variables google-genai reads); the credentials from Application
Default Credentials only (GOOGLE_APPLICATION_CREDENTIALS, ``gcloud auth application-default login``, a cloud
machine's service account), loaded once per process while nothing they come from changes, shared by the wire and
both SDKs, never stored or shown. Their access token is refreshed in a worker thread when it is missing or about to
expire, one refresh for all the requests in flight (:mod:`runner.providers.google_tokens`).

The lean wire sends what the SDKs sent, at the hosts and paths :mod:`runner.providers.vertex_wire` names (Gemini's
``:generateContent``, Claude's ``:rawPredict``, the probe's publisher-model lookup): Gemini's with ``Authorization:
Bearer`` and the credentials' quota project as ``x-goog-user-project`` (as google-genai adds it), Claude's with
``Authorization: Bearer`` only (as ``AsyncAnthropicVertex``).

The wire mapping is the gemini and anthropic providers' own (``GeminiProvider.request_of``/``completion_of`` and
``gemini_wire.request_body``, ``AnthropicProvider.request_of``/``completion_of``), so thinking, structured output and
the capability table behave as for ``gemini:`` and ``anthropic:``, and an error answer is theirs, with Vertex's words
for refused credentials. Claude's body carries ``anthropic_version: vertex-2023-10-16`` (the value Vertex takes,
https://docs.claude.com/en/api/claude-on-vertex-ai), pinned as the anthropic provider pins its header.

The SDKs, built in a worker thread (on first use, or by ``start`` where they will be needed): batch prediction
(``mode: batch`` or ``auto``, :mod:`runner.providers.vertex_batch`, its files staged under the job's ``providers:
{vertex: {batch_folder: gs://BUCKET/PREFIX}}``, :mod:`runner.providers.gcs_files`), Gemini's cachedContents
(explicit prompt caching, the gemini provider's ``caches`` calls), token counting; and every request of a family
whose base a proxy applies to (``lean_or_sdk.proxied``), or, for Gemini, where a client certificate is to be
presented (GOOGLE_API_USE_CLIENT_CERTIFICATE).

Cache key: the provider name (``vertex``) keeps these answers apart from ``gemini:``'s and ``anthropic:``'s; the
project and location are not in it: they decide who pays and which quota is used, not what the model answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from runner.errors import AuthError, BadRequest, ModelSetupError, TransientError

from . import vertex_wire
from .answer_bounds import bounds_of
from .anthropic_messages import cache_blocks
from .base import LEAN_WIRE, CacheMarks, Completion, Provider, ProviderSettings, StoredPrompt, register
from .lean_or_sdk import proxied
from .records import package_version
from .tls import shared_context
from .token_counts import gemini_count_fields, read_count, with_estimate_margin
from .vertex_families import VertexClaude, VertexGemini

if TYPE_CHECKING:  # the SDKs are imported where they are used: discovering the providers must stay light
    import anthropic
    from google import genai
    from google.auth.credentials import Credentials

    from .batching import Batches
    from .gcs_files import Folder, Staging
    from .google_tokens import AccessTokens
    from .lean_http import LeanWire

#: Claude on Vertex's ``anthropic_version`` (in the body, not a header)
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_ADC = ("export GOOGLE_APPLICATION_CREDENTIALS=<a service-account key file> or run "
        "`gcloud auth application-default login`")


def is_claude(model: str) -> bool:
    return model.startswith("claude-")


@register
class VertexProvider(Provider):
    name: ClassVar[str] = "vertex"
    sdk_modules: ClassVar[tuple[str, ...]] = ("google.genai", "google.auth", "anthropic")
    extra: ClassVar[str | None] = "vertex"
    #: Claude on Vertex caches what a request marks (cache_control, as Anthropic's API); Gemini on Vertex caches
    #: implicitly: both are planned, only Claude's requests are marked (:meth:`mark_prompt_cache`)
    prompt_cache_style: ClassVar[str | None] = "explicit"
    #: Gemini's prompt prefixes stored as cached contents, as the gemini provider stores them, over the Vertex-mode
    #: client (cloud.google.com/vertex-ai/generative-ai/docs/context-cache/context-cache-overview)
    stores_prompts: ClassVar[bool] = True
    default_concurrency: ClassVar[int] = 32
    adaptive: ClassVar[bool] = True
    #: genai-prices' Google provider matches Vertex and falls back to Anthropic's prices for Claude models
    price_id: ClassVar[str | None] = "google"
    #: online requests go over the lean wire unless a proxy applies (the module's docstring); False: the SDKs always
    lean_wire: ClassVar[bool] = True
    # Vertex batch prediction (runner/providers/vertex_batch.py) where the job names a Cloud Storage folder to stage
    # its files in (``batch_folder``): ``supports_batch`` is a property of the endpoint, below

    class Options(Provider.Options):
        #: the Google Cloud project (else GOOGLE_CLOUD_PROJECT)
        project: str | None = None
        #: the region, e.g. us-central1, or global (else GOOGLE_CLOUD_LOCATION)
        location: str | None = None
        #: the Cloud Storage folder batch prediction's input and output files go under, gs://BUCKET/PREFIX
        batch_folder: str | None = None
        #: false: never store Gemini prompt prefixes as cached contents (prompt_cache: auto then orders only)
        explicit_cache: bool = True

    def sent_with(self, model: str, *, batch: bool = False) -> str | None:
        """The lean wire where it sends the model's family; else Claude's requests through the anthropic SDK,
        Gemini's through google-genai (batch prediction too)."""
        if not batch and (self.claude if is_claude(model) else self.gemini).wire is not None:
            return LEAN_WIRE
        return package_version("anthropic" if is_claude(model) and not batch else "google-genai")

    @classmethod
    def capability_model(cls, model: str) -> tuple[str, str] | None:
        """Claude on Vertex follows anthropic's rules under Anthropic's name (``claude-sonnet-4-5@20250929`` is
        ``claude-sonnet-4-5-20250929``), every other model gemini's."""
        if model.startswith("claude-"):
            return "anthropic", model.replace("@", "-")
        return "gemini", model

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self.project = self.options.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None
        self.location = self.options.location or os.environ.get("GOOGLE_CLOUD_LOCATION") or None
        self.where = f"vertex at {settings.base_url or urlsplit(vertex_wire.default_root(self.location)).netloc}"
        shared = ProviderSettings.model_validate(  # without project and location, which only vertex declares
            {k: v for k, v in settings.model_dump(exclude_unset=True).items() if k in ProviderSettings.model_fields})
        self.gemini = VertexGemini(shared, self)
        self.claude = VertexClaude(shared, self)
        self.claude.api_version = "2023-06-01"
        self.gemini.where = self.claude.where = self.where
        self.credentials: Credentials | None = None
        #: the credentials' access token for the lean wire's requests (:meth:`start`)
        self.tokens: AccessTokens | None = None
        self.batch_folder: Folder | None = None
        if self.options.batch_folder:
            from .gcs_files import parse_folder

            self.batch_folder = parse_folder(self.options.batch_folder)
        self._staging: Staging | None = None

    @classmethod
    def sends_batches(cls, settings: ProviderSettings) -> bool:
        """Batch prediction only where the endpoint names a Cloud Storage folder for its files."""
        return bool(cls.options_from(settings).batch_folder)

    @property  # type: ignore[misc]  # the class says whether Vertex has a Batch API, an endpoint whether it may use it
    def supports_batch(self) -> bool:
        """Whether this endpoint sends batches: only where the job names a ``batch_folder`` (``mode: auto`` without
        one sends online; ``mode: batch`` is refused with :meth:`batch_unavailable`'s sentence)."""
        return self.batch_folder is not None

    def batch_unavailable(self, model: str) -> str | None:
        """Why ``mode: batch`` cannot send ``vertex:model`` (one sentence), or None when it can."""
        if self.batch_folder is not None:
            return None
        return (f"vertex:{model} in mode: batch needs a Cloud Storage folder for batch prediction's files: set "
                "providers.vertex.batch_folder: gs://BUCKET/PREFIX in the job (or use mode: auto or online)")

    def batches(self) -> Batches:
        from .vertex_batch import VertexBatches

        return VertexBatches(self, self._batch_staging())

    def _batch_staging(self) -> Staging:
        """The Cloud Storage folder batch prediction's files go under (one client per provider)."""
        from .gcs_files import Staging

        if self.batch_folder is None:
            raise ModelSetupError("vertex batch prediction needs a Cloud Storage folder for its files: set "
                                  "providers.vertex.batch_folder: gs://BUCKET/PREFIX in the job")
        if self._staging is None:
            self._staging = Staging(self.batch_folder, project=self.project, credentials=self.credentials,
                                    endpoint=self._root(), timeout=self.settings.timeout, where=self.where,
                                    bounds=bounds_of(self.settings))
        return self._staging

    def key_variables(self) -> list[str]:
        return []  # no key: Application Default Credentials (start() loads them)

    def check_key(self, model: str) -> None:
        """The project and location are known (the credentials are loaded by :meth:`start`)."""
        for value, setting, variable in ((self.project, "project", "GOOGLE_CLOUD_PROJECT"),
                                         (self.location, "location", "GOOGLE_CLOUD_LOCATION")):
            if not value:
                raise ModelSetupError(f"vertex:{model} needs a Google Cloud {setting}: set providers: {{vertex: "
                                      f"{{{setting}: ...}}}} in the job or export {variable} (no request was sent)")

    def endpoint_key(self, model: str) -> str:
        return f"vertex:{self.project}:{self.location}:{self.settings.base_url or ''}:{model}"

    async def start(self) -> None:
        """Load the credentials (in a worker thread: google-auth reads files, and may ask a metadata server), then
        open a lean wire for each family whose base no proxy applies to; google-genai's client, imported and built in
        a worker thread (its import takes seconds on a busy machine; the event loop serves the other providers
        meanwhile), where Gemini's wire does not serve or the job names a ``batch_folder``. Anything else an SDK
        does waits for its first use."""
        from .google_tokens import AccessTokens

        self.credentials = await asyncio.to_thread(self._load_credentials)
        self.tokens = AccessTokens(self.credentials)
        gemini_url = vertex_wire.gemini_base(self._root(), self.location)
        claude_url = vertex_wire.claude_base(self._root(), self.location)
        gemini_lean = self.lean_wire and not proxied(gemini_url) and not _mutual_tls()
        if not gemini_lean or self.batch_folder is not None:
            # (batch prediction reads the client without awaiting: built here, where the job may send batches)
            self.gemini.client = await asyncio.to_thread(self._gemini_client)
        if gemini_lean:  # with the server-side deadline google-genai sends with each request (X-Server-Timeout)
            self.gemini.wire = self._wire(gemini_url, self.gemini._status_error,
                                          {"X-Server-Timeout": str(math.ceil(self.settings.timeout))})
        if self.lean_wire and not proxied(claude_url):
            self.claude.wire = self._wire(claude_url, self.claude._status_error, {})

    def _wire(self, url: str, error_of: Any, headers: dict[str, str]) -> LeanWire:
        from .lean_http import LeanWire

        # no auth header of its own: each request carries the token of its time (:meth:`token_headers`)
        return LeanWire(url, "", self.settings.timeout, headers=headers, tls=shared_context, error_of=error_of,
                        bounds=bounds_of(self.settings))

    async def token_headers(self, *, quota_project: bool) -> dict[str, str]:
        """The headers of a request's credentials, their token refreshed first when stale (google-auth's errors as
        they are: :meth:`vertex_words` words them)."""
        assert self.tokens is not None, "start() was not awaited"
        return await self.tokens.headers(quota_project=quota_project)

    def _load_credentials(self) -> Credentials:
        from google.auth import exceptions

        from .google_tokens import default_credentials

        try:  # the token is fetched on the first request: a refused credential is then an AuthError
            return default_credentials([_SCOPE])
        except exceptions.DefaultCredentialsError as exc:
            raise ModelSetupError(f"vertex needs Google credentials, and none could be loaded: {_ADC} (no request "
                                  "was sent)") from exc

    def _root(self) -> str | None:
        return self.settings.base_url.rstrip("/") if self.settings.base_url else None

    def _gemini_client(self) -> genai.Client:
        from google import genai
        from google.genai import types

        # the runner's httpx2 client, whose answers are bounded (bounded_httpx.py); google-genai's own where a client
        # certificate is to be presented (GOOGLE_API_USE_CLIENT_CERTIFICATE), whose answers are not
        return genai.Client(
            vertexai=True, project=self.project, location=self.location, credentials=self.credentials,
            http_options=types.HttpOptions(
                base_url=self._root(), api_version=vertex_wire.VERTEX_API_VERSION,
                timeout=int(self.settings.timeout * 1000),
                retry_options=types.HttpRetryOptions(attempts=1),  # runner-owned retries (invariant 4)
                httpx_async_client=None if _mutual_tls() else self.gemini.http_client()))

    async def _gemini_sdk(self) -> genai.Client:
        """google-genai's Vertex-mode client, built in a worker thread on first use (cachedContents, token counts,
        the probe where the wire does not serve)."""
        if self.gemini._client is None:
            client = await asyncio.to_thread(self._gemini_client)
            if self.gemini._client is None:  # another request may have built it meanwhile
                self.gemini.client = client
        assert self.gemini._client is not None
        return self.gemini._client

    def _claude_sdk(self, sdk: Any) -> anthropic.AsyncAnthropicVertex:
        from .bounded_httpx import bounded_client

        root, timeout = self._root(), self.settings.timeout
        return sdk.AsyncAnthropicVertex(  # type: ignore[no-any-return]
            region=self.location, project_id=self.project, credentials=self.credentials,
            base_url=f"{root}/v1" if root else None, max_retries=0, timeout=timeout,  # runner-owned retries
            http_client=bounded_client(sdk.DefaultAioHttpClient, self.settings, timeout=timeout,
                                       verify=shared_context()))

    async def _claude_client(self) -> anthropic.AsyncAnthropicVertex:
        """``AsyncAnthropicVertex``, the SDK imported in a worker thread on first use (token counts, batch
        prediction's error words, every request where the wire does not serve)."""
        import importlib

        if self.claude._client is None:
            sdk = await asyncio.to_thread(importlib.import_module, "anthropic")
            if self.claude._client is None:  # another request may have built it meanwhile
                self.claude.client = self._claude_sdk(sdk)
        assert self.claude._client is not None
        return self.claude._client

    async def aclose(self) -> None:
        await self.gemini.aclose()
        await self.claude.aclose()
        if self._staging is not None:
            self._staging.close()

    def mark_prompt_cache(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                          marks: CacheMarks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if is_claude(model):
            return cache_blocks(messages, marks), params
        return self.gemini.mark_prompt_cache(model, messages, params, marks)

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        if is_claude(model):
            return await self._claude(model, messages, params)
        gemini = self.gemini
        if gemini.wire is not None:
            with self.vertex_words(model):
                answer = await gemini._generate_lean(model, messages, params)
            return gemini.completion_of(gemini._json_body(answer.content), answer.headers)
        with self.map_errors(model):
            response = await gemini.generate(model, messages, params)
        return gemini.completion_of(response)

    # -- Gemini's explicit caching, as the gemini provider does it (google-genai's caches) ----------------------
    def stores_prompts_for(self, model: str) -> bool:
        return self.options.explicit_cache and not is_claude(model)

    def prompt_gone(self, name: str) -> bool:
        return self.gemini.prompt_gone(name)

    async def store_prompt(self, model: str, messages: list[dict[str, Any]], seconds: float,
                           label: str) -> StoredPrompt:
        with self.map_errors(model):
            await self._gemini_sdk()
            return await self.gemini.store_prompt(model, messages, seconds, label)

    async def keep_prompt(self, name: str, seconds: float) -> float:
        with self.map_errors(name):
            await self._gemini_sdk()
            return await self.gemini.keep_prompt(name, seconds)

    async def drop_prompt(self, name: str) -> None:
        with self.map_errors(name):
            await self._gemini_sdk()
            await self.gemini.drop_prompt(name)

    async def stored_prompts(self, model: str) -> list[StoredPrompt]:
        with self.map_errors(model):
            await self._gemini_sdk()
            return await self.gemini.stored_prompts(model)

    # -- token counting (runner/providers/token_counts.py) -----------------------------------------------------
    def count_request(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        if is_claude(model):
            return {**self.claude.count_request(model, messages, params),
                    "anthropic_version": VERTEX_ANTHROPIC_VERSION}
        return gemini_count_fields(messages, params)

    def count_reserved(self, model: str, counted: int) -> int:
        return with_estimate_margin(counted) if is_claude(model) else counted  # Anthropic's count: an estimate

    async def count_tokens(self, model: str, request: dict[str, Any]) -> int:
        """Claude: ``count-tokens:rawPredict``, where ``AsyncAnthropicVertex``'s ``messages.count_tokens`` sends the
        body (the model in it); Gemini: the publisher model's ``:countTokens`` through google-genai, which takes a
        system instruction in Vertex mode. Both through their SDK."""
        if is_claude(model):
            client = await self._claude_client()
            fields = {key: value for key, value in request.items() if key != "anthropic_version"}
            with self.map_errors(model):
                raw = await client.messages.with_raw_response.count_tokens(
                    **fields, extra_body={"anthropic_version": request["anthropic_version"]})
            return read_count(self.claude._json_body(raw.http_response.content), "input_tokens", self.where)
        client = await self._gemini_sdk()
        from google.genai import types

        system = request.get("systemInstruction")
        config = request.get("generationConfig") or {}
        with self.map_errors(model):
            counted = await client.aio.models.count_tokens(
                model=model, contents=[types.Content.model_validate(content) for content in request["contents"]],
                config=types.CountTokensConfig(
                    system_instruction=types.Content.model_validate(system) if system else None,
                    generation_config=types.GenerationConfig.model_validate(config) if config else None))
        return read_count({"totalTokens": counted.total_tokens}, "totalTokens", self.where)

    async def _claude(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        claude = self.claude
        kwargs, sampling = claude.request_of(messages, params, model)
        if claude.wire is not None:  # the body AsyncAnthropicVertex sends: no model (it is in the path)
            body = {**kwargs, **sampling, "anthropic_version": VERTEX_ANTHROPIC_VERSION}
            with self.vertex_words(model):
                path = vertex_wire.claude_path(model, self.project, self.location)
                answer = await claude.wire.request("POST", path, body, where=self.where,
                                                   headers=await self.token_headers(quota_project=False))
            content = answer.content
        else:
            client = await self._claude_client()
            kwargs["extra_body"] = {**sampling, "anthropic_version": VERTEX_ANTHROPIC_VERSION}
            with self.map_errors(model):
                raw = await client.messages.with_raw_response.create(model=model, **kwargs)
            content = raw.http_response.content
        try:
            body = json.loads(content)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        return claude.completion_of(body)

    async def probe(self, model: str) -> None:
        """Model Garden's publisher-model lookup (``GET v1/publishers/{publisher}/models/{model}``, google-genai's
        ``models.get``), over Gemini's wire where it serves, free, for Claude too (its base model, without
        ``@version``); it does not check that the model is offered in the location. With a ``batch_folder``, one
        free list call of it too."""
        name = f"publishers/anthropic/models/{model.partition('@')[0]}" if is_claude(model) else model
        try:
            await self._lookup(model, name)
        except BadRequest as exc:
            if exc.status == 404:
                raise ModelSetupError(f"vertex:{model} is not a model Vertex AI knows ({self.where}, project "
                                      f"{self.project}): check the model id") from None
            raise
        except TransientError as exc:
            if exc.error_class in ("connection", "timeout"):
                raise TransientError(f"vertex:{model}: {self.where} did not answer ({exc.error_class}); is the "
                                     "endpoint reachable?", error_class=exc.error_class) from None
            raise
        if self.batch_folder is not None:  # batch prediction's folder: its bucket exists and may be listed
            try:
                await self._batch_staging().check()
            except BadRequest as exc:
                raise ModelSetupError(f"vertex:{model}: {exc}") from None

    async def _lookup(self, model: str, name: str) -> None:
        """The publisher model's lookup; its error answer mapped as Gemini's (Vertex's words for credentials)."""
        wire = self.gemini.wire
        if wire is not None:
            with self.vertex_words(model):
                await wire.request("GET", vertex_wire.lookup_path(name), where=self.where,
                                   headers=await self.token_headers(quota_project=True))
            return
        client = self.gemini.client
        assert client is not None, "start() was not awaited"
        with self.map_errors(model, through_genai=True):
            await client.aio.models.get(model=name)

    @contextlib.contextmanager
    def map_errors(self, model: str, *, through_genai: bool = False) -> Iterator[None]:
        """The gemini and anthropic providers' mappings of their SDK's errors, then :meth:`vertex_words`. Claude's
        requests go through the anthropic SDK unless ``through_genai`` (the probe's lookup, batch prediction)."""
        mapping = self.claude.map_errors() if is_claude(model) and not through_genai else self.gemini.map_errors()
        with self.vertex_words(model), mapping:
            yield

    @contextlib.contextmanager
    def vertex_words(self, model: str) -> Iterator[None]:
        """The runner's errors as Vertex words them: refused credentials (an error answer's, on the wire or through
        an SDK), and google-auth's errors (a token refresh before or during a request) as the runner's classes."""
        from google.auth import exceptions

        try:
            yield
        except AuthError as exc:
            raise AuthError(f"vertex:{model} at {self.where.removeprefix('vertex at ')}: the credentials were "
                            f"refused ({exc.status}); {_ADC} with an account that may use Vertex AI in project "
                            f"{self.project}", status=exc.status) from exc
        except exceptions.RefreshError as exc:
            raise AuthError(f"vertex:{model}: Google refused to refresh the credentials; {_ADC}",
                            status=401) from exc
        except exceptions.TransportError as exc:
            raise TransientError(f"vertex:{model}: Google's token endpoint could not be reached",
                                 error_class="connection") from exc


def _mutual_tls() -> bool:
    """Whether google-genai is to present a client certificate (GOOGLE_API_USE_CLIENT_CERTIFICATE), which only its
    own client does: Gemini's requests then keep it."""
    return os.environ.get("GOOGLE_API_USE_CLIENT_CERTIFICATE", "").lower() == "true"
