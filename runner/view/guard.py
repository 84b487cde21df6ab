"""Who may read ``runner view``: the viewer answers only requests that name its own address and carry its token.

Two attacks are closed here (the ones Jupyter's server closes the same way):

- **DNS rebinding.** A web page the user visits at ``evil.example`` can make its own name resolve to 127.0.0.1
  and then read the viewer as if it were its own site: the browser sends ``Host: evil.example:8431``. Only
  ``Host`` values naming the address the viewer is bound to are served (127.0.0.1, localhost, [::1], and for a
  wildcard bind any address written as digits, which no page can rebind; ``--allow-host`` adds a name), and the
  port must be the one the request came in on.
- **Another local program or user** (or a page that guesses a request without reading the answer). A random
  token is made at start and printed in the URL the viewer opens; every request carries it, as ``?token=`` (the
  first page, which then sets a cookie for this port and sends the browser on to the same URL without it), the
  cookie, or ``Authorization: token …`` (scripts). ``--no-token`` turns this off.

No answer carries a CORS permission, so no other origin's script may read one; pages may not be framed. A refused
request gets 403 and a log line (the same line at most once a minute, so a page retrying in a loop cannot flood
the terminal).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

__all__ = ["LOOPBACK_NAMES", "Guard", "new_token"]

#: the names of this machine's loopback address a browser may put in ``Host``
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
#: addresses that mean "every interface": any address written as digits is then this machine's
WILDCARD = frozenset({"0.0.0.0", "::", ""})
#: headers every answer carries: no sniffing a JSON answer as a page, no token in a Referer, no framing
SAFE_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}
#: seconds during which the same refusal is logged once
LOG_EVERY_S = 60.0


def new_token() -> str:
    """A token no one can guess: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


class Guard:
    """The viewer's middleware: the ``Host`` check, then the token check (when there is a token)."""

    def __init__(self, token: str | None = None, *, bound: str = "127.0.0.1", allow: Iterable[str] = (),
                 log: Callable[[str], None] | None = None) -> None:
        self.token = token
        self.names = LOOPBACK_NAMES | {_bare(bound).lower()} | {_bare(name).lower() for name in allow}
        #: bound to every interface: any address written as digits is this machine's (a name could be rebound)
        self.any_address = _bare(bound) in WILDCARD
        self.log = log
        self._logged: dict[str, float] = {}

    def host_allowed(self, host: str | None, port: int | None) -> bool:
        """Whether ``Host: host`` names this viewer's address and the port the request came in on."""
        if not host:
            return False
        name, _, given_port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not name or (name.startswith("[") != name.endswith("]")):  # "name" without a port, or a lone bracket
            name, given_port = host, ""
        if given_port not in ((str(port),) if port not in (None, 80) else ("", "80")):
            return False
        name = _bare(name).lower()
        if name in self.names:
            return True
        if self.any_address:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return False
            return True
        return False

    def token_given(self, request: web.Request, port: int | None) -> str | None:
        """How the request carries the token ("query", "cookie", "header"), or None."""
        assert self.token is not None
        candidates = (("query", request.query.get("token")), ("cookie", request.cookies.get(cookie_name(port))),
                      ("header", _authorization(request.headers.get("Authorization", ""))))
        for where, given in candidates:
            if given and hmac.compare_digest(given.encode(), self.token.encode()):
                return where
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        port = _local_port(request)
        host = request.headers.get("Host")
        if not self.host_allowed(host, port):
            self._refused(f"refused a request for {request.path} with Host {host!r}: not this viewer's address "
                          "(--allow-host NAME serves another name)")
            return _refusal(request, "This viewer answers only at its own address (127.0.0.1 or localhost with its "
                                     "port); a page under another name cannot read it.")
        if self.token is not None:
            where = self.token_given(request, port)
            if where is None:
                self._refused(f"refused a request for {request.path} without the viewer's token")
                return _refusal(request, "This viewer asks for its token: open the URL `runner view` printed (it "
                                         "ends in ?token=...), or start it with --no-token.")
            if where == "query" and request.method == "GET" and not request.path.startswith("/api/"):
                # the page again without the token in its URL (history, bookmarks); the cookie carries it now
                query = {k: v for k, v in request.query.items() if k != "token"}
                response: web.StreamResponse = web.Response(
                    status=303, headers={"Location": str(request.rel_url.with_query(query))})
                self._set_cookie(response, port)
                _secure(response)
                return response
        response = await handler(request)
        if self.token is not None and request.cookies.get(cookie_name(port)) != self.token:
            self._set_cookie(response, port)
        _secure(response)
        return response

    def _set_cookie(self, response: web.StreamResponse, port: int | None) -> None:
        response.set_cookie(cookie_name(port), self.token or "", httponly=True, samesite="Strict", path="/")

    def _refused(self, line: str) -> None:
        if self.log is None:
            return
        now = time.monotonic()
        if now - self._logged.get(line, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[line] = now
            self.log(f"runner view: {line}")


def cookie_name(port: int | None) -> str:
    """The token's cookie, one per port: cookies are shared by every port of a host, viewers are not."""
    return f"runner-view-token-{port or 0}"


def _bare(name: str) -> str:
    """An address without the brackets an IPv6 address wears in a URL."""
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def _authorization(value: str) -> str | None:
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() in ("token", "bearer") else None


def _local_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None


def _secure(response: web.StreamResponse) -> None:
    for name, value in SAFE_HEADERS.items():
        response.headers.setdefault(name, value)


def _refusal(request: web.Request, sentence: str) -> web.Response:
    if request.path.startswith("/api/"):
        response = web.json_response({"error": sentence}, status=403)
    else:
        response = web.Response(text=f"403 Forbidden: {sentence}\n", status=403, content_type="text/plain")
    _secure(response)
    return response
