"""The pre-flight probe of a Bedrock model (``BedrockProvider.probe``): the control plane's lookup of the model,
GetFoundationModel (``GET /foundation-models/{modelIdentifier}``), or GetInferenceProfile (``GET
/inference-profiles/{inferenceProfileIdentifier}``) for a cross-region id. It is free, and it checks the endpoint,
the credentials, the region and the model id at once.

The lookup goes over the lean wire (``lean_http.py``) at the control plane's endpoint (the job's ``base_url``, else
``bedrock.{region}.amazonaws.com``), signed as the runtime's requests are, by SigV4 (``sigv4.py``) with the
chain's credentials (service ``bedrock``) or sent with the Bedrock API key (:class:`~runner.providers.bedrock_wire.
AwsSigner`); its error answer is read as botocore's rest-json parser reads it (``bedrock_wire.converse_error``) and
mapped by the provider's one mapping. boto3's ``bedrock`` client asks instead where the wire does not serve: a proxy
applies to the endpoint, or a variable sends boto3 elsewhere (an endpoint URL, FIPS or dual-stack endpoints).
Importing boto3 and loading its client's service model and endpoint rules cost about 0.1 s of CPU, the largest
part of a Bedrock start before this (bench/startup_providers.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runner.errors import AuthError, BadRequest, ModelSetupError, TransientError

from .answer_bounds import bounds_of
from .bedrock_ids import is_profile
from .lean_or_sdk import proxied

if TYPE_CHECKING:
    from .bedrock import BedrockProvider

__all__ = ["control_base", "lean_lookup", "probe"]

#: variables that send boto3's ``bedrock`` client to another endpoint than the region's (botocore's)
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_BEDROCK", "AWS_USE_FIPS_ENDPOINT",
                       "AWS_USE_DUALSTACK_ENDPOINT")
#: the most seconds a lookup may take (connecting, and each read)
PROBE_TIMEOUT = 5.0


def control_base(provider: BedrockProvider) -> str:
    """The control plane's base: the job's ``base_url``, else the region's endpoint."""
    from .bedrock_wire import control_url

    return (provider.settings.base_url or control_url(str(provider.region()))).rstrip("/")


def lean_lookup(provider: BedrockProvider) -> bool:
    """Whether the lookup takes the lean wire: as the runtime's requests, not where a proxy applies to the control
    plane's endpoint nor where a variable sends boto3 elsewhere."""
    return (provider.lean_wire and not proxied(control_base(provider))
            and not any(os.environ.get(name) for name in _ENDPOINT_VARIABLES))


async def probe(provider: BedrockProvider, model: str) -> None:
    """Look ``model`` up (a region and credentials first, as :meth:`BedrockProvider.check_key` asks); an unknown
    model or one this account may not use is a :class:`ModelSetupError`, refused credentials an
    :class:`AuthError`, an endpoint that does not answer a :class:`TransientError`, each one sentence."""
    provider.check_key(model)
    timeout = min(provider.settings.timeout, PROBE_TIMEOUT)
    try:
        if lean_lookup(provider):
            await _over_the_wire(provider, model, timeout)
        else:
            await _through_boto3(provider, model, timeout)
    except (BadRequest, AuthError) as exc:
        if isinstance(exc, AuthError) and exc.error_class != "unknown_model":
            raise
        raise ModelSetupError(f"bedrock:{model} is not a model this account can use in region {provider.region()} "
                              f"({exc}): check the model id and providers: {{bedrock: {{region: ...}}}}") from exc
    except TransientError as exc:
        raise TransientError(f"bedrock:{model} could not be probed ({exc}): is the endpoint right and reachable?",
                             status=exc.status, error_class=exc.error_class) from exc


async def _over_the_wire(provider: BedrockProvider, model: str, timeout: float) -> None:
    """One signed GET of the lookup on a wire of its own, closed after it."""
    from .bedrock_wire import ErrorAnswer, converse_error, lookup_path
    from .lean_http import LeanWire
    from .tls import shared_context

    base = control_base(provider)
    await provider.aws_signer()
    if (refused := provider.bearer_refused(base, model)) is not None:
        raise refused
    wire = LeanWire(base, "", timeout, headers={}, tls=shared_context, error_of=ErrorAnswer,
                    bounds=bounds_of(provider.settings))
    path = lookup_path(model, profile=is_profile(model))
    try:
        headers = await provider.signed("GET", base + path, b"", wire.host_header)
        await wire.request("GET", path, where=provider.where, headers=headers)
    except ErrorAnswer as answer:
        code, message = converse_error(answer)
        raise provider.error_of(code, answer.status, message, answer.headers, model) from None
    finally:
        await wire.aclose()


async def _through_boto3(provider: BedrockProvider, model: str, timeout: float) -> None:
    """The lookup through boto3's ``bedrock`` client, made for it and closed after it, in the loop's default threads
    (a probe may run before ``start``)."""
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=timeout,
                    read_timeout=timeout)
    control = provider._client("bedrock", config)
    try:
        if is_profile(model):
            await provider._call(model, control.get_inference_profile, None, inferenceProfileIdentifier=model)
        else:
            await provider._call(model, control.get_foundation_model, None, modelIdentifier=model)
    finally:
        control.close()
