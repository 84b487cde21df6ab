"""Claude on AWS Bedrock through the anthropic SDK's ``AsyncAnthropicBedrock``: InvokeModel
(``POST /model/{modelId}/invoke``) with the Messages body, the model in the path, ``anthropic_version:
"bedrock-2023-05-31"`` in the body (docs.aws.amazon.com/bedrock/latest/userguide/
model-parameters-anthropic-claude-messages.html).

The Messages mapping is :class:`~runner.providers.anthropic_messages.AnthropicProvider`'s own (``request_of``,
``completion_of``), used by composition under the model's Claude name (``claude_name``), so thinking, structured
output and the capability table's rules are those of ``anthropic:``; sampling fields go as API version 2023-06-01
takes them, which is what Bedrock's ``bedrock-2023-05-31`` is. The version is set in the body on purpose: anthropic
2.x fills in its own default (``2026-10-21``) when none is given, which Bedrock does not take. The SDK signs each
request with SigV4 from the standard AWS chain (or sends ``AWS_BEARER_TOKEN_BEDROCK``); its retries are off.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from runner.errors import AuthError, TransientError

from .anthropic_errors import transport_errors
from .anthropic_messages import AnthropicProvider
from .base import Completion, ProviderSettings
from .bedrock_errors import CREDENTIAL_HELP
from .bedrock_ids import claude_name, foundation_model
from .tls import shared_context
from .token_counts import read_count

if TYPE_CHECKING:
    from .bedrock import BedrockProvider

#: the Messages API version Bedrock takes in the body of a Claude request
BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"


def static_credentials(provider: BedrockProvider) -> dict[str, str | None]:
    """The AWS keys the provider's session found, where they do not expire (the environment's, a shared file's), as
    the anthropic SDK's arguments. Given none, the SDK signs with a boto3 session it keeps for the rest of the
    process per (region, profile), whose keys are the first it found (anthropic/lib/aws/_auth.py's lru_cache): a
    process whose AWS_ACCESS_KEY_ID changed between two runs signed the second with the first's. Keys that refresh
    (SSO, an assumed role) are left to the SDK's session, which refreshes them; a Bedrock API key too."""
    if os.environ.get("AWS_BEARER_TOKEN_BEDROCK"):
        return {}
    found = provider._session.get_credentials()
    if found is None or hasattr(found, "refresh_needed"):  # RefreshableCredentials
        return {}
    return {"aws_access_key": found.access_key, "aws_secret_key": found.secret_key, "aws_session_token": found.token}


@functools.cache
def _messages_api() -> AnthropicProvider:
    """The Messages mapping of Claude's bodies (API version 2023-06-01's rules), without a client."""
    return AnthropicProvider(ProviderSettings(api_version="2023-06-01"))


def count_request(model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any] | None:
    """CountTokens' ``input`` for a request of a Claude model: the InvokeModel body it is sent with, its sampling
    fields left out (they count for nothing); None for the other models, whose requests keep the byte bound."""
    name = claude_name(model)
    if name is None:
        return None
    kwargs, _ = _messages_api().request_of(messages, params, name)
    return {"invokeModel": {"body": {"anthropic_version": BEDROCK_ANTHROPIC_VERSION, **kwargs}}}


async def count_tokens(provider: BedrockProvider, model: str, request: dict[str, Any]) -> int:
    """The runtime's CountTokens (``POST /model/{modelId}/count-tokens``) of the foundation model behind ``model``
    (runner/providers/token_counts.py), through boto3 in the provider's threads; answered ``{"inputTokens": N}``."""
    runtime = await provider.runtime_client()
    body = json.dumps(request["invokeModel"]["body"], ensure_ascii=False, separators=(",", ":")).encode()
    answer = await provider._call(model, runtime.count_tokens, provider.pool, modelId=foundation_model(model),
                                  input={"invokeModel": {"body": body}})
    return read_count(answer, "inputTokens", provider.where)


class BedrockClaude:
    """The Claude half of :class:`~runner.providers.bedrock.BedrockProvider` (opened the first time a Claude model
    is asked): over the provider's lean wire where it serves, else ``AsyncAnthropicBedrock``."""

    def __init__(self, provider: BedrockProvider) -> None:
        self.provider = provider
        settings = provider.settings
        self.messages = AnthropicProvider(ProviderSettings(api_version="2023-06-01", timeout=settings.timeout))
        self.messages.where = provider.where
        self.client: Any = None
        if provider.wire is None:
            self.client = self._sdk_client()

    def _sdk_client(self) -> Any:
        import anthropic

        from .bounded_httpx import bounded_client

        provider, settings = self.provider, self.provider.settings
        try:
            return anthropic.AsyncAnthropicBedrock(
                aws_region=provider.region(),
                aws_profile=provider.options.profile,  # AWS_PROFILE and the rest of the chain: boto3's session
                **static_credentials(provider),
                base_url=settings.base_url,
                max_retries=0,  # the runner owns retries (ARCHITECTURE.md invariant 4)
                timeout=settings.timeout,
                http_client=bounded_client(anthropic.DefaultAioHttpClient, settings,
                                           timeout=settings.timeout,
                                           verify=shared_context()),
            )
        except ValueError as exc:  # a profile named beside AWS_BEARER_TOKEN_BEDROCK, which the SDK refuses
            raise AuthError(f"{provider.where}: the anthropic SDK takes either a Bedrock API key or AWS credentials, "
                            f"not both ({exc}): unset AWS_BEARER_TOKEN_BEDROCK or providers.bedrock.profile") from None

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        kwargs, sampling = self.messages.request_of(messages, params, claude_name(model) or model)
        if self.provider.wire is not None:  # the body AsyncAnthropicBedrock sends: no model (it is in the path)
            from .bedrock_wire import invoke_path

            body = {**kwargs, **sampling, "anthropic_version": BEDROCK_ANTHROPIC_VERSION}
            answer = await self.provider.send(model, invoke_path(model), json.dumps(
                body, ensure_ascii=False, separators=(",", ":")).encode(), claude=True)
            content = answer.content
        else:
            kwargs["extra_body"] = {"anthropic_version": BEDROCK_ANTHROPIC_VERSION, **sampling}
            with self.map_errors(model):
                raw = await self.client.messages.with_raw_response.create(model=model, **kwargs)
            content = raw.http_response.content
        try:
            body = json.loads(content)
        except ValueError as exc:
            raise TransientError(f"{self.provider.where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc
        return self.messages.completion_of(body)

    @contextlib.contextmanager
    def map_errors(self, model: str) -> Iterator[None]:
        """The anthropic SDK's exceptions as the runner's, read as Bedrock's errors (``x-amzn-ErrorType`` names the
        exception, the body is ``{"message": ...}``)."""
        import anthropic

        where = self.provider.where
        try:
            with transport_errors(where, self.provider.settings.timeout):
                yield
        except anthropic.APIStatusError as exc:
            headers = exc.response.headers
            code = (headers.get("x-amzn-errortype") or "").split(":", 1)[0]
            body = exc.body if isinstance(exc.body, dict) else {}
            message = str(body.get("message") or body.get("Message") or "")
            raise self.provider.error_of(code, exc.status_code, message, headers, model) from exc
        except RuntimeError as exc:  # the SDK's SigV4 signing found no credentials (anthropic/lib/aws/_auth.py)
            if "credentials" not in str(exc):
                raise
            raise AuthError(f"{where}: no AWS credentials were found: {CREDENTIAL_HELP}") from exc
