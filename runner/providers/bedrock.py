"""AWS Bedrock: any model through the Converse API (the request and answer in :mod:`runner.providers.bedrock_converse`),
Claude models through InvokeModel with the Messages body (:mod:`runner.providers.bedrock_claude`), so that thinking,
structured output and the capability table behave for them as for ``anthropic:``.

Models are named by their Bedrock id, inference profiles included: ``bedrock:amazon.nova-pro-v1:0``,
``bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0`` (the job's model string is split at its first colon, so
the id keeps its own). Credentials come from the standard AWS chain only (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` or ``providers: {bedrock: {profile: ...}}``, the
shared files, SSO, instance and container roles, and a Bedrock API key in ``AWS_BEARER_TOKEN_BEDROCK``), as
botocore's session resolves them: never read into the runner's settings, stored or shown. The region is
``providers: {bedrock: {region: ...}}``, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else the profile's.

Online requests of both families go over the lean wire (:mod:`runner.providers.bedrock_wire` on ``lean_http.py``):
``POST /model/{modelId}/converse`` with the body botocore's serializer writes, ``POST /model/{modelId}/invoke`` with
the body ``AsyncAnthropicBedrock`` sends, each signed by SigV4 (:mod:`runner.providers.sigv4`, AWS's published
algorithm, checked against botocore's ``SigV4Auth``) with the chain's credentials (refreshed by botocore, in a worker
thread, when it says so; the environment's keys read as botocore's first provider reads them, without importing
botocore, where no profile is named) or sent with the Bedrock API key as a bearer token; the answers read as boto3
and the anthropic SDK read them, so the mappings above are theirs unchanged. botocore's credential chain is used,
only without its per-request client machinery, which cost several times the CPU of the request itself
(bench/RESULTS.md). The pre-flight probe's lookup of the model on the control plane goes over the wire too, signed
alike (:mod:`runner.providers.bedrock_probe`).

boto3 and the anthropic SDK stay for what only they do here: batch inference, CountTokens, and every online request
(and probe) where a proxy applies to the endpoint (``lean_or_sdk.proxied``) or a variable sends the SDKs to another
endpoint (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_BEDROCK_RUNTIME, ANTHROPIC_BEDROCK_BASE_URL, FIPS or dual-stack
endpoints). boto3 is synchronous: its calls run in a thread pool of this provider's own, as wide as its concurrency
(and botocore's connection pool as wide), or in the loop's default threads when the wire serves the online requests.
botocore's retries are off (``total_max_attempts: 1``, the runner retries: ARCHITECTURE.md invariant 4). Bedrock
sends no rate-limit headers: the endpoint's concurrency adapts.

Batch inference (:mod:`runner.providers.bedrock_batch`) needs ``providers: {bedrock: {batch_folder: s3://BUCKET/PREFIX,
batch_role_arn: arn:aws:iam::ACCOUNT:role/NAME}}``: the S3 folder its records and answers go through and the service
role Bedrock assumes to read and write it. Without both, ``mode: auto`` sends bedrock models online and ``mode: batch``
is refused before anything is sent (:meth:`BedrockProvider.batch_unavailable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import field_validator

from runner.errors import ModelSetupError, ProviderError

from .answer_bounds import bounds_of
from .base import LEAN_WIRE, CacheMarks, Completion, Provider, ProviderSettings, register
from .bedrock_errors import CREDENTIAL_HELP, bearer_over_http, bedrock_error, boto_errors, refresh_failed
from .bedrock_ids import claude_name
from .lean_or_sdk import proxied
from .records import package_version

if TYPE_CHECKING:
    from .aws_sessions import AwsSessions
    from .batching import Batches
    from .bedrock_claude import BedrockClaude
    from .bedrock_wire import AwsSigner
    from .lean_http import Answer, LeanWire

#: variables that send the SDKs to another endpoint than the region's (botocore's and the anthropic SDK's): the
#: SDKs are kept where one is set, rather than the wire reading them as each SDK does
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "ANTHROPIC_BEDROCK_BASE_URL",
                       "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
_ROLE_ARN = re.compile(r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+")
#: what a job needs for batch inference, as the sentence that says so names it
BATCH_SETTINGS = ("providers: {bedrock: {batch_folder: s3://BUCKET/PREFIX, batch_role_arn: "
                  "arn:aws:iam::ACCOUNT:role/NAME}}")


@register
class BedrockProvider(Provider):
    name: ClassVar[str] = "bedrock"
    sdk_modules: ClassVar[tuple[str, ...]] = ("boto3", "anthropic")
    extra: ClassVar[str | None] = "bedrock"
    key_env_var: ClassVar[str | None] = None  # the AWS credential chain, not one variable
    default_concurrency: ClassVar[int] = 16
    adaptive: ClassVar[bool] = True
    price_id: ClassVar[str | None] = "aws"  # genai-prices' "AWS Bedrock" (ids with and without a geography prefix)
    #: batch inference (model invocation jobs); an instance batches once its S3 folder and role are set
    supports_batch: ClassVar[bool] = True
    #: "Minimum number of records per batch inference job" (docs.aws.amazon.com/general/latest/gr/bedrock.html)
    batch_min_lines: ClassVar[int] = 100
    #: Claude on Bedrock caches what a request marks (cache_control in its Messages body); the Converse models'
    #: cachePoint blocks are not planned (prefixes.cache_rule has no rule for them)
    prompt_cache_style: ClassVar[str | None] = "explicit"
    #: online requests go over the lean wire (runner/providers/bedrock_wire.py) unless a proxy or another endpoint
    #: applies; False: boto3 and the anthropic SDK always
    lean_wire: ClassVar[bool] = True

    class Options(Provider.Options):
        #: the AWS region (else AWS_REGION, AWS_DEFAULT_REGION, the profile's)
        region: str | None = None
        #: a named profile of the shared AWS files (else AWS_PROFILE)
        profile: str | None = None
        #: batch inference: the S3 folder (s3://BUCKET/PREFIX) its records and answers go through
        batch_folder: str | None = None
        #: batch inference: the service role Bedrock assumes to read and write that folder
        batch_role_arn: str | None = None

        @field_validator("batch_folder")
        @classmethod
        def _folder(cls, value: str | None) -> str | None:
            from .s3_files import Folder

            if value is not None:
                Folder.parse(value)  # ValueError: the job file's error names the key
            return value

        @field_validator("batch_role_arn")
        @classmethod
        def _role(cls, value: str | None) -> str | None:
            # CreateModelInvocationJob.roleArn's pattern (botocore's bedrock service model)
            if value is not None and not _ROLE_ARN.fullmatch(value):
                raise ValueError(f"{value!r} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
            return value

    def sent_with(self, model: str, *, batch: bool = False) -> str | None:
        """The lean wire's online requests; else Claude's online requests go through the anthropic SDK, the rest
        (and batch inference) through boto3."""
        if self.wire is not None and not batch:
            return LEAN_WIRE
        return package_version("anthropic" if claude_name(model) is not None and not batch else "boto3")

    @classmethod
    def capability_model(cls, model: str) -> tuple[str, str] | None:
        """Claude on Bedrock follows anthropic's rules under its Claude name; other models the Converse rule."""
        name = claude_name(model)
        return ("anthropic", name) if name is not None else None

    def __init__(self, settings: ProviderSettings, endpoints: dict[str, ProviderSettings] | None = None) -> None:
        super().__init__(settings)
        self._runtime: Any = None  # boto3's bedrock-runtime client
        #: the lean wire to bedrock-runtime and the signer of its requests (start(), where they serve)
        self.wire: LeanWire | None = None
        self.signer: AwsSigner | None = None
        self._url = ""  # the wire's base URL, as signed
        self.claude: BedrockClaude | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._batch_clients: list[Any] = []  # boto3's bedrock and s3 clients of batch inference, once opened
        # the class batches; this endpoint only with its folder and role (``mode: auto`` sends it online otherwise)
        self.supports_batch = self.sends_batches(settings)  # type: ignore[misc]

    @classmethod
    def sends_batches(cls, settings: ProviderSettings) -> bool:
        """Batch inference only where the endpoint names its S3 folder and the role Bedrock assumes for it."""
        options = cls.options_from(settings)
        return bool(options.batch_folder and options.batch_role_arn)

    # -- region and credentials --------------------------------------------------------------------------

    @property
    def profile(self) -> str | None:
        return self.options.profile or os.environ.get("AWS_PROFILE") or None

    @functools.cached_property
    def _sessions(self) -> AwsSessions:
        """botocore's session of the profile, and boto3's around it, one per process while nothing they read changes
        (:mod:`runner.providers.aws_sessions`)."""
        from .aws_sessions import sessions

        made = sessions(self.profile)
        if self.profile and self.profile not in made.core.available_profiles:
            raise ModelSetupError(f"bedrock: the AWS profile {self.profile!r} is not in the shared AWS files: set "
                                  "providers: {bedrock: {profile: ...}} or AWS_PROFILE to one that is")
        return made

    @property
    def _core(self) -> Any:
        """botocore's session: the credential chain and the profile's region (boto3's wraps it, sharing them)."""
        return self._sessions.core

    @property
    def _session(self) -> Any:
        return self._sessions.boto3()

    def region(self) -> str | None:
        return (self.options.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                or self._core.get_config_variable("region") or None)

    @property
    def where(self) -> str:
        return f"bedrock at {self.settings.base_url or f'bedrock-runtime.{self.region()}.amazonaws.com'}"

    def key_variables(self) -> list[str]:
        return []  # nothing to name in an endpoint key or a message but the region and profile (endpoint_key)

    def check_key(self, model: str) -> None:
        """A region and credentials from the chain, each missing one a sentence; nothing is sent."""
        if not self.region():
            raise ModelSetupError(f"bedrock:{model} needs an AWS region: set providers: {{bedrock: {{region: ...}}}} "
                                  "in the job or export AWS_REGION (or AWS_DEFAULT_REGION) (no request was sent)")
        if os.environ.get("AWS_BEARER_TOKEN_BEDROCK"):
            return  # a Bedrock API key: both SDKs send it as a bearer token
        if self._credentials() is None:
            raise ModelSetupError(f"bedrock:{model} found no AWS credentials: {CREDENTIAL_HELP} (no request was "
                                  "sent)")

    def endpoint_key(self, model: str) -> str:
        return f"{self.name}:{self.settings.base_url or ''}:{self.region()}:{self.profile or ''}:{model}"

    # -- clients -------------------------------------------------------------------------------------------

    def _width(self) -> int:
        return self.settings.concurrency or self.default_concurrency

    def _client(self, service: str, config: Any = None) -> Any:
        """boto3's client of ``service`` for this provider, every answer it reads bounded (bounded_boto.py)."""
        from .bounded_boto import bound_client

        client = self._session.client(service, region_name=self.region(), endpoint_url=self.settings.base_url,
                                      config=config or self._config())
        return bound_client(client, bounds_of(self.settings))

    def runtime_url(self) -> str:
        """bedrock-runtime's base: the job's ``base_url``, else the region's endpoint."""
        from .bedrock_wire import runtime_url

        return (self.settings.base_url or runtime_url(str(self.region()))).rstrip("/")

    def _lean(self) -> bool:
        """Whether online requests take the lean wire: not where a proxy applies to the endpoint, nor where a
        variable sends the SDKs elsewhere (an endpoint URL, FIPS or dual-stack endpoints)."""
        return (self.lean_wire and not proxied(self.runtime_url())
                and not any(os.environ.get(name) for name in _ENDPOINT_VARIABLES))

    async def start(self) -> None:
        """The lean wire and its signer (the chain's credentials resolved in a worker thread: it reads files and
        may ask SSO or a metadata endpoint), else boto3's client and its threads."""
        if self.region() and self._lean():
            from .bedrock_wire import ErrorAnswer
            from .lean_http import LeanWire
            from .tls import shared_context

            await self.aws_signer()
            self._url = self.runtime_url()
            self.wire = LeanWire(self._url, "", self.settings.timeout, headers={}, tls=shared_context,
                                 error_of=ErrorAnswer, bounds=bounds_of(self.settings))
            return
        self._runtime = self._client("bedrock-runtime")
        self._pool = ThreadPoolExecutor(max_workers=self._width(), thread_name_prefix="bedrock")

    async def aws_signer(self) -> AwsSigner:
        """The signer of the wire's requests (the runtime's and the probe's lookup), made once: the Bedrock API key
        (AWS_BEARER_TOKEN_BEDROCK), else the chain's credentials, resolved in a worker thread."""
        if self.signer is None:
            from .bedrock_wire import AwsSigner

            bearer = os.environ.get("AWS_BEARER_TOKEN_BEDROCK") or None
            credentials = None if bearer else await asyncio.to_thread(self._credentials)
            if self.signer is None:  # another request may have made it meanwhile
                self.signer = AwsSigner(credentials, str(self.region()), bearer=bearer)
        return self.signer

    async def signed(self, method: str, url: str, content: bytes, host: str) -> dict[str, str]:
        """The auth headers of one request over the wire (:meth:`AwsSigner.headers`); botocore's failure to find or
        refresh the credentials as one sentence."""
        signer = await self.aws_signer()
        try:
            return await signer.headers(method, url, content, host)
        except Exception as exc:
            from botocore.exceptions import BotoCoreError

            if isinstance(exc, BotoCoreError):  # no credentials, or botocore could not refresh them
                raise refresh_failed(self.where, exc) from exc
            raise

    def bearer_refused(self, url: str, model: str) -> ModelSetupError | None:
        """botocore's refusal of a Bedrock API key sent to a plain http ``url``, which the wire makes too, or None."""
        clear = self.signer is not None and self.signer.bearer and not url.startswith("https")
        return bearer_over_http(self.where, model) if clear else None

    def _credentials(self) -> Any:
        """The chain's credentials: the environment's keys where the chain would answer with them
        (:func:`~runner.providers.aws_sessions.environment_credentials`, no botocore imported), else botocore's
        object (None: the chain found none). Blocking: botocore reads files, and may ask SSO or a metadata
        endpoint."""
        from .aws_sessions import environment_credentials

        found = environment_credentials(self.profile)
        return found if found is not None else self._core.get_credentials()

    @property
    def runtime(self) -> Any:
        """boto3's bedrock-runtime client, where :meth:`start` built it or :meth:`runtime_client` has."""
        return self._runtime

    async def runtime_client(self) -> Any:
        """boto3's bedrock-runtime client: built by :meth:`start` where the wire does not serve, else on first use
        (token counts), in a worker thread (boto3's import and the client's making take a while)."""
        if self._runtime is None:
            client = await asyncio.to_thread(self._client, "bedrock-runtime")
            if self._runtime is None:  # another request may have built it meanwhile
                self._runtime = client
            else:
                client.close()
        return self._runtime

    def _claude(self) -> BedrockClaude:
        if self.claude is None:
            from .bedrock_claude import BedrockClaude

            self.claude = BedrockClaude(self)
        return self.claude

    @property
    def pool(self) -> ThreadPoolExecutor | None:
        """The threads boto3's calls run in (None before :meth:`start`: the loop's default ones)."""
        return self._pool

    def _config(self) -> Any:
        from botocore.config import Config

        return Config(retries={"mode": "standard", "total_max_attempts": 1},  # the runner retries (invariant 4)
                      connect_timeout=self.settings.timeout, read_timeout=self.settings.timeout,
                      max_pool_connections=self._width())

    async def aclose(self) -> None:
        for client in self._batch_clients:
            client.close()
        self._batch_clients = []
        if self.claude is not None:
            await self.claude.aclose()
            self.claude = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None
        if self.wire is not None:
            await self.wire.aclose()

    async def _call(self, model: str, method: Any, pool: ThreadPoolExecutor | None, **kwargs: Any) -> Any:
        """One boto3 call in ``pool`` (None: the loop's default threads), its errors mapped."""
        loop = asyncio.get_running_loop()
        with self.map_errors(model):
            return await loop.run_in_executor(pool, functools.partial(method, **kwargs))

    # -- Converse ------------------------------------------------------------------------------------------

    def converse_request(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        """The Converse request (boto3's keyword arguments) of the runner's messages and parameters
        (:func:`runner.providers.bedrock_converse.converse_request`)."""
        from .bedrock_converse import converse_request

        return converse_request(model, messages, params)

    def converse_completion(self, response: Mapping[str, Any]) -> Completion:
        """A Converse response as a :class:`Completion` (:mod:`runner.providers.bedrock_converse`)."""
        from .bedrock_converse import converse_completion

        return converse_completion(response, self.where)

    def mark_prompt_cache(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                          marks: CacheMarks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if claude_name(model) is None:
            return messages, params
        from .anthropic_messages import cache_blocks

        return cache_blocks(messages, marks), params

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        assert self.wire is not None or self._runtime is not None, "start() was not awaited"
        if claude_name(model) is not None:
            return await self._claude().execute(model, messages, params)
        request = self.converse_request(model, messages, params)
        if self.wire is not None:
            from .bedrock_wire import converse_answer, converse_body, converse_path

            if (refused := self.bearer_refused(self._url, model)) is not None:
                raise refused
            answer = await self.send(model, converse_path(model), converse_body({"modelId": model, **request}))
            return self.converse_completion(converse_answer(answer.content, self.where))
        response = await self._call(model, self.runtime.converse, self._pool, **request)
        return self.converse_completion(response)

    async def send(self, model: str, path: str, content: bytes, *, claude: bool = False) -> Answer:
        """One signed POST of the JSON ``content`` to bedrock-runtime over the wire; an error answer mapped as
        botocore's parser (or, for ``claude``, the anthropic SDK's path) reads it, then by :meth:`error_of`."""
        from .bedrock_wire import ErrorAnswer, claude_error, converse_error

        assert self.wire is not None and self.signer is not None, "start() was not awaited"
        headers = await self.signed("POST", self._url + path, content, self.wire.host_header)
        try:
            return await self.wire.request("POST", path, where=self.where, headers=headers, content=content)
        except ErrorAnswer as answer:
            code, message = (claude_error if claude else converse_error)(answer)
            raise self.error_of(code, answer.status, message, answer.headers, model) from None

    # -- token counting: Claude's, by the runtime's CountTokens (runner/providers/bedrock_claude.py) -------------

    def count_request(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any]
                      ) -> dict[str, Any] | None:
        from .bedrock_claude import count_request

        return count_request(model, messages, params)

    async def count_tokens(self, model: str, request: dict[str, Any]) -> int:
        from .bedrock_claude import count_tokens

        return await count_tokens(self, model, request)

    # -- batch inference -------------------------------------------------------------------------------------

    def batch_unavailable(self, model: str) -> str | None:
        """Why ``mode: batch`` cannot send ``bedrock:model`` (the settings batch inference needs), or None."""
        if self.supports_batch:
            return None
        missing = " and ".join(name for name in ("batch_folder", "batch_role_arn") if not getattr(self.options, name))
        return (f"bedrock:{model} in mode: batch needs an S3 folder and a service role for batch inference: set "
                f"{BATCH_SETTINGS} in the job ({missing} missing), or use mode: auto or online")

    def batches(self) -> Batches:
        """Batch inference over boto3's ``bedrock`` (control plane) and ``s3`` clients, made from this provider's
        session, region and retry settings, their calls in its threads."""
        if not self.supports_batch:
            raise ModelSetupError(str(self.batch_unavailable("*")))
        if self._session.get_credentials() is None:  # S3 takes SigV4 credentials; a Bedrock API key is not one
            raise ModelSetupError("bedrock batch inference stages its records in S3, which takes AWS credentials (a "
                                  "Bedrock API key alone cannot reach S3): set AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance or container role "
                                  "applies")
        from .bedrock_batch import BedrockBatches
        from .s3_files import s3_client

        if not self._batch_clients:
            s3 = s3_client(self._session, self.region(), self.settings.base_url, self.settings.timeout,
                           self._width(), bounds_of(self.settings))
            control = self._client("bedrock")
            self._batch_clients = [control, s3]
        return BedrockBatches(self, *self._batch_clients)

    # -- pre-flight ------------------------------------------------------------------------------------------

    async def probe(self, model: str) -> None:
        """The control plane's lookup of the model (GetFoundationModel, or GetInferenceProfile for a cross-region
        id): free, and it checks the endpoint, the credentials, the region and the model id at once
        (:mod:`runner.providers.bedrock_probe`: over the wire where it serves, else boto3's client)."""
        from .bedrock_probe import probe

        await probe(self, model)

    # -- errors (runner/providers/bedrock_errors.py) -----------------------------------------------------------

    def error_of(self, code: str, status: int | None, message: str, headers: Mapping[str, str] | None,
                 model: str) -> ProviderError:
        """The runner's error for one of Bedrock's (its exception name, HTTP status, message), whichever SDK
        carried it."""
        return bedrock_error(self.where, self.region(), code, status, message, headers, model)

    def map_errors(self, model: str) -> contextlib.AbstractContextManager[None]:
        """botocore's exceptions as the runner's classes, with messages of our own."""
        return boto_errors(self.where, self.settings.timeout, model, self.error_of)
