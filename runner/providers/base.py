"""The one small protocol every provider implements, and the registry that names them.

A provider turns the runner's request (messages + generation parameters) into one API call and the answer
back into a :class:`Completion`. It raises only the runner's own errors (``runner.errors``); each provider
translates its SDK's exceptions in one place.

A provider is one class, named by an entry point of the group ``runner.providers`` (:data:`ENTRY_POINT_GROUP`),
the bundled ones in this package's pyproject.toml and a plug-in's in its own package's ::

    [project.entry-points."runner.providers"]
    foo = "my_pkg.foo:FooProvider"

    class FooProvider(Provider):
        name = "foo"                      # models are written foo:MODEL; the entry point's name
        key_env_var = "FOO_API_KEY"
        price_id = None                   # genai-prices' provider id; None: free unless the job prices it

        class Options(Provider.Options):  # its own settings under providers: {foo: {...}}, if any
            region: str = "eu"

        async def execute(self, model, messages, params) -> Completion: ...

The registry (:data:`PROVIDERS`, an entry-point registry of runner/providers/registry.py over :class:`Provider`)
lists the entry points' names without importing anything (:func:`provider_names`) and imports a class the first
time a job names it (:func:`provider_class`), so a plug-in that fails to import, or a cloud provider whose module is
missing, is one sentence when it is named and harmless when it is not. Provider modules import their SDKs inside
the methods that use them, so that loading a class (``runner validate``) stays light. :func:`register` adds a class
directly (tests' fakes; ``@register`` on a bundled class is harmless).

This module is the contract's one import point: the records a provider trades in (:class:`Completion` and the
others of runner/providers/records.py) are imported from here. The engine hands a provider what it needs (its
settings, with the connection pool its SDK clients need: :meth:`ProviderSettings.with_pool_size`); nothing here
imports runner/engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from runner.errors import BadRequest, ModelSetupError
from runner.providers import answer_bounds
from runner.providers.records import (
    LEAN_WIRE,
    CacheMarks,
    Completion,
    ContinuationScore,
    RateWindow,
    StoredPrompt,
    loglikelihood_completion,
    package_version,
    parse_loglikelihoods,
    stamp,
)
from runner.providers.registry import EntryPointRegistry
from runner.providers.setup_checks import SetupChecks

if TYPE_CHECKING:
    from .batching import Batches

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT", "ENTRY_POINT_GROUP", "PROVIDERS", "CacheMarks", "Completion", "ContinuationScore",
    "LEAN_WIRE", "Provider", "ProviderSettings", "RateWindow", "StoredPrompt",
    "loglikelihood_completion", "parse_loglikelihoods", "provider_class", "provider_names", "register", "split_model",
    "stamp", "unregister",
]


#: requests in flight per endpoint when neither the provider's nor the job's ``max_in_flight`` (nor an explicit
#: ``concurrency``) says: at the 15-20 kB the runner holds per request in flight (bench/latency.py), at most about
#: 160 MB; enough for a 10,000 RPM key with 30 s answers (6,258 with the headroom). The engine's bound
#: (runner/engine/limits.py), and the SDKs' connection pools where the engine sized none
#: (:func:`runner.providers.bounded_httpx.http_limits`).
DEFAULT_MAX_IN_FLIGHT = 8192


class ProviderSettings(BaseModel):
    """Per-provider settings from the job file's ``providers:`` section (all optional)."""

    model_config = ConfigDict(extra="forbid")

    #: the API's address, instead of the provider's own (a proxy, the simulated server, your own server)
    base_url: str | None = None
    #: the environment variable holding the key; the key itself never appears in a job file
    api_key_env: str | None = None
    #: requests per minute at most (else read from the answers' rate-limit headers)
    rpm: int | None = Field(default=None, gt=0)
    #: tokens per minute at most (input + output)
    tpm: int | None = Field(default=None, gt=0)
    #: input and output tokens per minute, for providers that limit them separately (Anthropic)
    itpm: int | None = Field(default=None, gt=0)
    #: output tokens per minute (as ``itpm``)
    otpm: int | None = Field(default=None, gt=0)
    #: requests in flight at once, a hard cap (with no known rate limit: exactly this many, no ramp)
    concurrency: int | None = Field(default=None, gt=0)
    #: requests in flight per endpoint at most (memory: 15-20 kB each); default the job's, else
    #: ``DEFAULT_MAX_IN_FLIGHT`` (8,192)
    max_in_flight: int | None = Field(default=None, gt=0, le=1_000_000)
    #: seconds to connect, and between two reads of an answer
    timeout: float = Field(default=60.0, gt=0)
    #: seconds from sending a request to the end of its answer; default the larger of 600 and ``timeout``
    total_timeout: float | None = Field(default=None, gt=0)
    #: MiB one answer may take, as sent and once decompressed (runner/providers/answer_bounds.py)
    max_answer_mb: float = Field(default=answer_bounds.ANSWER_MB, gt=0, le=65536)
    #: MiB a Batch API's results file may take when it is downloaded
    max_download_mb: float = Field(default=answer_bounds.DOWNLOAD_MB, gt=0, le=1048576)
    #: the API version sent (anthropic: 2023-06-01 or 2026-10-21; runner.providers.capabilities)
    api_version: str | None = None
    #: ask the provider's token-counting endpoint for each distinct prompt's exact input tokens, where it has one
    #: (Claude and Gemini: ``Provider.count_request``), so that a budget reserves those instead of the byte bound;
    #: false: the byte bound, and no count requests (runner/engine/exact_counts.py)
    count_tokens: bool = True
    #: requests per minute to that counting endpoint (its own limit, apart from the model's: Anthropic's tier 1 is
    #: 100); None: sent as it takes them, pausing for a 429's Retry-After
    count_rpm: int | None = Field(default=None, gt=0)
    #: the embedded model's settings (``LocalProvider.Options``), kept here so job files keep validating
    model_path: str | None = None
    #: the embedded model's context window in tokens
    n_ctx: int = Field(default=2048, gt=0)

    #: keys no field above names but some registered provider's ``Options`` declares; each provider
    #: validates the ones it gets against its own ``Options`` (``Provider.options_from``)
    _provider_options: dict[str, Any] = PrivateAttr(default_factory=dict)
    #: the connections an SDK client made with these settings may hold, as the engine sized them
    #: (:meth:`with_pool_size`); not a setting of the job file, never dumped
    _pool_size: int | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _declared_by_a_provider(cls, data: Any, handler: Callable[[Any], ProviderSettings]) -> ProviderSettings:
        """Let through the keys a provider declares in its ``Options``; any other unknown key stays an error
        (``extra_forbidden``, at the key's own location, so the job file's message names its line)."""
        taken: dict[str, Any] = {}
        if isinstance(data, Mapping) and any(key not in cls.model_fields for key in data):
            declared = _declared_options(getattr(data, "provider", None))
            taken = {key: value for key, value in data.items() if key not in cls.model_fields and key in declared}
            data = {key: value for key, value in data.items() if key not in taken}
        settings = handler(data)
        settings._provider_options.update(taken)
        return settings

    @model_serializer(mode="wrap")
    def _with_provider_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The provider-declared keys are dumped beside the shared ones: the job a run stores (``runner resume``)
        and its fingerprint keep a provider's own settings (vertex's project, azure-openai's deployments)."""
        data = handler(self)
        data.update(self._provider_options)
        return data

    def answer_seconds(self) -> float:
        """Seconds a whole answer may take (``total_timeout``, else the larger of 600 and ``timeout``)."""
        return self.total_timeout if self.total_timeout is not None else max(answer_bounds.TOTAL_SECONDS, self.timeout)

    @property
    def provider_options(self) -> dict[str, Any]:
        """The provider-declared keys given beside the shared ones (see ``Provider.Options``)."""
        return dict(self._provider_options)

    def with_pool_size(self, size: int) -> ProviderSettings:
        """These settings, with the connection pool the engine computed for their SDK clients (the requests it lets
        go to one endpoint at once: ``connection_pool_size`` of runner/engine/endpoints.py, from this provider's
        bounds and the job's ``max_in_flight``). A copy: the job's own settings are left as the file gave them."""
        sized = self.model_copy()
        sized._pool_size = size
        return sized

    @property
    def pool_size(self) -> int:
        """The connections an SDK client made with these settings may hold: as the engine sized them
        (:meth:`with_pool_size`), else (settings no engine sized: a provider built directly) these settings' own
        bound on requests in flight, an explicit ``concurrency`` or ``max_in_flight``, else
        ``DEFAULT_MAX_IN_FLIGHT``."""
        if self._pool_size is not None:
            return self._pool_size
        bounds = [bound for bound in (self.concurrency, self.max_in_flight) if bound]
        return min(bounds) if bounds else DEFAULT_MAX_IN_FLIGHT


