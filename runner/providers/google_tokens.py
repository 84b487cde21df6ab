"""Google OAuth access tokens for the lean wire (``vertex.py``): the Application Default Credentials google-auth
loaded (for a plain service-account key file, the same credentials made without google-auth's service-account
module: ``google_service_account.py``), their token refreshed in a worker thread (the refresh is a blocking HTTP
request, sent by ``google_transport.py``) when it is missing or about to expire (google-auth's ``expired``, which
counts a token as expired a few minutes early), one refresh at a time for every request in flight, as google-genai's
and ``AsyncAnthropicVertex``'s clients refresh theirs; the credentials loaded once per process while nothing they
come from changes (:func:`default_credentials`). The credentials and their token stay in memory: never stored,
logged or put into settings."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .env_memo import EnvironmentMemo

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

__all__ = ["AccessTokens", "default_credentials"]

#: the Application Default Credentials last loaded, for as long as nothing they came from changed
_LOADED: EnvironmentMemo[Credentials] = EnvironmentMemo()


def default_credentials(scopes: Sequence[str]) -> Credentials:
    """The Application Default Credentials of ``scopes`` as ``google.auth.default`` loads them (its errors as they
    are; a plain service-account key file's by ``google_service_account.service_account_grant``), loaded once per
    process while the environment, the file GOOGLE_APPLICATION_CREDENTIALS names and gcloud's application-default
    file stay the same (``env_memo.py``): the pre-flight probe's provider and the run's share them, and the token
    the probe fetched. Blocking (google-auth reads files, and may ask a metadata server)."""
    gcloud = _gcloud_file()
    files = (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"), gcloud)
    return _LOADED.get(tuple(scopes), files, lambda: _load(scopes, gcloud))


def _load(scopes: Sequence[str], gcloud: str) -> Credentials:
    """A plain service-account key file's credentials as google-auth would make them, without its service-account
    module (``google_service_account.py``, which says when); any other credentials by ``google.auth.default``."""
    try:
        from .google_service_account import service_account_grant
    except ImportError:  # a google-auth without the modules the grant uses (its metrics or backoff modules)
        pass
    else:
        grant = service_account_grant(scopes, gcloud)
        if grant is not None:
            return grant
    import google.auth

    return google.auth.default(scopes=list(scopes))[0]


def _gcloud_file() -> str:
    """Where gcloud keeps the application-default credentials, as google-auth finds the file (its private
    ``_cloud_sdk``; where that is gone, gcloud's folder on Linux and macOS)."""
    try:
        from google.auth import _cloud_sdk

        return str(_cloud_sdk.get_application_default_credentials_path())
    except (ImportError, AttributeError):
        folder = os.environ.get("CLOUDSDK_CONFIG") or os.path.join("~", ".config", "gcloud")
        return os.path.join(folder, "application_default_credentials.json")


def _refresh(credentials: Credentials) -> None:
    """One refresh (google-auth's, or the service-account grant that follows it), its token request over
    :class:`~runner.providers.google_transport.TokenRequest` (google-auth's ``requests`` transport, which both SDKs
    refresh with, where a proxy or a certificate variable applies) (run in a thread)."""
    from .google_transport import TokenRequest

    credentials.refresh(TokenRequest())  # type: ignore[no-untyped-call]


class AccessTokens:
    """The headers a request carries for ``credentials``: ``Authorization: Bearer TOKEN`` and, where asked and
    the credentials name one, ``x-goog-user-project`` (the quota project google-genai sends). google-auth's errors
    (``RefreshError``, ``TransportError``) are raised as they are: the caller words them."""

    __slots__ = ("_credentials", "_lock", "refreshes")

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials
        self._lock = asyncio.Lock()
        #: how many refreshes this object made (tests, and the bench's count of token requests)
        self.refreshes = 0

    def _stale(self) -> bool:
        credentials = self._credentials
        return not credentials.token or bool(credentials.expired)

    async def token(self) -> str:
        """A token valid for a few minutes more, refreshed first if it is not: the first request to find it stale
        refreshes it, the others wait for that refresh and read its token."""
        if self._stale():
            async with self._lock:
                if self._stale():  # another request may have refreshed it meanwhile
                    await asyncio.to_thread(_refresh, self._credentials)
                    self.refreshes += 1
        token = self._credentials.token
        if not token:
            raise RuntimeError("google-auth's refresh gave no access token")
        return str(token)

    async def headers(self, *, quota_project: bool) -> dict[str, str]:
        sent = {"Authorization": f"Bearer {await self.token()}"}
        project = getattr(self._credentials, "quota_project_id", None) if quota_project else None
        if project:
            sent["x-goog-user-project"] = project
        return sent
