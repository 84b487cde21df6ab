"""A service account's access token, granted as google-auth grants it, without loading google-auth's service-account
module: for the one case of Application Default Credentials where GOOGLE_APPLICATION_CREDENTIALS names a plain
service-account key file (``google_tokens.default_credentials``).

Why: ``google.auth.default()`` imports ``google.oauth2.service_account``, whose ``google.auth.crypt`` imports
cryptography's x509 and elliptic-curve modules (about 70 ms of CPU beyond the RSA primitives a grant needs), and
cryptography checks the RSA key's numbers whole at every load (about 50 ms); both on the way to a Vertex run's first
request. Here the key file is read as ``google.auth.default`` reads it, the key loaded with cryptography's RSA
primitives only, and the token asked for with the OAuth 2.0 JWT-bearer grant (RFC 7523; Google's "Using OAuth 2.0
for Server to Server Applications", https://developers.google.com/identity/protocols/oauth2/service-account) exactly
as google-auth 2.x asks for it: the same signed assertion, the same request to the same URL, the same reading of
the answer, the same retries and the same errors (google-auth's own exception classes and messages, which
``vertex.py`` words). Each rule below names the google-auth function it follows.

Only where google-auth would itself load a plain service-account key from that file and refresh it with the
JWT-bearer grant (:func:`service_account_grant` lists the conditions); anything else (another credential type, a
universe domain other than googleapis.com, self-signed JWT access, a regional access boundary lookup, a missing or
unusual field, a key cryptography will not load as an unencrypted RSA key, a client-certificate variable) returns
None and ``google.auth.default`` loads the credentials as before, its errors its own.

The key's check: cryptography's documentation says to skip the RSA key check (``unsafe_skip_rsa_key_validation``)
only for keys known to be valid, never for a user-supplied one: a key whose numbers do not agree could leak itself
through a faulty signature. Here a key is checked whole the first time its bytes are seen, and its SHA-256 digest is
then remembered (``key_memo.py``); the check is skipped only for bytes whose digest is remembered, that is for the
very bytes that passed the same check before (a different key with that digest would take a SHA-256 collision), and
the memo sits in the user's own cache folder, which whoever could change could as well change the key file.

The object returned is a google-auth ``Credentials`` (so the SDKs and google-cloud-storage take it as they take
google-auth's service-account credentials): ``token``, ``expiry``, ``expired`` and ``valid`` with google-auth's
refresh threshold, ``quota_project_id``, ``before_request``, ``apply`` are google-auth's own; ``refresh`` is the
grant. The key stays in memory, in cryptography's key object: never stored, logged or put into a message.
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from google.auth import _exponential_backoff, _helpers, credentials, exceptions, metrics, transport
from google.auth import version as auth_version

from . import key_memo

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

__all__ = ["ServiceAccountGrant", "service_account_grant"]

#: google/auth/_default.py ``_SERVICE_ACCOUNT_TYPE``: the key file's ``type``
SERVICE_ACCOUNT_TYPE = "service_account"
#: google/oauth2/service_account.py ``_GOOGLE_OAUTH2_TOKEN_ENDPOINT``: the assertion's ``aud``, whatever the file's
#: ``token_uri`` (to which the grant is sent)
ASSERTION_AUDIENCE = "https://oauth2.googleapis.com/token"
#: google/oauth2/service_account.py ``_DEFAULT_TOKEN_LIFETIME_SECS``: ``exp`` is ``iat`` plus this
ASSERTION_LIFETIME = datetime.timedelta(seconds=3600)
#: google/oauth2/_client.py ``_JWT_GRANT_TYPE`` (RFC 7523 section 2.1)
JWT_GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: google/oauth2/_client.py ``_URLENCODED_CONTENT_TYPE``
URLENCODED = "application/x-www-form-urlencoded"
#: google/auth/credentials.py ``DEFAULT_UNIVERSE_DOMAIN``: the only universe whose keys are refreshed by the grant
#: (google/oauth2/service_account.py ``Credentials.__init__``: any other value, None included, turns on self-signed
#: JWT access)
UNIVERSE = credentials.DEFAULT_UNIVERSE_DOMAIN
#: google/auth/_regional_access_boundary_utils.py ``_REGIONAL_ACCESS_BOUNDARY_HEADER``, which a service account's
#: ``apply`` removes while the lookup is off
ACCESS_BOUNDARY_HEADER = "x-allowed-locations"
#: google/auth/_regional_access_boundary_utils.py ``is_regional_access_boundary_lookup_enabled``: the variable and
#: the values that turn the lookup on (which a service account's ``before_request`` then makes): left to google-auth
ACCESS_BOUNDARY_VARIABLE = "GOOGLE_SDK_EXPERIMENTAL_PYTHON_REGIONAL_ACCESS_BOUNDARY_LOOKUP_ENABLED"
TRUTHY = ("y", "yes", "t", "true", "on", "1")
#: the first google-auth whose grant this follows: tests/providers/test_google_service_account.py compares the two
#: against google-auth itself at 2.63.0 (the version constraints/ci.txt pins) and at 2.56.0 (``.ci/run --oldest``:
#: google-genai's own floor, so the oldest a vertex install can have); google.auth.default loads the credentials
#: with an older one
VERIFIED_FROM = (2, 56)
#: the first google-auth this module is not used with: a new major release may change what its private helpers
#: (``_helpers``, ``_exponential_backoff``) and its grant do, unread here
VERIFIED_BELOW = (3, 0)
#: client-certificate settings (google/auth/environment_vars.py, with gcloud's fallbacks): google-auth's grant does
#: not read them, but its transports may (mutual TLS, workload certificates): left to google-auth as a precaution
CERTIFICATE_VARIABLES = ("GOOGLE_API_USE_CLIENT_CERTIFICATE", "GOOGLE_API_CERTIFICATE_CONFIG",
                         "CLOUDSDK_CONTEXT_AWARE_USE_CLIENT_CERTIFICATE",
                         "CLOUDSDK_CONTEXT_AWARE_CERTIFICATE_CONFIG_FILE_PATH")


def service_account_grant(scopes: Sequence[str], gcloud_file: str) -> ServiceAccountGrant | None:
    """The credentials ``google.auth.default(scopes=scopes)`` would return, as a :class:`ServiceAccountGrant`,
    where it would load a plain service-account key from the file GOOGLE_APPLICATION_CREDENTIALS names and refresh
    it with the JWT-bearer grant; None in every other case (``google.auth.default`` then loads them).
    ``gcloud_file`` is gcloud's application-default file as google-auth finds it. Blocking (reads the file)."""
    # google/auth/_default.py ``default``: the explicit file is the first of its checkers; a file that is gcloud's
    # own goes through its gcloud flow instead (``_get_explicit_environ_credentials``)
    if not verified_google_auth():
        return None
    filename = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "")
    if not filename or filename == gcloud_file or not scopes:
        return None
    if any(os.environ.get(name) for name in CERTIFICATE_VARIABLES):
        return None
    if os.environ.get(ACCESS_BOUNDARY_VARIABLE, "").strip().lower() in TRUTHY:
        return None
    # ``default``: the project id is GOOGLE_CLOUD_PROJECT (else GCLOUD_PROJECT), else the file's; where there is
    # none, google-auth logs a warning: left to it
    explicit_project = os.environ.get("GOOGLE_CLOUD_PROJECT", os.environ.get("GCLOUD_PROJECT"))
    # ``load_credentials_from_file``: the file opened in the locale's encoding and read as JSON; whatever fails there
    # (a missing file, a folder, not JSON) is google-auth's to say
    if not os.path.exists(filename):
        return None
    try:
        with open(filename, encoding=None) as file:  # as google-auth opens it: io.open(filename, "r")
            info = json.load(file)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("type") != SERVICE_ACCOUNT_TYPE:
        return None
    # ``_get_service_account_credentials`` -> ``Credentials.from_service_account_info``: client_email, token_uri and
    # (google/auth/crypt/base.py ``from_service_account_info``) private_key are required; private_key_id is the
    # header's kid when present; universe_domain and trust_boundary are read from the file
    email, token_uri, pem = info.get("client_email"), info.get("token_uri"), info.get("private_key")
    key_id = info.get("private_key_id")
    if not (isinstance(email, str) and isinstance(token_uri, str) and isinstance(pem, str)):
        return None
    if key_id is not None and not isinstance(key_id, str):
        return None
    if info.get("universe_domain", UNIVERSE) != UNIVERSE or "trust_boundary" in info:
        return None
    if not (explicit_project or info.get("project_id")):
        return None
    key = _rsa_key(pem)
    if key is None:
        return None
    # ``_apply_quota_project_id`` (``with_quota_project_from_environment``, google/auth/credentials.py): the quota
    # project is GOOGLE_CLOUD_QUOTA_PROJECT where set and not empty; the file's quota_project_id is not read
    quota = os.environ.get("GOOGLE_CLOUD_QUOTA_PROJECT") or None
    return ServiceAccountGrant(
        key, email=email, token_uri=token_uri, key_id=key_id, scopes=list(scopes), project_id=info.get("project_id"),
        quota_project_id=quota,
        # ``_get_explicit_environ_credentials`` sets ``_cred_file_path`` to this (``get_cred_info``)
        source=f"{filename} file via the GOOGLE_APPLICATION_CREDENTIALS environment variable")


