"""Bedrock's runtime over the lean wire (``lean_http.py``): what :class:`~runner.providers.bedrock.BedrockProvider`
sends there instead of boto3's ``converse`` and ``AsyncAnthropicBedrock``'s InvokeModel, and how it reads the answer.

The credentials are the ones botocore's session resolves through the standard chain (the environment, the shared
files and a profile, SSO, instance and container roles), held by botocore's own credentials object; a refreshable one
(SSO, an assumed role) is refreshed by botocore, in a worker thread, when botocore says a refresh is needed, one
refresh at a time for every request in flight (:class:`AwsSigner`). Where the chain's answer is the environment's
keys (no profile named), they are read as botocore's first provider reads them, without botocore
(``aws_sessions.environment_credentials``). Each request's exact bytes are signed (service ``bedrock``, the region)
by :mod:`runner.providers.sigv4`: AWS's published SigV4 algorithm, checked against botocore's ``SigV4Auth`` (the
same headers, the same signature): X-Amz-Date; X-Amz-Security-Token with a session token; Authorization, which signs
Host, the Content-Type where there is a body, X-Amz-Date and the token. A Bedrock API key
(``AWS_BEARER_TOKEN_BEDROCK``) goes as ``Authorization: Bearer``, as both SDKs send it.

The wire, read from botocore's bedrock-runtime service model (``Converse``: ``POST /model/{modelId}/converse``,
rest-json) and from the anthropic SDK's Bedrock client (InvokeModel: ``POST /model/{modelId}/invoke``):

- Converse's model id is quoted as botocore quotes a URI label (only ``-._~`` kept: an inference-profile ARN's
  ``:`` and ``/`` escaped), Claude's as ``AsyncAnthropicBedrock`` quotes it (``:`` and ``;`` kept).
- Converse's body is what botocore's rest-json serializer writes for the same keyword arguments (``modelId`` in
  the path, the rest as ``json.dumps`` writes it, a blob as base64); tests/providers/test_lean_bedrock.py checks
  it against the serializer itself.
- Converse's answer is read into the dict boto3 returns, a blob (an image's, a document's or a video's
  ``source.bytes``, ``reasoningContent.redactedContent``) decoded, so that ``bedrock_converse.py`` maps it
  unchanged; an empty body is ``{}`` as botocore reads it. Members botocore's model does not know are kept, not
  dropped (``raw``).
- An error answer's code is read as botocore's rest-json parser reads it (``x-amzn-ErrorType``, else the body's
  ``code``, else its ``__type``, else the status; a 5xx with no body or an HTML one is its status and reason), its
  message from the body's ``message``/``Message``; Claude's as ``AsyncAnthropicBedrock``'s path read it
  (``x-amzn-ErrorType`` only). Both then go through the provider's one mapping (``BedrockProvider.error_of``).

Imported at start: nothing of botocore where the environment holds the keys (``runner submit`` of a Bedrock job
reached its first request 0.13-0.2 s sooner than with ``botocore.session``, ``botocore.compat`` and awscrt, which
botocore imports wherever it is installed); ``botocore.session`` wherever the chain is read (a profile, SSO, a role).
boto3 itself is imported neither by the online path nor by the pre-flight probe's lookup (``bedrock_probe.py``:
:func:`control_url`, :func:`lookup_path`), only by token counts and batch inference (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.client
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from runner.errors import TransientError

__all__ = ["AwsSigner", "ErrorAnswer", "claude_error", "control_url", "converse_answer", "converse_body",
           "converse_error", "converse_path", "invoke_path", "lookup_path", "runtime_url"]

#: botocore's ``percent_encode`` keeps these unescaped in a URI label (``botocore.utils.SAFE_CHARS``)
_LABEL_SAFE = "-._~"
#: the anthropic SDK's Bedrock client keeps these unescaped in the model's path segment
_CLAUDE_SAFE = ":;"
#: the members of Converse's answer that are blobs (base64 on the wire, bytes in boto3's dict): a content block's
#: ``image``/``document``/``video`` ``source.bytes`` (in a tool result's content too) and a redacted reasoning
_BLOB_KEYS = ("redactedContent",)


def runtime_url(region: str) -> str:
    """bedrock-runtime's endpoint in ``region``, as botocore's endpoint rules and the anthropic SDK name it."""
    return _endpoint("bedrock-runtime", region)


def control_url(region: str) -> str:
    """The control plane's endpoint in ``region`` (boto3's ``bedrock`` client: the pre-flight probe's lookups)."""
    return _endpoint("bedrock", region)


def _endpoint(prefix: str, region: str) -> str:
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://{prefix}.{region}.{suffix}"


@functools.lru_cache(maxsize=256)
def converse_path(model: str) -> str:
    return f"/model/{quote(model, safe=_LABEL_SAFE)}/converse"


@functools.lru_cache(maxsize=256)
def invoke_path(model: str) -> str:
    return f"/model/{quote(model, safe=_CLAUDE_SAFE)}/invoke"


def lookup_path(model: str, *, profile: bool) -> str:
    """The control plane's lookup of ``model``: GetInferenceProfile's ``/inference-profiles/{id}`` for a cross-region
    id (``profile``), else GetFoundationModel's ``/foundation-models/{id}`` (botocore's bedrock service model), the id
    quoted as botocore quotes a URI label."""
    return f"/{'inference-profiles' if profile else 'foundation-models'}/{quote(model, safe=_LABEL_SAFE)}"


