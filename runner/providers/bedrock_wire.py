"""Bedrock's runtime over the lean wire (``lean_http.py``): what :class:`~runner.providers.bedrock.BedrockProvider`
sends there instead of boto3's ``converse`` and ``AsyncAnthropicBedrock``'s InvokeModel, and how it reads the answer.

Nothing of AWS's signing or credentials is written here (ARCHITECTURE.md, invariant 7): the credentials are the
ones botocore's session resolves through the standard chain (the environment, the shared files and a profile, SSO,
instance and container roles), held by botocore's own credentials object; a refreshable one (SSO, an assumed role)
is refreshed by botocore, in a worker thread, when botocore says a refresh is needed, one refresh at a time for
every request in flight (:class:`AwsSigner`). Each request's exact bytes are signed (service ``bedrock``, the
region) by AWS's own SigV4 signer, never ours: awscrt's (the AWS Common Runtime's signer in C,
``awscrt.auth.aws_sign_request``, the one botocore itself signs with when installed as ``botocore[crt]``; in the
``bedrock`` extra), with one signing configuration per distinct credentials botocore hands over; where awscrt cannot
be imported, botocore's ``SigV4Auth`` on a ``botocore.awsrequest.AWSRequest``. Both give the same headers
(X-Amz-Date; X-Amz-Security-Token with a session token; Authorization, which signs Host, the Content-Type where
there is a body, X-Amz-Date and the token) and the same signature (tests/providers/test_bedrock_crt.py). A Bedrock
API key
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

Imported at start (the signer in a worker thread; ``botocore.session`` wherever the chain is first read, the
pre-flight check of the credentials as before) (``python -X importtime`` on this machine, 2 shared cores, 3 runs):
``botocore.auth`` and ``botocore.awsrequest`` (0.11 to 0.16 s, urllib3 and botocore's utilities included), and
for the credential chain ``botocore.session`` (about 0.05 s more; it imports ``botocore.client`` and the rest of
the client machinery, none of which runs per request: no parameter validation, serialisation, endpoint resolution,
event hooks, urllib3 pool or response parsing). boto3 itself is imported neither by the online path nor by the
pre-flight probe's lookup (``bedrock_probe.py``: :func:`control_url`, :func:`lookup_path`), only by token counts and
batch inference. Signing a Converse request costs (CPU, this machine, 2026-12-01) about 0.02-0.03 ms with awscrt,
0.07-0.1 ms with botocore's ``SigV4Auth``. awscrt's own import costs some 45-65 ms of CPU holding the GIL
(``_awscrt``'s start), but botocore imports it anyway as it is first imported wherever it is installed
(``botocore.compat``, to learn whether botocore[crt] is), so :func:`crt` finds it loaded (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.client
import io
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from runner.errors import TransientError

__all__ = ["AwsSigner", "ErrorAnswer", "claude_error", "control_url", "converse_answer", "converse_body",
           "converse_error", "converse_path", "crt", "invoke_path", "lookup_path", "runtime_url"]

#: botocore's ``percent_encode`` keeps these unescaped in a URI label (``botocore.utils.SAFE_CHARS``)
_LABEL_SAFE = "-._~"
#: the anthropic SDK's Bedrock client keeps these unescaped in the model's path segment
_CLAUDE_SAFE = ":;"
#: the members of Converse's answer that are blobs (base64 on the wire, bytes in boto3's dict): a content block's
#: ``image``/``document``/``video`` ``source.bytes`` (in a tool result's content too) and a redacted reasoning
_BLOB_KEYS = ("redactedContent",)
#: signed, but sent by the wire itself
_WIRE_HEADERS = ("content-type", "host")


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
    """The auth headers of one request to bedrock-runtime: AWS's SigV4 signature with the chain's credentials
    (``credentials``, botocore's object, refreshed in a worker thread when it says so), or the Bedrock API key
    ``bearer``. Signed by awscrt's signer, the one botocore signs with when installed as ``botocore[crt]``, or where
    awscrt cannot be imported by botocore's ``SigV4Auth``: the same headers, the same signature. Nothing of the
    credentials is kept anywhere but in these two libraries' objects."""

    __slots__ = ("_bearer", "_credentials", "_crt_signing", "_lock", "_region", "refreshes")

    def __init__(self, credentials: Any, region: str, *, bearer: str | None = None) -> None:
        self._credentials = credentials
        self._region = region
        self._bearer = bearer
        self._lock = asyncio.Lock()
        #: the frozen credentials awscrt's signing configuration was made with, and that configuration
        self._crt_signing: tuple[Any, Any] | None = None
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
        wire sends both (the Content-Type with a body only, so it is signed with one only). Signed by awscrt where
        it can be imported (:func:`crt`), else by botocore's ``SigV4Auth``: the same headers, the same signature."""
        if self._bearer is not None:
            return {"Authorization": f"Bearer {self._bearer}"}
        frozen = await self.frozen()
        modules = crt()
        if modules is not None:
            return await self._crt_headers(modules, frozen, method, url, content, host)
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        signed = {"Content-Type": "application/json", "Host": host} if content else {"Host": host}
        request = AWSRequest(method=method, url=url, data=content, headers=signed)
        SigV4Auth(frozen, "bedrock", self._region).add_auth(request)
        return {name: value for name, value in request.headers.items() if name.lower() not in _WIRE_HEADERS}

    async def _crt_headers(self, modules: tuple[Any, Any], frozen: Any, method: str, url: str, content: bytes,
                           host: str) -> dict[str, str]:
        """:meth:`headers` signed by awscrt with its defaults, which are botocore's ``CrtSigV4Auth``'s for a service
        other than S3 (the path encoded twice and normalised, the body's SHA-256 signed, no X-Amz-Content-SHA256
        header): the header names and values ``SigV4Auth`` gives (X-Amz-Date, X-Amz-Security-Token with a session
        token, Authorization)."""
        auth, http = modules
        made = self._crt_signing
        if made is None or made[0] != frozen:  # one configuration per distinct credentials (a refresh makes new ones)
            provider = auth.AwsCredentialsProvider.new_static(frozen.access_key, frozen.secret_key,
                                                              frozen.token or None)
            # (no date: each request is signed at the time it is signed)
            made = self._crt_signing = (frozen, auth.AwsSigningConfig(
                algorithm=auth.AwsSigningAlgorithm.V4, signature_type=auth.AwsSignatureType.HTTP_REQUEST_HEADERS,
                credentials_provider=provider, region=self._region, service="bedrock"))
        path = _path_of(url)
        pairs = [("Content-Type", "application/json"), ("Host", host)] if content else [("Host", host)]
        request = http.HttpRequest(method, path, http.HttpHeaders(pairs), io.BytesIO(content) if content else None)
        signing = auth.aws_sign_request(request, made[1])
        if not signing.done():  # static credentials sign at once, in C; were it ever otherwise, not on the loop
            await asyncio.wrap_future(signing)
        signing.result()
        signed = request.headers
        headers = {"X-Amz-Date": signed.get("X-Amz-Date"), "Authorization": signed.get("Authorization")}
        if frozen.token:
            headers["X-Amz-Security-Token"] = signed.get("X-Amz-Security-Token")
        return headers


@functools.lru_cache(maxsize=256)
def _path_of(url: str) -> str:
    """The path and query of ``url``, as a request line names them (a run asks the same few URLs again and again)."""
    parts = urlsplit(url)
    return f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path or "/"


@functools.cache
def crt() -> tuple[Any, Any] | None:
    """awscrt's ``auth`` and ``http`` modules, or None where awscrt cannot be imported (not installed, or a build
    this machine cannot load): botocore's ``SigV4Auth`` then signs. botocore imports awscrt itself wherever it is
    installed (``botocore.compat``), so by a request's signing this costs nothing more."""
    try:
        import awscrt.auth
        import awscrt.http
    except Exception as exc:  # (only the exception's type is said: nothing of the credentials is near it)
        import logging

        logging.getLogger(__name__).debug("awscrt not imported (%s): botocore signs", type(exc).__name__)
        return None
    return awscrt.auth, awscrt.http
