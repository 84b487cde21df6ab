"""Bedrock's errors as the runner's: one mapping of an error code, HTTP status and message (:func:`bedrock_error`),
whichever path carried them (the lean wire, boto3, the anthropic SDK's Bedrock client, a batch record), and
botocore's exceptions read into it (:func:`boto_errors`). Messages name the variables a user can set, never their
values."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from runner.errors import (
    AuthError,
    BadRequest,
    ModelSetupError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientError,
)

from .answer_bounds import surfaced
from .wire import quoted, retry_after_seconds, words

__all__ = ["CREDENTIAL_HELP", "bearer_in_clear", "bearer_over_http", "bedrock_error", "boto_errors",
           "refresh_failed"]

#: the variables of the standard chain a message may name (never their values)
CREDENTIAL_HELP = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), "
                   "or AWS_PROFILE, or AWS_BEARER_TOKEN_BEDROCK (a Bedrock API key), or run where an instance or "
                   "container role applies")
#: the error codes of Bedrock's exceptions (botocore's bedrock-runtime model) and of the AWS auth layer
_AUTH = ("AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException",
         "MissingAuthenticationTokenException", "IncompleteSignatureException", "ExpiredToken",
         "InvalidClientTokenId", "SignatureDoesNotMatch")
_TRANSIENT = ("ModelTimeoutException", "InternalServerException", "ServiceUnavailableException",
              "ModelNotReadyException", "ModelErrorException", "ServiceUnavailable", "InternalFailure")

#: the provider's mapping, as :func:`boto_errors` calls it: (code, status, message, headers, model) -> error
ErrorOf = Callable[[str, "int | None", str, "Mapping[str, str] | None", str], ProviderError]


def bedrock_error(where: str, region: str | None, code: str, status: int | None, message: str,
                  headers: Mapping[str, str] | None, model: str) -> ProviderError:
    """The runner's error for one of Bedrock's (its exception name, HTTP status, message) at ``where``."""
    said = words(status, code, None, None, message)
    if code == "ThrottlingException" or (status == 429 and code != "ModelNotReadyException"):
        return RateLimited(f"{where}: rate limited ({said})", retry_after=retry_after_seconds(headers))
    if code == "ServiceQuotaExceededException":
        return QuotaExceeded(f"{where}: the account's quota is used up ({said}); ask for more in the Service "
                             "Quotas console or wait for it to reset")
    if code in _AUTH or status in (401, 403):
        return AuthError(f"{where}: the AWS credentials were refused ({said}); check AWS_ACCESS_KEY_ID/"
                         f"AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and the model's access for bedrock:{model}",
                         status=status)
    if code == "ResourceNotFoundException" or status == 404:
        return AuthError(f"{where}: bedrock:{model} is not a model of region {region} ({said}); check "
                         "the model id (a cross-region id needs its geography prefix) and the region",
                         status=status, error_class="unknown_model")
    if code in _TRANSIENT or (status is not None and (status >= 500 or status in (408, 424))):
        return TransientError(f"{where}: server error ({said})", status=status)
    return BadRequest(f"{where}: request rejected ({said})", status=status)


@contextlib.contextmanager
def boto_errors(where: str, timeout: float, model: str, error_of: ErrorOf) -> Iterator[None]:
    """botocore's exceptions raised inside as the runner's classes (a service's error answer through
    ``error_of``), with messages of our own."""
    from botocore import exceptions as aws
    from botocore.parsers import ResponseParserError

    with surfaced(where):
        try:
            yield
        except aws.ClientError as exc:
            error = exc.response.get("Error") or {}
            meta = exc.response.get("ResponseMetadata") or {}
            raise error_of(str(error.get("Code") or ""), meta.get("HTTPStatusCode"),
                           str(error.get("Message") or ""), meta.get("HTTPHeaders"), model) from exc
        except (aws.ReadTimeoutError, aws.ConnectTimeoutError) as exc:
            raise TransientError(f"{where}: timed out after {timeout:g} s", error_class="timeout") from exc
        except (aws.EndpointConnectionError, aws.ConnectionClosedError, aws.HTTPClientError) as exc:
            raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                 error_class="connection") from exc
        except aws.NoCredentialsError as exc:
            raise AuthError(f"{where}: no AWS credentials were found: {CREDENTIAL_HELP}") from exc
        except aws.ParamValidationError as exc:  # botocore's own check of the request, before sending it
            raise BadRequest(f"{where}: request refused by botocore before sending ({quoted(exc)})") from exc
        except aws.InvalidEndpointConfigurationError as exc:  # botocore >= 1.44: a bearer key over plain http
            raise bearer_in_clear(where, model, exc) from exc
        except (ResponseParserError, UnicodeDecodeError) as exc:  # botocore decodes a body as UTF-8 first
            raise TransientError(f"{where}: the response was not valid JSON ({type(exc).__name__})",
                                 error_class="malformed_response") from exc


def bearer_in_clear(where: str, model: str, refusal: Exception) -> ModelSetupError:
    """A Bedrock API key asked to go to a plain http endpoint: botocore's ``refusal`` (its
    ``InvalidEndpointConfigurationError``, which the lean wire makes too, so both paths say one sentence)."""
    return ModelSetupError(f"{where}: botocore refuses this endpoint for bedrock:{model} ({quoted(refusal)}); a "
                           "Bedrock API key (AWS_BEARER_TOKEN_BEDROCK) needs an https base_url")


def bearer_over_http(where: str, model: str) -> ModelSetupError:
    """The lean wire's refusal of a Bedrock API key to a plain http endpoint: botocore's BearerAuth's, in its words."""
    from botocore.exceptions import InvalidEndpointConfigurationError

    return bearer_in_clear(where, model, InvalidEndpointConfigurationError(
        msg="Bearer authorization requires an HTTPS endpoint."))


def refresh_failed(where: str, exc: Exception) -> AuthError:
    """botocore's failure to find or refresh the chain's credentials (for the lean wire's signer), in one sentence."""
    return AuthError(f"{where}: the AWS credentials could not be found or refreshed ({type(exc).__name__}): "
                     f"{CREDENTIAL_HELP}")
