"""AWS Signature Version 4 of one request's headers, for the lean wire to Bedrock (``bedrock_wire.AwsSigner``).

The algorithm is AWS's published one ("Create a signed AWS API request",
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html), in the form botocore's
``SigV4Auth`` gives it for a service other than S3: the path normalised (dot segments and empty segments removed) and
percent-encoded once more (``/`` and ``~`` kept), the query's pairs sorted as they stand, every header given signed
(names lower-cased, values trimmed and inner runs of spaces made one), the body's SHA-256 signed, X-Amz-Date and, with
a session token, X-Amz-Security-Token added and signed. tests/providers/test_sigv4.py checks the headers and the
signature against botocore's ``SigV4Auth`` itself (paths, queries, headers, tokens, bodies) and against AWS's
published example.

Why our own, when botocore's and awscrt's signers exist (ARCHITECTURE.md, "Own code here, a library there"):
neither can be had without its import, and the lean wire is there to keep a Bedrock run's start-up and CPU per
request near the other providers'. ``botocore.auth`` imports ``botocore.compat``, which with urllib3 and awscrt's C
module cost 0.13-0.2 s of CPU before the first request (0.06 s of it awscrt's, which botocore imports wherever it is
installed); this signs a Converse request in about a sixth of ``SigV4Auth``'s time and half of awscrt's
(bench/RESULTS.md). The credentials are never read here: the caller hands over the ones botocore's chain resolved,
or the environment's exactly as botocore's first provider reads them (``aws_sessions.environment_credentials``); the
key derived from the secret is kept in memory only, for the day and the scope it is valid for.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import quote

__all__ = ["Credentials", "SigV4", "canonical_path", "canonical_query"]

_ALGORITHM = "AWS4-HMAC-SHA256"
_EMPTY_BODY = hashlib.sha256(b"").hexdigest()


class Credentials(Protocol):
    """What signing needs of a set of credentials (botocore's ``ReadOnlyCredentials`` has these three)."""

    @property
    def access_key(self) -> str: ...

    @property
    def secret_key(self) -> str: ...

    @property
    def token(self) -> str | None: ...


@functools.lru_cache(maxsize=256)
def canonical_path(path: str) -> str:
    """The canonical URI of ``path`` (as sent: its labels already percent-encoded): its dot segments resolved
    (RFC 3986, 5.2.4) and its empty segments dropped, which AWS's services other than S3 ask for, then
    percent-encoded again with ``/`` and ``~`` kept; an empty path is ``/``."""
    if not path:
        return "/"
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    lead = "/" if path.startswith("/") else ""
    trail = "/" if path.endswith("/") and kept else ""
    return quote(lead + "/".join(kept) + trail, safe="/~")


def canonical_query(query: str) -> str:
    """The canonical query string of a URL's ``query`` (without its ``?``): its ``name=value`` pairs, as they are
    written in the URL, sorted by name and then by value (a pair without ``=`` has an empty value)."""
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(f"{name}={value}" for name, value in pairs)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.digest(key, text.encode(), "sha256")


class SigV4:
    """The SigV4 headers of requests to ``service`` in ``region``. The signing key (four HMACs of the secret) is
    derived once per secret and UTC day and kept here, in memory only."""

    __slots__ = ("_key", "_region", "_service")

    def __init__(self, region: str, service: str) -> None:
        self._region = region
        self._service = service
        self._key: tuple[str, str, bytes] | None = None  # (secret, day, signing key)

    def _signing_key(self, secret: str, day: str) -> bytes:
        kept = self._key
        if kept is not None and kept[1] == day and kept[0] == secret:
            return kept[2]
        key = _hmac(f"AWS4{secret}".encode(), day)
        for part in (self._region, self._service, "aws4_request"):
            key = _hmac(key, part)
        self._key = (secret, day, key)
        return key

    def headers(self, credentials: Credentials, method: str, path: str, query: str, headers: Mapping[str, str],
                body: bytes, now: float | None = None) -> dict[str, str]:
        """The headers that sign ``method path?query`` with ``headers`` (each one signed: the Host the request is
        sent with, the Content-Type where there is a body) and ``body``, at ``now`` (seconds since the epoch; the
        clock if None): X-Amz-Date, X-Amz-Security-Token where the credentials carry a token, and Authorization.
        None of ``headers`` is returned."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        day = stamp[:8]
        token = credentials.token
        extra = {"X-Amz-Date": stamp, "X-Amz-Security-Token": token} if token else {"X-Amz-Date": stamp}
        signed = {name.lower(): " ".join(value.split()) for name, value in headers.items()}
        for name, value in extra.items():
            signed[name.lower()] = value
        names = sorted(signed)
        signed_names = ";".join(names)
        canonical = "\n".join((
            method.upper(), canonical_path(path), canonical_query(query),
            "".join(f"{name}:{signed[name]}\n" for name in names), signed_names,
            hashlib.sha256(body).hexdigest() if body else _EMPTY_BODY))
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        to_sign = f"{_ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.digest(self._signing_key(credentials.secret_key, day), to_sign.encode(), "sha256").hex()
        extra["Authorization"] = (f"{_ALGORITHM} Credential={credentials.access_key}/{scope}, "
                                  f"SignedHeaders={signed_names}, Signature={signature}")
        return extra
