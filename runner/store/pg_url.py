"""A PostgreSQL store's URL in what the runner prints: without its password (:func:`redact`), and the reason a
connection failed, on one line with the password masked (:func:`reason`). Kept apart from the store
(:mod:`runner.store.postgres`) so that reading them needs no session."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["reason", "redact"]


def redact(url: str) -> str:
    """The URL without its password (in the user part or a ``password=`` parameter)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            netloc = user.split(":", 1)[0] + "@" + host
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return url.split("://", 1)[0] + "://..."


def reason(exc: Exception, url: str) -> str:
    """The server's or libpq's reason, on one line, without the password: ``Connection refused``, ``password
    authentication failed for user "u"``, ``database "x" does not exist``."""
    diag = getattr(exc, "diag", None)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = (diag and diag.message_primary) or (lines[0] if lines else type(exc).__name__)
    reason = re.sub(r"^.*\bfailed: ", "", reason) if reason.startswith("connection ") else reason
    reason = re.sub(r"\s+", " ", re.sub(r"^(FATAL|ERROR):\s*", "", reason))
    try:
        parts = urlsplit(url)
        password = parts.password if "://" in url else None
        secrets = [password, *(v for k, v in parse_qsl(parts.query) if k == "password")]
    except ValueError:  # a URL Python cannot split (an unclosed "[" of an IPv6 host), whose password it cannot find
        return "the URL is malformed"
    for secret in filter(None, secrets):
        reason = reason.replace(secret, "***")
    return reason.rstrip(".")
