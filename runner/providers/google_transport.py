"""google-auth's transport for the token requests of Vertex's credentials (``google_tokens.py``): one request over
the standard library's ``http.client``, in place of ``google.auth.transport.requests.Request``, whose import of the
``requests`` library costs about 40 ms of CPU at every start of a Vertex run (``python -X importtime``), more than
the token request itself. google-auth still does everything else: it writes and signs the JWT grant (or asks the
metadata server), reads the answer, retries what it retries and raises its own errors.

What ``requests`` would do differently is kept by handing the request to google-auth's ``requests`` transport
itself (:func:`needs_requests`): where a proxy applies to the URL (HTTP(S)_PROXY, ALL_PROXY less NO_PROXY, read as
``lean_or_sdk.proxied`` reads them), and for an https URL where a variable names other certificates
(REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE, which ``requests`` reads; SSL_CERT_FILE and SSL_CERT_DIR, which it does not,
but the runner's TLS context would). Otherwise an https URL is checked against certifi's bundle, as ``requests``
checks it, with the runner's one TLS context (``tls.py``, certifi's bundle when neither SSL_CERT variable is set).

Each request opens its own connection (a token lasts an hour); its answer is bounded (a token endpoint's is a few
hundred bytes) and a failure is google-auth's ``TransportError`` naming the host and the reason, which the provider
words as Google's token endpoint not being reached. The answer is never logged: it holds the access token.
"""

from __future__ import annotations

import http.client
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from google.auth import exceptions
from google.auth import transport as auth_transport

from .lean_or_sdk import proxied
from .tls import shared_context

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["MAX_ANSWER_BYTES", "TokenRequest", "needs_requests"]

#: the most bytes of an answer read (an access token's answer is a few hundred; a metadata server's no more)
MAX_ANSWER_BYTES = 1 << 20
#: seconds a request may take when google-auth gives no timeout (google-auth's requests transport's default)
DEFAULT_TIMEOUT = 120.0
#: variables naming the certificates an https request is checked against, which this transport leaves to requests
CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


def needs_requests(url: str) -> str | None:
    """Why ``url`` goes through google-auth's ``requests`` transport (a proxy applies, or a variable names the
    certificates), as a phrase naming the setting; None when this transport takes it."""
    if proxied(url):
        return "a proxy applies to it"
    if urlsplit(url).scheme == "https":
        named = [variable for variable in CA_VARIABLES if os.environ.get(variable)]
        if named:
            return f"{named[0]} names its certificates"
    return None


class _Answer(auth_transport.Response):  # type: ignore[misc]
    """One answer as google-auth reads it: status, headers (read case-insensitively), body."""

    def __init__(self, status: int, headers: http.client.HTTPMessage, data: bytes) -> None:
        self._status = status
        self._headers = headers
        self._data = data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> http.client.HTTPMessage:
        return self._headers

    @property
    def data(self) -> bytes:
        return self._data


class TokenRequest(auth_transport.Request):  # type: ignore[misc]
    """google-auth's ``Request`` over ``http.client`` (see the module docstring); the URLs :func:`needs_requests`
    names go through google-auth's ``requests`` transport, made on first need."""

    def __init__(self) -> None:
        self._requests: Any = None

    def __call__(self, url: str, method: str = "GET", body: bytes | None = None,
                 headers: Mapping[str, str] | None = None, timeout: float | None = None, **kwargs: Any) -> Any:
        if needs_requests(url) is not None:
            return self._through_requests()(url, method=method, body=body, headers=headers, timeout=timeout,
                                            **kwargs)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise exceptions.TransportError(f"google-auth asked for {parts.scheme or 'a'} URL, not http(s)")
        seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        host, port = parts.hostname, parts.port
        connection = (http.client.HTTPSConnection(host, port, timeout=seconds, context=shared_context())
                      if parts.scheme == "https" else http.client.HTTPConnection(host, port, timeout=seconds))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request(method, target, body=body, headers=dict(headers or {}))
            answer = connection.getresponse()
            data = answer.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            reason = str(exc) if isinstance(exc, TimeoutError) and str(exc) else type(exc).__name__
            raise exceptions.TransportError(f"{host} could not be reached ({reason})") from exc
        finally:
            connection.close()
        if len(data) > MAX_ANSWER_BYTES:
            raise exceptions.TransportError(f"{host} answered more than {MAX_ANSWER_BYTES} bytes")
        return _Answer(answer.status, answer.msg, data)

    def _through_requests(self) -> Any:
        if self._requests is None:
            from google.auth.transport.requests import Request

            self._requests = Request()
        return self._requests
