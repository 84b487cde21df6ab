"""Google Vertex AI: Gemini through google-genai in Vertex mode, and Claude on Vertex through the anthropic SDK's
``AsyncAnthropicVertex``, both with their SDK's retries off.

Models are named ``vertex:gemini-2.5-flash`` and ``vertex:claude-sonnet-4-5@20250929`` (a ``claude-`` model goes to
Claude on Vertex). The project and location come from ``providers: {vertex: {project: ..., location: ...}}``, else
GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION (the variables google-genai reads); the credentials from Application
Default Credentials only (GOOGLE_APPLICATION_CREDENTIALS, ``gcloud auth application-default login``, a cloud
machine's service account), loaded once per run and shared by both SDKs; nothing of them is stored or shown.

The wire mapping is the gemini and anthropic providers' own (``GeminiProvider.request_of``/``completion_of``,
``AnthropicProvider.request_of``/``completion_of``), so thinking, structured output and the capability table behave
as for ``gemini:`` and ``anthropic:``. Claude's body carries ``anthropic_version: vertex-2023-10-16`` (the value
Vertex takes, https://docs.claude.com/en/api/claude-on-vertex-ai), pinned as the anthropic provider pins its header.

Batch prediction (``mode: batch`` or ``auto``): :mod:`runner.providers.vertex_batch`, its files staged under the
job's ``providers: {vertex: {batch_folder: gs://BUCKET/PREFIX}}`` (:mod:`runner.providers.gcs_files`).

Cache key: the provider name (``vertex``) keeps these answers apart from ``gemini:``'s and ``anthropic:``'s; the
project and location are not in it: they decide who pays and which quota is used, not what the model answers.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import AuthError, BadRequest, ModelSetupError, TransientError

from .answer_bounds import bounds_of
from .anthropic_messages import AnthropicProvider, cache_blocks
from .base import CacheMarks, Completion, Provider, ProviderSettings, StoredPrompt, register
from .gemini import GeminiProvider
from .records import package_version
from .tls import shared_context
from .token_counts import gemini_count_fields, read_count, with_estimate_margin

if TYPE_CHECKING:  # the SDKs are imported where they are used: discovering the providers must stay light
    import anthropic
    from google import genai
    from google.auth.credentials import Credentials

    from .batching import Batches
    from .gcs_files import Folder, Staging

#: Claude on Vertex's ``anthropic_version`` (in the body, not a header)
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
#: Vertex's API version for Gemini: v1 (GA) has systemInstruction, responseMimeType, responseJsonSchema and
#: thinkingConfig (cloud.google.com/vertex-ai/docs/reference/rest/v1/GenerationConfig)
VERTEX_API_VERSION = "v1"
_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_ADC = ("export GOOGLE_APPLICATION_CREDENTIALS=<a service-account key file> or run "
        "`gcloud auth application-default login`")


def is_claude(model: str) -> bool:
    return model.startswith("claude-")


class _VertexGemini(GeminiProvider):
    """The gemini provider's mapping over a Vertex-mode client (not registered)."""

    key_env_var: ClassVar[str | None] = "GOOGLE_APPLICATION_CREDENTIALS"

    def key_variables(self) -> list[str]:
        return ["GOOGLE_APPLICATION_CREDENTIALS"]