def _blob(value: Any) -> str:
    """A ``bytes`` as botocore serialises a blob (base64 text); json's C encoder asks this only for what it cannot
    write itself, so the request is not copied to find them."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: ``json.dumps``'s defaults (botocore's rest-json serializer calls it with none), blobs as base64
_ENCODER = json.JSONEncoder(default=_blob)


def converse_body(request: Mapping[str, Any]) -> bytes:
    """The body of boto3's ``converse(**request)``: every member but ``modelId`` (the path's), as botocore's
    rest-json serializer writes it."""
    return _ENCODER.encode({key: value for key, value in request.items() if key != "modelId"}).encode()


def _decoded(value: Any, parent: str = "") -> Any:
    """Converse's answer with its blobs decoded, in place (a ``source``'s ``bytes``, a ``redactedContent``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and ((key == "bytes" and parent == "source") or key in _BLOB_KEYS):
                value[key] = base64.b64decode(item)
            else:
                _decoded(item, key)
    elif isinstance(value, list):
        for item in value:
            _decoded(item, parent)
    return value


def converse_answer(content: bytes, where: str) -> dict[str, Any]:
    """A Converse answer as boto3's dict (without its ``ResponseMetadata``). As botocore reads one: a body that is
    not UTF-8 is malformed; one that is not JSON (botocore takes its text as a ``message``, which Converse's answer
    has no member for) or not an object is empty, which ``bedrock_converse.py`` says is no Converse answer."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TransientError(f"{where}: the response was not valid JSON ({type(exc).__name__})",
                             error_class="malformed_response") from exc
    try:
        parsed = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    if b'"bytes"' not in content and b'"redactedContent"' not in content and b"\\u" not in content:
        return parsed  # no blob to decode (nor a member's name spelt in \u escapes: then it is looked for)
    try:
        return _decoded(parsed)  # type: ignore[no-any-return]
    except ValueError as exc:  # a blob that is not base64 (binascii.Error)
        raise TransientError(f"{where}: the response was not valid JSON ({type(exc).__name__})",
                             error_class="malformed_response") from exc


class ErrorAnswer(Exception):
    """A non-2xx answer of the wire (its ``error_of``), mapped by the provider, which knows the model."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers


def _code(code: str) -> str:
    return code.split(":", 1)[0].rsplit("#", 1)[-1]


def converse_error(answer: ErrorAnswer) -> tuple[str, str]:
    """(code, message) of an error answer as botocore's rest-json parser reads them."""
    status, body = answer.status, answer.body
    if status >= 500 and (body == "" or (isinstance(body, str) and body.startswith("<html>"))):
        return str(status), http.client.responses.get(status, "")
    fields: dict[str, Any] = body if isinstance(body, dict) else ({"message": body} if isinstance(body, str) and body
                                                                 else {})
    message = fields.get("message", fields.get("Message", ""))
    code = fields.get("__type", str(status))
    header = answer.headers.get("x-amzn-errortype")
    if header is not None:
        code = header
    elif "code" in fields or "Code" in fields:
        code = fields.get("code", fields.get("Code", ""))
    return (_code(code) if isinstance(code, str) else str(code)), str(message or "")


def claude_error(answer: ErrorAnswer) -> tuple[str, str]:
    """(code, message) of an error answer as ``AsyncAnthropicBedrock``'s path read them (``x-amzn-ErrorType``, the
    body's ``message``/``Message``)."""
    body = answer.body if isinstance(answer.body, dict) else {}
    code = (answer.headers.get("x-amzn-errortype") or "").split(":", 1)[0]
    return code, str(body.get("message") or body.get("Message") or "")


class AwsSigner:
    """The auth headers of one request to bedrock-runtime: AWS's SigV4 signature (``sigv4.py``) with the chain's
    credentials (``credentials``: botocore's object, refreshed in a worker thread when it says so, or the
    environment's as botocore's first provider reads them), or the Bedrock API key ``bearer``. Nothing of the
    credentials is kept but in that object and the signing key derived from its secret."""

    __slots__ = ("_bearer", "_credentials", "_lock", "_sigv4", "refreshes")

    def __init__(self, credentials: Any, region: str, *, bearer: str | None = None) -> None:
        from .sigv4 import SigV4

        self._credentials = credentials
        self._sigv4 = SigV4(region, "bedrock")
        self._bearer = bearer
        self._lock = asyncio.Lock()
        #: how many refreshes this object started (tests)
        self.refreshes = 0

    @property
    def bearer(self) -> bool:
        return self._bearer is not None

    def _stale(self) -> bool:
        needed = getattr(self._credentials, "refresh_needed", None)  # botocore's RefreshableCredentials
        return bool(needed is not None and needed())

    async def frozen(self) -> Any:
        """The credentials of this moment (botocore's ``ReadOnlyCredentials``): when botocore says they need a
        refresh, the first request to find it so refreshes them in a worker thread, the others wait for it."""
        if self._stale():
            async with self._lock:
                if self._stale():  # another request may have refreshed them meanwhile
                    await asyncio.to_thread(self._credentials.get_frozen_credentials)
                    self.refreshes += 1
        return self._credentials.get_frozen_credentials()

    async def headers(self, method: str, url: str, content: bytes, host: str) -> dict[str, str]:
        """The headers that authorise ``method url`` with the JSON body ``content`` (none: ``b""``), sent with the
        Host header ``host`` (the wire's own: signed as given); neither it nor the Content-Type is returned, the
        wire sends both (the Content-Type with a body only, so it is signed with one only)."""
        if self._bearer is not None:
            return {"Authorization": f"Bearer {self._bearer}"}
        frozen = await self.frozen()
        path, query = _parts_of(url)
        signed = {"Content-Type": "application/json", "Host": host} if content else {"Host": host}
        return self._sigv4.headers(frozen, method, path, query, signed, content)


@functools.lru_cache(maxsize=256)
def _parts_of(url: str) -> tuple[str, str]:
    """The path and query of ``url`` (a run asks the same few URLs again and again)."""
    parts = urlsplit(url)
    return parts.path, parts.query