class Provider(SetupChecks, ABC):
    """Base class: set the class attributes, implement :meth:`execute`; decorate with :func:`register`."""

    #: the prefix used in job files: ``name:model``
    name: ClassVar[str]
    #: in-flight requests per endpoint when the job sets no ``concurrency``
    default_concurrency: ClassVar[int] = 16
    #: whether an endpoint with no configured limits adapts its concurrency until the server's rate-limit
    #: headers say what they are (network providers); the bound is then ``concurrency`` or the default
    adaptive: ClassVar[bool] = False
    #: genai-prices' provider id for this provider's models; None: free unless the job's ``prices:`` price them
    price_id: ClassVar[str | None] = None
    #: whether :meth:`loglikelihood` can score continuations (a chat-only API cannot)
    supports_loglikelihood: ClassVar[bool] = False
    #: whether :meth:`batches` gives this provider's Batch API (``runner.providers.batching``)
    supports_batch: ClassVar[bool] = False
    #: the fewest requests its Batch API takes in one batch (Bedrock batch inference: 100); the engine sends a
    #: smaller group online
    batch_min_lines: ClassVar[int] = 1
    #: how its API caches prompts, for the runner's planning (runner/engine/prompt_cache.py): "explicit"
    #: (breakpoints the request marks, Anthropic's cache_control), "keyed" (automatic, steered by a key: OpenAI's
    #: prompt_cache_key), "implicit" (automatic: Gemini), or None (no prompt cache the runner knows of)
    prompt_cache_style: ClassVar[str | None] = None
    #: whether its API keeps a prompt prefix the runner stores, billed per token-hour of storage (Gemini's explicit
    #: cached contents): :meth:`store_prompt` and its neighbours; runner/engine/stored_prompts.py decides when one
    #: pays for itself
    stores_prompts: ClassVar[bool] = False
    #: the distribution whose client sends its requests (its version goes into each result line's provenance)
    sdk_package: ClassVar[str | None] = None

    class Options(BaseModel):
        """This provider's own settings beyond the shared :class:`ProviderSettings`; a provider that has some
        subclasses this. Values come from the job's ``providers:`` entry (``Provider.options_from``)."""

        model_config = ConfigDict(extra="forbid")

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        self.settings = settings
        self.options = self.options_from(settings)

    @classmethod
    def options_from(cls, settings: ProviderSettings) -> Options:
        """This provider's :class:`Options` from its settings: the shared fields it declares, if set, and the
        provider-declared keys; a key meant for another provider is a ``ModelSetupError``."""
        fields = cls.Options.model_fields
        shared = set(fields) & set(ProviderSettings.model_fields)
        given = {k: v for k, v in settings.model_dump(include=shared, exclude_unset=True).items() if k in shared}
        given.update(settings.provider_options)
        try:
            return cls.Options.model_validate(given)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            key = ".".join(str(part) for part in error["loc"])
            problem = "is not one of its settings" if error["type"] == "extra_forbidden" else error["msg"]
            raise ModelSetupError(f"providers: {cls.name}: {key} {problem} (its settings: "
                                  f"{', '.join([*ProviderSettings.model_fields, *fields])})") from exc

    @classmethod
    def sends_batches(cls, settings: ProviderSettings) -> bool:
        """Whether an endpoint of this provider with ``settings`` sends Batch API lines, asked without building it
        (a pool picks the endpoint its batches go through): the class's ``supports_batch``, unless the provider
        needs settings for it (Vertex, Bedrock)."""
        return cls.supports_batch is True

    @classmethod
    def count_input_tokens(cls, model: str, messages: Iterable[Mapping[str, Any]]) -> int:
        """Input tokens of a chat request, counted before it is sent (budget reservations, estimates): by
        default an upper-leaning estimate (``tokens.estimate_input_tokens``); a provider whose tokenizer is known
        counts exactly, and says so in :meth:`tokens_exact`."""
        from .tokens import estimate_input_tokens

        return estimate_input_tokens(messages)

    @classmethod
    def tokens_exact(cls, model: str) -> bool:
        """Whether :meth:`count_input_tokens` is the count the provider will report (for text messages)."""
        return False

    #: whether :meth:`count_input_tokens` needs a tiktoken encoding (:meth:`count_encoding` says which)
    needs_encoding: ClassVar[bool] = True

    @classmethod
    def count_encoding(cls, model: str) -> str | None:
        """The tiktoken encoding :meth:`count_input_tokens` builds to count (None: it needs none), which the engine
        builds off the path to the first request (``tokens.build_soon``)."""
        from .tokens import FALLBACK_ENCODING

        return FALLBACK_ENCODING

    def count_request(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any]
                      ) -> dict[str, Any] | None:
        """What this provider's token-counting endpoint is asked to count for a request of ``model`` (JSON data,
        as :meth:`count_tokens` sends it; the engine keys the count it stores by a hash of it:
        runner/providers/token_counts.py), or None where the provider has no such endpoint for ``model`` (the
        default): a budget then reserves the byte bound (runner/providers/tokens.py)."""
        return None

    async def count_tokens(self, model: str, request: dict[str, Any]) -> int:
        """The input tokens the provider counts for ``request`` (from :meth:`count_request`), asked of its
        token-counting endpoint (a call that costs nothing); raises the runner's errors."""
        raise BadRequest(f"{self.name}:{model}: this provider has no token-counting endpoint")

    def count_reserved(self, model: str, counted: int) -> int:
        """The input tokens a budget reserves for a prompt :meth:`count_tokens` counted ``counted``: the count
        itself where the provider charges what it counts (the default)."""
        return counted

    def count_endpoint(self, model: str) -> str:
        """The rate limiter the count requests of ``model`` share (by default one per provider and key: the
        counting endpoints' limits are their own, not the model's)."""
        return self.endpoint_key("#count-tokens")

    @classmethod
    def api_version_of(cls, settings: ProviderSettings | None) -> str | None:
        """The API version requests would be sent with, as far as the job and the environment say (the capability
        table's rules may depend on it); by default the job's ``api_version``."""
        return settings.api_version if settings is not None else None

    @classmethod
    def model_behind(cls, model: str, settings: ProviderSettings | None = None) -> str:
        """The model a name serves, for its price and the capability table (azure-openai: a deployment's model, from
        the job's ``deployments:``); by default the name itself."""
        return model

    @classmethod
    def capability_model(cls, model: str) -> tuple[str, str] | None:
        """The (provider, model) of ``runner/providers/capabilities.py``'s table whose rules this provider's
        ``model`` follows when it is not the table's own name (Claude on Vertex or Bedrock, OpenRouter's
        ``openai/…``); None: the table is read under this provider's name."""
        return None

    @classmethod
    def model_id(cls, model: str, endpoints: dict[str, ProviderSettings] | None = None,
                 settings: ProviderSettings | None = None) -> str:
        """The id that goes into the cache key (a provider may resolve aliases here); ``settings``: the job's
        ``providers:`` entry of this provider (azure-openai's resource is part of its models' id)."""
        return model

    def settings_for(self, model: str) -> ProviderSettings:
        """The settings (limits, timeout) that apply to ``model``'s endpoint."""
        return self.settings

    def endpoint_key(self, model: str) -> str:
        """Requests sharing this string share rate limiters (provider + key + model): the key is named by its
        variable, never by its value."""
        return f"{self.name}:{self.settings.base_url or ''}:{','.join(self.key_variables())}:{model}"

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open clients or load weights; raise ``ModelSetupError`` with the fix when that fails."""

    def sent_with(self, model: str, *, batch: bool = False) -> str | None:
        """What sends ``model``'s requests, for the result lines' provenance: ``lean wire`` where the runner's own
        HTTP client does (``self.wire``), else the SDK and its version; a Batch API always goes through its SDK."""
        if not batch and getattr(self, "wire", None) is not None:
            return LEAN_WIRE
        return package_version(self.sdk_package)

    @abstractmethod
    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        """Send one request and return its completion, or raise a ``runner.errors.ProviderError``."""

    async def loglikelihood(self, model: str, pairs: list[tuple[str, str]]) -> Completion:
        """Score each ``(context, continuation)`` pair: the summed log-probability of the continuation's tokens
        given the context, as :func:`loglikelihood_completion` writes it (one HTTP call or one model pass for
        all pairs where the API allows). Providers that can set ``supports_loglikelihood``; the others say
        so here, before anything is sent."""
        raise BadRequest(f"{self.name}:{model} cannot score log-likelihoods (a chat-only API); use a local model, "
                         "an openai-compatible completions server, or the stage's prompt form")

    def mark_prompt_cache(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                          marks: CacheMarks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and parameters a request to ``model`` is sent with, given the prompt-cache ``marks`` the
        runner planned for it (new objects: the task's own, which key the memo, stay as they are); unchanged by
        default."""
        return messages, params

    def stores_prompts_for(self, model: str) -> bool:
        """Whether the runner may store prompt prefixes of ``model`` with this endpoint (see ``stores_prompts``; a
        provider's setting may turn it off)."""
        return self.stores_prompts

    async def store_prompt(self, model: str, messages: list[dict[str, Any]], seconds: float,
                           label: str) -> StoredPrompt:
        """Have the provider keep ``messages`` (a prompt's leading messages) for ``seconds``, labelled ``label``."""
        raise BadRequest(f"{self.name} keeps no stored prompt prefixes")

    async def keep_prompt(self, name: str, seconds: float) -> float:
        """Keep the stored prefix ``name`` ``seconds`` from now; its new expiry (Unix time)."""
        raise BadRequest(f"{self.name} keeps no stored prompt prefixes")

    async def drop_prompt(self, name: str) -> None:  # noqa: B027 - optional hook
        """Delete the stored prefix ``name`` (one already gone is no error)."""

    def prompt_gone(self, name: str) -> bool:
        """Whether a request found the stored prefix ``name`` gone (expired, deleted) since the last asking."""
        return False

    async def stored_prompts(self, model: str) -> list[StoredPrompt]:
        """The prefixes stored for ``model`` that have not expired, with their labels."""
        return []

    def batch_unavailable(self, model: str) -> str | None:
        """Why this endpoint cannot batch ``model`` though the provider has a Batch API (a setting the job leaves
        out), as the end of one sentence naming what to set; None when there is no such reason."""
        return None

    def batches(self) -> Batches:
        """This provider's Batch API, over the client :meth:`start` opened; providers that have one set
        ``supports_batch``, the others say so here, before anything is sent."""
        raise BadRequest(f"{self.name} has no Batch API in this runner; use mode: online for its models")

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release clients and files."""


# -- the registry ------------------------------------------------------------------------------------------

#: the entry-point group naming every provider class, the bundled ones (this package's pyproject.toml) and
#: plug-ins' alike: ``name = "module:Class"``
ENTRY_POINT_GROUP = "runner.providers"
#: every provider, by name (runner/providers/registry.py): the entry points of ``ENTRY_POINT_GROUP``, loaded when
#: first named, and the classes handed to :func:`register` directly (tests' fakes). Without installed metadata this
#: package's own modules stand in for the entry points, less those that define no provider class.
PROVIDERS: EntryPointRegistry[type[Provider]] = EntryPointRegistry(
    Provider, ENTRY_POINT_GROUP, package=__package__ or "runner.providers", skip=("base", "tokens", "pricing"),
    noun="provider")
register = PROVIDERS.register
unregister = PROVIDERS.unregister
#: the known providers' names, sorted (``aliases=True``: with their aliases); nothing is imported to list them
provider_names = PROVIDERS.names
#: the provider class a name (or alias) names, loaded from its entry point the first time it is asked for;
#: ``KeyError`` for no such provider, ``ModelSetupError`` (one sentence) when its entry point does not load
provider_class = PROVIDERS.load


class ProviderEntry(dict):  # type: ignore[type-arg]
    """A job's settings of one provider as its file gives them, with the provider they are for (runner/spec/schema.py
    marks its ``providers:`` and ``endpoints:`` entries): only that provider's ``Options`` are loaded to check them."""

    def __init__(self, settings: Mapping[str, Any], provider: str) -> None:
        super().__init__(settings)
        self.provider = provider


def _declared_options(provider: str | None = None) -> set[str]:
    """The keys ``provider``'s ``Options`` declares; without one (or where it is not registered or fails to load:
    said when a job names it), every key some provider's ``Options`` declares, every provider that loads being
    loaded for this (some 30 ms of a start)."""
    if provider is not None:
        try:
            return set(provider_class(provider).Options.model_fields)
        except (KeyError, ModelSetupError):
            pass
    for name in provider_names():
        try:
            provider_class(name)
        except ModelSetupError:
            pass
    return {key for cls in list(PROVIDERS.classes.values()) for key in cls.Options.model_fields}


def split_model(spec: str) -> tuple[str, str]:
    """``"sim:gpt-4o"`` -> ``("sim", "gpt-4o")``; ValueError (its message one sentence naming the model) when either
    part is missing or blank."""
    provider, sep, model = spec.partition(":")
    if not sep or not provider.strip():
        raise ValueError(f"model {spec!r} must be written provider:model, e.g. local:smollm2")
    if not model.strip():
        raise ValueError(f"model {spec!r} has no model name after the colon: write it as {provider.strip()}:MODEL")
    return provider, model