class _VertexClaude(AnthropicProvider):
    """The anthropic provider's mapping over ``AsyncAnthropicVertex`` (not registered); API version 2023-06-01's
    rules, which ``vertex-2023-10-16`` tracks (sampling parameters taken where the model takes them)."""

    key_env_var: ClassVar[str | None] = "GOOGLE_APPLICATION_CREDENTIALS"


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
        """Claude's requests go through the anthropic SDK, Gemini's through google-genai (batch prediction too)."""
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
        host = settings.base_url or ("aiplatform.googleapis.com" if self.location in (None, "global")
                                     else f"{self.location}-aiplatform.googleapis.com")
        self.where = f"vertex at {host}"
        shared = ProviderSettings.model_validate(  # without project and location, which only vertex declares
            {k: v for k, v in settings.model_dump(exclude_unset=True).items() if k in ProviderSettings.model_fields})
        self.gemini = _VertexGemini(shared)
        self.claude = _VertexClaude(shared)
        self.claude.api_version = "2023-06-01"
        self.gemini.where = self.claude.where = self.where
        self.credentials: Credentials | None = None
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
        """Load the credentials and open the Gemini client, the SDKs imported and built in a worker thread (their
        imports take seconds on a busy machine; the event loop serves the other providers meanwhile). The Claude
        client waits for the first Claude model (:meth:`_claude_client`)."""
        import asyncio

        self.credentials = await asyncio.to_thread(self._load_credentials)
        self.gemini.client = await asyncio.to_thread(self._gemini_client)

    def _load_credentials(self) -> Credentials:
        import google.auth
        from google.auth import exceptions

        try:  # the token is fetched on the first request: a refused credential is then an AuthError
            credentials, _ = google.auth.default(scopes=[_SCOPE])
        except exceptions.DefaultCredentialsError as exc:
            raise ModelSetupError(f"vertex needs Google credentials, and none could be loaded: {_ADC} (no request "
                                  "was sent)") from exc
        return credentials

    def _root(self) -> str | None:
        return self.settings.base_url.rstrip("/") if self.settings.base_url else None

    def _gemini_client(self) -> genai.Client:
        from google import genai
        from google.genai import types

        # the runner's httpx2 client, whose answers are bounded (bounded_httpx.py); google-genai's own where a client
        # certificate is to be presented (GOOGLE_API_USE_CLIENT_CERTIFICATE), whose answers are not
        mutual_tls = os.environ.get("GOOGLE_API_USE_CLIENT_CERTIFICATE", "").lower() == "true"
        return genai.Client(
            vertexai=True, project=self.project, location=self.location, credentials=self.credentials,
            http_options=types.HttpOptions(
                base_url=self._root(), api_version=VERTEX_API_VERSION, timeout=int(self.settings.timeout * 1000),
                retry_options=types.HttpRetryOptions(attempts=1),  # runner-owned retries (invariant 4)
                httpx_async_client=None if mutual_tls else self.gemini.http_client()))

    async def _claude_client(self) -> anthropic.AsyncAnthropicVertex:
        import asyncio
        import importlib

        from .bounded_httpx import bounded_client

        if self.claude.client is None:
            sdk = await asyncio.to_thread(importlib.import_module, "anthropic")
            if self.claude.client is None:  # another request may have built it meanwhile
                root, timeout = self._root(), self.settings.timeout
                self.claude.client = sdk.AsyncAnthropicVertex(
                    region=self.location, project_id=self.project, credentials=self.credentials,
                    base_url=f"{root}/v1" if root else None, max_retries=0, timeout=timeout,  # runner-owned retries
                    http_client=bounded_client(sdk.DefaultAioHttpClient, self.settings,
                                               timeout=timeout,
                                               verify=shared_context()))
        return self.claude.client

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
        with self.map_errors(model):
            response = await self.gemini.generate(model, messages, params)
        return self.gemini.completion_of(response)

    # -- Gemini's explicit caching, as the gemini provider does it -------------------------------------------
    def stores_prompts_for(self, model: str) -> bool:
        return self.options.explicit_cache and not is_claude(model)

    def prompt_gone(self, name: str) -> bool:
        return self.gemini.prompt_gone(name)

    async def store_prompt(self, model: str, messages: list[dict[str, Any]], seconds: float,
                           label: str) -> StoredPrompt:
        with self.map_errors(model):
            return await self.gemini.store_prompt(model, messages, seconds, label)

    async def keep_prompt(self, name: str, seconds: float) -> float:
        with self.map_errors(name):
            return await self.gemini.keep_prompt(name, seconds)

    async def drop_prompt(self, name: str) -> None:
        with self.map_errors(name):
            await self.gemini.drop_prompt(name)

    async def stored_prompts(self, model: str) -> list[StoredPrompt]:
        with self.map_errors(model):
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
        system instruction in Vertex mode."""
        if is_claude(model):
            client = await self._claude_client()
            fields = {key: value for key, value in request.items() if key != "anthropic_version"}
            with self.map_errors(model):
                raw = await client.messages.with_raw_response.count_tokens(
                    **fields, extra_body={"anthropic_version": request["anthropic_version"]})
            return read_count(self.claude._json_body(raw.http_response.content), "input_tokens", self.where)
        from google.genai import types

        client = self.gemini.client
        assert client is not None, "start() was not awaited"
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
        client = await self._claude_client()
        kwargs, sampling = claude.request_of(messages, params, model)
        kwargs["extra_body"] = {**sampling, "anthropic_version": VERTEX_ANTHROPIC_VERSION}
        with self.map_errors(model):
            raw = await client.messages.with_raw_response.create(model=model, **kwargs)
        try:
            body = json.loads(raw.http_response.content)
        except ValueError as exc:
            raise TransientError(f"{self.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        return claude.completion_of(body)

    async def probe(self, model: str) -> None:
        """Model Garden's publisher-model lookup through google-genai (``GET v1/publishers/{publisher}/models/
        {model}``), free, for Claude too (its base model, without ``@version``); it does not check that the model
        is offered in the location. With a ``batch_folder``, one free list call of it too."""
        client = self.gemini.client
        assert client is not None, "start() was not awaited"
        name = f"publishers/anthropic/models/{model.partition('@')[0]}" if is_claude(model) else model
        try:
            with self.map_errors(model, through_genai=True):
                await client.aio.models.get(model=name)
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

    @contextlib.contextmanager
    def map_errors(self, model: str, *, through_genai: bool = False) -> Iterator[None]:
        """The gemini and anthropic providers' mappings of their SDK's errors, with Vertex's words for refused
        credentials, and google-auth's errors (a token refresh during a request) as the runner's classes. Claude's
        requests go through the anthropic SDK unless ``through_genai`` (the probe's lookup)."""
        from google.auth import exceptions

        mapping = self.claude.map_errors() if is_claude(model) and not through_genai else self.gemini.map_errors()
        try:
            with mapping:
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