def verified_google_auth() -> bool:
    """Whether the installed google-auth is one whose grant this module follows (:data:`VERIFIED_FROM` on, before
    :data:`VERIFIED_BELOW`)."""
    try:
        installed = tuple(int(part) for part in str(auth_version.__version__).split(".")[:2])
    except ValueError:
        return False
    return VERIFIED_FROM <= installed < VERIFIED_BELOW


def _rsa_key(pem: str) -> RSAPrivateKey | None:
    """The file's private key as google/auth/crypt/_cryptography_rsa.py ``RSASigner.from_string`` loads it
    (``load_pem_private_key(to_bytes(key), password=None)``), its RSA check skipped only where these very bytes
    passed it before (the module's docstring); None where cryptography will not load it as an unencrypted RSA key
    (google-auth's load then says why)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        data = pem.encode("utf-8")  # google/auth/_helpers.py ``to_bytes``
    except UnicodeEncodeError:
        return None
    digest = key_memo.digest_of(data)
    checked = key_memo.validated(digest)
    try:
        key = (serialization.load_pem_private_key(data, password=None, unsafe_skip_rsa_key_validation=True) if checked
               else serialization.load_pem_private_key(data, password=None))
    except (ValueError, TypeError, UnsupportedAlgorithm):  # (TypeError: an encrypted key, or a cryptography < 39)
        return None
    if not isinstance(key, rsa.RSAPrivateKey):  # an EC key loads too, and google-auth's RSA signer then fails
        return None
    if not checked:
        key_memo.remember(digest)
    return key


class ServiceAccountGrant(credentials.CredentialsWithQuotaProject):  # type: ignore[misc]
    """A service account's credentials refreshed with the JWT-bearer grant, as google/oauth2/service_account.py
    ``Credentials`` (scoped, no subject, no additional claims, the default universe) refreshes them."""

    def __init__(self, key: RSAPrivateKey, *, email: str, token_uri: str, key_id: str | None, scopes: list[str],
                 project_id: Any, quota_project_id: str | None, source: str) -> None:
        super().__init__()
        self._key = key
        self._service_account_email = email
        self._token_uri = token_uri
        self._key_id = key_id
        self._scopes = scopes
        self._project_id = project_id
        self._quota_project_id = quota_project_id
        self._source = source

    @property
    def service_account_email(self) -> str:
        return self._service_account_email

    @property
    def project_id(self) -> Any:
        """The key file's project_id (``Credentials.project_id``)."""
        return self._project_id

    @property
    def scopes(self) -> list[str]:
        return self._scopes

    @property
    def requires_scopes(self) -> bool:
        return not self._scopes

    def with_quota_project(self, quota_project_id: str | None) -> ServiceAccountGrant:
        """A copy with another quota project (``Credentials.with_quota_project``; google-cloud-storage's client
        calls it where its options name one)."""
        copy = ServiceAccountGrant(self._key, email=self._service_account_email, token_uri=self._token_uri,
                                   key_id=self._key_id, scopes=list(self._scopes), project_id=self._project_id,
                                   quota_project_id=quota_project_id, source=self._source)
        return copy

    def get_cred_info(self) -> dict[str, str]:
        """``Credentials.get_cred_info`` of a service account loaded from a file."""
        return {"credential_source": self._source, "credential_type": "service account credentials",
                "principal": self._service_account_email}

    def _metric_header_for_usage(self) -> str:
        """``Credentials._metric_header_for_usage``: the grant's token, not a self-signed JWT."""
        return str(metrics.CRED_TYPE_SA_ASSERTION)

    def apply(self, headers: Any, token: str | None = None) -> None:
        """``CredentialsWithRegionalAccessBoundary.apply`` with the lookup off: the token, the quota project, and no
        stale access-boundary header."""
        super().apply(headers, token)
        headers.pop(ACCESS_BOUNDARY_HEADER, None)

    def assertion(self) -> bytes:
        """The signed JWT the grant sends, made now: google/oauth2/service_account.py
        ``_make_authorization_grant_assertion``, signed as google/auth/jwt.py ``encode`` signs it (RS256, RSASSA
        PKCS#1 v1.5 over SHA-256, google/auth/crypt/_cryptography_rsa.py ``RSASigner.sign``)."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        now = _helpers.utcnow()
        payload = {
            "iat": _helpers.datetime_to_secs(now),
            "exp": _helpers.datetime_to_secs(now + ASSERTION_LIFETIME),
            "iss": self._service_account_email,
            "aud": ASSERTION_AUDIENCE,
            "scope": _helpers.scopes_to_string(self._scopes),
        }
        # ``jwt.encode``: the header's keys in this order, kid only where the key file gave one
        header: dict[str, Any] = {"typ": "JWT", "alg": "RS256"}
        if self._key_id is not None:
            header["kid"] = self._key_id
        segments = [_helpers.unpadded_urlsafe_b64encode(json.dumps(header).encode("utf-8")),
                    _helpers.unpadded_urlsafe_b64encode(json.dumps(payload).encode("utf-8"))]
        signature = self._key.sign(b".".join(segments), padding.PKCS1v15(), hashes.SHA256())
        segments.append(_helpers.unpadded_urlsafe_b64encode(signature))
        return b".".join(segments)

    def refresh(self, request: Any) -> None:
        """The JWT-bearer grant over ``request`` (a google-auth transport): google/oauth2/_client.py ``jwt_grant``;
        the token and its expiry set as ``Credentials._perform_refresh_token`` sets them."""
        body = {"assertion": self.assertion(), "grant_type": JWT_GRANT_TYPE}
        headers = {metrics.API_CLIENT_HEADER: metrics.token_request_access_token_sa_assertion()}
        answer = _token_endpoint_request(request, self._token_uri, body, headers)
        try:
            token = answer["access_token"]
        except KeyError as exc:
            raise exceptions.RefreshError("No access token in response.", answer, retryable=False) from exc
        self.token = token
        self.expiry = _parse_expiry(answer)


def _token_endpoint_request(request: Any, token_uri: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
    """The grant's POST, retried as google/oauth2/_client.py ``_token_endpoint_request_no_throw`` retries it (three
    attempts at most, with google-auth's own exponential backoff between them, only for an answer ``_can_retry``
    takes; a transport's error is raised at once), its error answer raised as ``_handle_error_response`` raises it."""
    sent = {"Content-Type": URLENCODED, **headers}
    data = urllib.parse.urlencode(body).encode("utf-8")
    answer: Any = {}
    retryable = False
    for _ in _exponential_backoff.ExponentialBackoff():
        response = request(method="POST", url=token_uri, headers=sent, body=data)
        text = response.data.decode("utf-8") if hasattr(response.data, "decode") else response.data
        try:
            answer = json.loads(text)
        except ValueError:
            answer = text
        if response.status == http.client.OK:
            return answer
        retryable = _can_retry(response.status, answer)
        if not retryable:
            break
    _raise_error_answer(answer, retryable)


