"""Azure OpenAI: Chat Completions on a resource's deployments over the lean wire (``runner/providers/lean_http.py``),
as the openai SDK's ``AsyncAzureOpenAI`` client sends them, which is kept for the Batch API (``azure_batch``) and
where a proxy applies (aiohttp transport, SDK retries off).

In job files ``azure-openai:DEPLOYMENT``; the path carries the deployment name, the model behind it matters only for
prices and the capability table. Settings (``providers: {azure-openai: {...}}``)::

    endpoint: https://NAME.openai.azure.com   # else AZURE_OPENAI_ENDPOINT
    api_version: "2024-10-21"                 # else OPENAI_API_VERSION
    auth: key                                 # or entra (azure-identity's DefaultAzureCredential)
    deployments: {my-gpt4o: gpt-4o}           # the model behind a deployment named otherwise
    base_url: http://127.0.0.1:8765/openai    # the SDK's base URL, instead of endpoint (the simulated server)

Credentials: AZURE_OPENAI_API_KEY (sent as ``api-key``), else a Microsoft Entra ID token in AZURE_OPENAI_AD_TOKEN
(sent as ``Authorization: Bearer``), or with ``auth: entra`` tokens from ``DefaultAzureCredential`` for the scope
https://cognitiveservices.azure.com/.default (https://learn.microsoft.com/azure/ai-services/openai/how-to/managed-identity).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from urllib.parse import quote

from runner.errors import AuthError, BadRequest, ModelSetupError, ProviderError, TransientError

from .answer_bounds import bounds_of
from .base import Completion, ProviderSettings, register
from .lean_http import path_segment
from .lean_or_sdk import proxied
from .openai_chat import OpenAIChatProvider, openai_rate
from .openai_errors import sdk_body, status_error
from .setup_checks import _importable
from .tls import shared_context

if TYPE_CHECKING:
    from .batching import Batches

#: where the SDK reads the resource's endpoint and API version when the job gives none (openai/lib/azure.py)
ENDPOINT_ENV = "AZURE_OPENAI_ENDPOINT"
VERSION_ENV = "OPENAI_API_VERSION"
TOKEN_ENV = "AZURE_OPENAI_AD_TOKEN"
#: Entra ID scope of the data plane (learn.microsoft.com/azure/ai-services/openai/how-to/managed-identity)
ENTRA_SCOPE = "https://cognitiveservices.azure.com/.default"


@register
class AzureOpenAIProvider(OpenAIChatProvider):
    name: ClassVar[str] = "azure-openai"
    key_env_var: ClassVar[str | None] = "AZURE_OPENAI_API_KEY"
    default_concurrency: ClassVar[int] = 64
    adaptive: ClassVar[bool] = True
    #: genai-prices' Azure provider, which falls back to OpenAI's prices for the OpenAI models it does not list
    price_id: ClassVar[str | None] = "azure"
    supports_batch: ClassVar[bool] = True
    #: Azure caches long prompts as OpenAI does; prompt_cache_key is not in every api-version: ordered, not keyed
    prompt_cache_style: ClassVar[str | None] = "implicit"
    supports_loglikelihood: ClassVar[bool] = False
    #: azure-identity, needed only with ``auth: entra`` (see :meth:`check_sdk`)
    extra: ClassVar[str | None] = "azure"

    class Options(OpenAIChatProvider.Options):
        #: the resource's address, https://NAME.openai.azure.com (else AZURE_OPENAI_ENDPOINT)
        endpoint: str | None = None
        #: the API version sent (else OPENAI_API_VERSION)
        api_version: str | None = None
        #: key: AZURE_OPENAI_API_KEY (or AZURE_OPENAI_AD_TOKEN); entra: azure-identity's DefaultAzureCredential
        auth: Literal["key", "entra"] = "key"
        #: deployment name -> the model it serves (gpt-4o), for prices and the capability table
        deployments: dict[str, str] = {}

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings, endpoints)
        self.options: AzureOpenAIProvider.Options
        self.credential: Any = None
        #: Entra ID's bearer token provider (``auth: entra``), awaited for each request's token
        self.token_provider: Any = None

    # -- settings ------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The resource's origin (``https://NAME.openai.azure.com``), or '' when neither the job nor the
        environment names one."""
        return (self.options.endpoint or os.environ.get(ENDPOINT_ENV) or "").rstrip("/")

    @property
    def api_version(self) -> str:
        return self.options.api_version or os.environ.get(VERSION_ENV) or ""

    @classmethod
    def api_version_of(cls, settings: ProviderSettings | None) -> str | None:
        """The job's ``api_version``, else OPENAI_API_VERSION, as the client reads them."""
        return (settings.api_version if settings is not None else None) or os.environ.get(VERSION_ENV) or None

    @classmethod
    def model_behind(cls, deployment: str, settings: ProviderSettings | None = None) -> str:
        """The model a deployment serves: the job's ``deployments:`` map, else the deployment's own name (a
        deployment named after its model, as Azure's portal proposes)."""
        deployments = (settings.provider_options.get("deployments") if settings is not None else None) or {}
        return str(deployments.get(deployment, deployment))

    @classmethod
    def model_id(cls, model: str, endpoints: dict[str, ProviderSettings] | None = None,
                 settings: ProviderSettings | None = None) -> str:
        """The resource and the deployment: two resources' deployments of one name are two models. The resource is
        the job's ``base_url`` or ``endpoint`` (the planner passes the job's settings), else AZURE_OPENAI_ENDPOINT."""
        options = settings.provider_options if settings is not None else {}
        resource = ((settings.base_url if settings is not None else None) or options.get("endpoint")
                    or os.environ.get(ENDPOINT_ENV, ""))
        resource = str(resource).rstrip("/")
        return f"{resource}/{model}" if resource else model

    def key_variables(self) -> list[str]:
        if self.options.auth == "entra":
            return []
        return [self.settings.api_key_env or self.key_env_var or "", TOKEN_ENV]

    @property
    def key_variable(self) -> str:
        """The variable the credential came from ('' with ``auth: entra``)."""
        return next((v for v in self.key_variables() if os.environ.get(v)), (self.key_variables() or [""])[0])

    @property
    def credential_fix(self) -> str:
        """What to check when the resource refuses the credential."""
        if self.options.auth == "entra":
            return ("the identity DefaultAzureCredential found and its role on the resource (Cognitive Services "
                    "OpenAI User)")
        return f"the variable {self.key_variable}"

    @property
    def max_tokens_field(self) -> str:  # type: ignore[override]
        """``max_completion_tokens`` from API version 2024-09-01-preview on (o-series models take only it), before
        that ``max_tokens`` (the REST reference of each version)."""
        version = self.api_version
        return "max_tokens" if version[:1].isdigit() and version < "2024-09-01" else "max_completion_tokens"

    @property
    def where(self) -> str:
        return f"{self.name} at {self.settings.base_url or self.endpoint or 'an unset endpoint'}"

    def endpoint_key(self, model: str) -> str:
        return f"{self.name}:{self.settings.base_url or self.endpoint}:{','.join(self.key_variables())}:{model}"

    def check_sdk(self, model: str) -> None:
        super().check_sdk(model)
        if self.options.auth == "entra" and not _importable("azure.identity"):
            raise ModelSetupError(f"{self.name}:{model} with auth: entra needs the azure-identity package, which is "
                                  "not installed: pip install 'llm-job-runner[azure]' (no request was sent)")

    def check_key(self, model: str) -> None:
        """The key, and the two settings the Azure client cannot go without: where the resource is and which
        API version to speak."""
        if not self.settings.base_url and not self.endpoint:
            raise ModelSetupError(f"{self.name}:{model} needs its resource's endpoint: set providers: {self.name}: "
                                  f"endpoint: https://NAME.openai.azure.com in the job, or export {ENDPOINT_ENV} "
                                  "(no request was sent)")
        if not self.api_version:
            raise ModelSetupError(f"{self.name}:{model} needs an API version: set providers: {self.name}: "
                                  f"api_version: (e.g. \"2024-10-21\") in the job, or export {VERSION_ENV} "
                                  "(no request was sent)")
        super().check_key(model)

    # -- the client ----------------------------------------------------------------------------------

    def _credentials(self) -> dict[str, Any]:
        """The SDK client's credential argument: Entra ID's token provider, the static token, or the key."""
        if self.options.auth == "entra":
            return {"azure_ad_token_provider": self.token_provider}
        variable = next((v for v in self.key_variables() if os.environ.get(v)), None)
        if variable == TOKEN_ENV:
            return {"azure_ad_token": os.environ[TOKEN_ENV]}
        # check_key has made sure one is set; a direct caller without one gets the service's 401
        return {"api_key": os.environ.get(variable or "", "") or "no-key"}

    def _sdk_client(self) -> Any:
        import openai

        from .bounded_httpx import bounded_client

        place = {"base_url": self.settings.base_url} if self.settings.base_url else {"azure_endpoint": self.endpoint}
        return openai.AsyncAzureOpenAI(
            **self._credentials(), **place,
            api_version=self.api_version,
            max_retries=0,  # the runner owns retries (ARCHITECTURE.md invariant 4)
            timeout=self.settings.timeout,
            http_client=bounded_client(openai.DefaultAioHttpClient, self.settings,
                                       timeout=self.settings.timeout,
                                       verify=shared_context()),
        )

    async def start(self) -> None:
        """The lean wire at the SDK's base URL (the job's ``base_url`` as it is, else ``{endpoint}/openai``), with the
        SDK's auth header (``api-key``, or ``Authorization: Bearer`` with a token, Entra ID's fetched per request by
        :meth:`_lean` as the SDK's token provider is called); the SDK client where a proxy applies (and on first use
        for the Batch API)."""
        if self.options.auth == "entra":
            from azure.identity.aio import DefaultAzureCredential, get_bearer_token_provider

            self.credential = DefaultAzureCredential()
            self.token_provider = get_bearer_token_provider(self.credential, ENTRA_SCOPE)
        if self.sdk_needed():
            self.client = self._sdk_client()
            return
        from .lean_http import LeanWire

        credentials = self._credentials()
        headers = ({"api-key": credentials["api_key"]} if "api_key" in credentials
                   else {"Authorization": f"Bearer {credentials['azure_ad_token']}"}
                   if "azure_ad_token" in credentials else {})
        self.wire = LeanWire(self.settings.base_url or f"{self.endpoint}/openai", "", self.settings.timeout,
                             headers=headers, tls=shared_context, error_of=self._status_error,
                             bounds=bounds_of(self.settings))

    def sdk_needed(self) -> bool:
        if not self.lean_wire:
            return True
        return "OPENAI_CUSTOM_HEADERS" in os.environ or proxied(self.settings.base_url or self.endpoint)

    def chat_path(self, model: str) -> str:
        """``/deployments/{deployment}/chat/completions?api-version=...``, where the SDK's client sends a request
        for the deployment ``model`` (its body keeps ``model`` too)."""
        return f"/deployments/{path_segment(model)}/chat/completions?api-version={quote(self.api_version, safe='')}"

    async def _lean(self, method: str, path: str, body: Any = None, passing: tuple[int, ...] = ()) -> Any:
        assert self.wire is not None, "start() was not awaited"
        headers = None
        if self.token_provider is not None:
            try:
                headers = {"Authorization": f"Bearer {await self.token_provider()}"}
            except Exception as exc:
                raise self._entra_refusal(exc) from exc
        return await self.wire.request(method, path, body, where=self.where, passing=passing, headers=headers)

    def _status_error(self, status: int, body: Any, headers: Mapping[str, str]) -> ProviderError:
        """The OpenAI mapping of an error answer (``openai_errors.status_error``), a refused credential worded as
        :meth:`map_errors` words it."""
        error = status_error(self.where, self.key_variable, status, sdk_body(body), headers)
        return self._credential_refused(error) if isinstance(error, AuthError) else error

    def _credential_refused(self, exc: AuthError) -> AuthError:
        return AuthError(f"{self.where}: the credential was refused ({exc.status}); check {self.credential_fix}",
                         status=exc.status)

    def _entra_refusal(self, exc: Exception) -> Exception:
        """Entra ID's failure to give a token (no credential found) as an auth error; any other exception as it is."""
        from azure.core.exceptions import ClientAuthenticationError  # what the credential raises

        if not isinstance(exc, ClientAuthenticationError):
            return exc
        return AuthError(f"{self.where}: no Microsoft Entra ID token could be had for auth: entra "
                         f"({type(exc).__name__}); sign in (az login) or set the managed identity's variables",
                         status=401)

    async def aclose(self) -> None:
        await super().aclose()
        if self.credential is not None:
            await self.credential.close()
            self.credential = None

    def completion_of(self, body: Any, headers: Mapping[str, str] | None = None) -> Completion:
        """OpenAI's answer; Azure's rate-limit headers are only ``x-ratelimit-remaining-{requests,tokens}``
        (learn.microsoft.com/azure/ai-services/openai/how-to/quota), read as windows of unknown size."""
        completion = super().completion_of(body, headers)
        if completion.rate is None and headers is not None and ("x-ratelimit-remaining-requests" in headers
                                                                or "x-ratelimit-remaining-tokens" in headers):
            completion.rate = openai_rate(headers)
        return completion

    def batches(self) -> Batches:
        from .azure_batch import AzureBatches

        return AzureBatches(self)

    @contextlib.contextmanager
    def map_errors(self) -> Iterator[None]:
        """The OpenAI mapping (a refused credential names where it came from), and Entra ID's own failures (no
        credential found) as an auth error (the SDK path: the Batch API, a proxy)."""
        try:
            with super().map_errors():
                yield
        except AuthError as exc:
            raise self._credential_refused(exc) from exc
        except ProviderError:
            raise
        except Exception as exc:
            if self.options.auth != "entra":
                raise
            refusal = self._entra_refusal(exc)
            if refusal is exc:
                raise
            raise refusal from exc

    # -- pre-flight -----------------------------------------------------------------------------------

    async def probe(self, model: str) -> None:
        """The models list (free: the endpoint answers, takes the key and the API version), then a request to the
        deployment with no messages: the data plane has no deployment lookup, and Azure routes a request to its
        deployment (404 DeploymentNotFound) before the model validates its body (a 400, not billed), so it tells
        whether the deployment exists without spending a token."""
        label = f"{self.name}:{model}"
        version = quote(self.api_version, safe="")
        try:
            if self.wire is not None:
                await self._lean("GET", f"/models?api-version={version}")
            else:
                assert self.client is not None, "start() was not awaited"
                with self.map_errors():
                    await self.client.models.list()
        except AuthError as exc:
            raise AuthError(f"{label}: the resource refused the credential; check {self.credential_fix}",
                            status=exc.status) from exc
        except TransientError as exc:
            if exc.status is None:
                raise TransientError(f"{label}: {self.where} cannot be reached ({exc.error_class}); check the "
                                     "endpoint setting or start the service", error_class=exc.error_class) from exc
            raise
        except BadRequest as exc:
            raise ModelSetupError(f"{label}: the resource refused API version {self.api_version!r} ({exc}); set "
                                  f"providers: {self.name}: api_version to one Azure supports") from exc
        try:
            if self.wire is not None:
                await self._lean("POST", self.chat_path(model),
                                 {"messages": [], "model": model, "max_completion_tokens": 1})
            else:
                assert self.client is not None, "start() was not awaited"
                with self.map_errors():
                    await self.client.chat.completions.create(model=model, messages=[], max_completion_tokens=1)
        except BadRequest as exc:
            if exc.status == 404:
                raise ModelSetupError(f"{label}: the resource has no deployment named {model!r}; deploy it or name "
                                      "one of its deployments") from exc