def _can_retry(status: int, answer: Any) -> bool:
    """google/oauth2/_client.py ``_can_retry``: google-auth's retryable statuses (google/auth/transport
    ``DEFAULT_RETRYABLE_STATUS_CODES``), or an OAuth error naming a passing failure (RFC 6749 section 4.1.2.1)."""
    if status in transport.DEFAULT_RETRYABLE_STATUS_CODES:
        return True
    try:
        description = answer.get("error_description") or ""
        code = answer.get("error") or ""
    except AttributeError:
        return False
    if not isinstance(code, str) or not isinstance(description, str):
        return False
    return any(word in ("internal_failure", "server_error", "temporarily_unavailable") for word in (code, description))


def _raise_error_answer(answer: Any, retryable: bool) -> NoReturn:
    """google/oauth2/_client.py ``_handle_error_response``: ``RefreshError("error: error_description", answer)``,
    the answer itself where it is not JSON, its JSON where it has no ``error``."""
    if isinstance(answer, str):
        raise exceptions.RefreshError(answer, retryable=retryable)
    try:
        details = "{}: {}".format(answer["error"], answer.get("error_description"))
    except (KeyError, ValueError):
        details = json.dumps(answer)
    raise exceptions.RefreshError(details, answer, retryable=retryable)


def _parse_expiry(answer: Mapping[str, Any]) -> datetime.datetime | None:
    """google/oauth2/_client.py ``_parse_expiry``: now plus ``expires_in`` seconds (a JSON string of them taken
    too); None where the answer gives none (a token google-auth then never counts as expired)."""
    expires_in = answer.get("expires_in", None)
    if expires_in is None:
        return None
    if isinstance(expires_in, str):
        expires_in = int(expires_in)
    return _helpers.utcnow() + datetime.timedelta(seconds=expires_in)  # type: ignore[no-any-return]
