"""Vertex AI's paths as the simulated server speaks them: Gemini and Claude on Vertex, Google's OAuth token endpoint
and the publisher-model lookup a pre-flight check asks.

    ``POST /v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent``
        Gemini's generateContent (the format of :mod:`simserver.gemini`, the model read from the path).
    ``POST /v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict``
        Claude on Vertex: the Messages body without ``model`` and with ``anthropic_version: "vertex-2023-10-16"``,
        answered in the Messages format (:mod:`simserver.anthropic`), without Anthropic's rate-limit headers.
    ``POST /token``
        Google's OAuth 2.0 token endpoint for the credentials' ``token_uri``: a service account's JWT grant or an
        authorized user's refresh-token grant gets ``{"access_token", "expires_in": 3600, "token_type": "Bearer"}``.
        A grant whose subject (the JWT's ``iss``, or the refresh token) contains ``revoked`` is refused with
        400 ``invalid_grant``, as Google refuses a revoked token.
    ``GET /v1/publishers/{publisher}/models/{model}`` (and under ``projects/{p}/locations/{l}/``)
        Model Garden's GetPublisherModel (google-genai's ``models.get`` in Vertex mode); 404 for a model the
        server does not know (a ``models`` list in its config, when it has one; every model otherwise).
    ``.../batchPredictionJobs`` and Cloud Storage's ``/storage/v1/``, ``/upload/storage/v1/``, ``/download/...``
        Batch prediction (:mod:`simserver.batch_vertex`) and its files (:mod:`simserver.gcs`).

The model routes take only an access token this server issued (``Authorization: Bearer``); none, or another,
is a 401 ``UNAUTHENTICATED`` in Google's error shape. Tokens are self-checking (an HMAC of a per-process secret),
so no server keeps a list of them. Strict rules (``simserver.strict.RULES``): Gemini's are strict_gemini's of
generativelanguage v1beta (the field set closest to Vertex v1's GenerateContentRequest, which has
systemInstruction, responseMimeType, responseJsonSchema and thinkingConfig), plus Vertex's ``labels``; Claude's
are strict_anthropic's under API version 2023-06-01 (the one ``vertex-2023-10-16`` tracks), plus Vertex's own:
``anthropic_version`` in the body must be ``vertex-2023-10-16`` and ``model`` must not be there (it is in the path),
and structured outputs only for the Claude models Vertex serves them for (``simserver.model_rules.PLATFORMS``).
Source: https://docs.claude.com/en/api/claude-on-vertex-ai ("anthropic_version is passed in the request body
(rather than as a header), and must be set to the value vertex-2023-10-16"; "model is not passed in the request
body; it is specified in the Google Cloud endpoint URL").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from . import strict, strict_anthropic, strict_gemini
from .anthropic import AnthropicFormat, _parse_anthropic
from .buckets import Bucket
from .gemini import GeminiFormat, _parse_gemini
from .refusals import Refusal
from .wire import Ask, Invalid, response

__all__ = ["VERTEX_CLAUDE", "VERTEX_GEMINI", "VERTEX_VERSION", "add_routes", "issue_token", "token_valid"]

#: the value Claude on Vertex takes in the body's ``anthropic_version`` (see the module docstring)
VERTEX_VERSION = "vertex-2023-10-16"
_SECRET = os.urandom(16)
_PREFIX = "ya29.sim-"
_VERTEX = "/v1/projects/{project}/locations/{location}/publishers"


def issue_token() -> str:
    """A fresh access token this process's servers accept."""
    nonce = os.urandom(12).hex()
    return f"{_PREFIX}{nonce}.{hmac.new(_SECRET, nonce.encode(), hashlib.sha256).hexdigest()[:32]}"


def token_valid(token: str) -> bool:
    if not token.startswith(_PREFIX) or "." not in token[len(_PREFIX):]:
        return False
    nonce, _, mac = token[len(_PREFIX):].partition(".")
    return hmac.compare_digest(mac, hmac.new(_SECRET, nonce.encode(), hashlib.sha256).hexdigest()[:32])


def _bearer(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    token = auth[7:].strip() if auth.startswith("Bearer ") else ""
    return token if token_valid(token) else ""


def _unauthenticated(headers: dict[str, str]) -> web.Response:
    # Google's answer to a missing or invalid OAuth token (google.rpc.Status, 401 UNAUTHENTICATED)
    return GeminiFormat.error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected "
                              "OAuth 2 access token, login cookie or other valid authentication credential. See "
                              "https://developers.google.com/identity/sign-in/web/devconsole-project.", headers,
                              [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                "reason": "ACCESS_TOKEN_TYPE_UNSUPPORTED",
                                "metadata": {"service": "aiplatform.googleapis.com",
                                             "method": "google.cloud.aiplatform.v1.PredictionService.Predict"}}])


class VertexGeminiFormat(GeminiFormat):
    """Gemini's format with Google Cloud's OAuth token for the key."""

    name = "vertex-gemini"
    parse = staticmethod(_parse_gemini)

    def key(self, request: web.Request) -> str:
        return _bearer(request)

    def cache_owner(self, request: web.Request) -> str:
        return _project(request)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return _unauthenticated(headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        return _unauthenticated(headers)


def _project(request: web.Request) -> str:
    """The project a request bills: Vertex keeps prompt caches per project, whatever token (refreshed every
    hour, and by each SDK on its own) the request carries."""
    return request.match_info.get("project", "")


def _parse_vertex_claude(body: Any, request: web.Request) -> Ask:
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.")
    if "model" in body:
        raise Invalid("model: Extra inputs are not permitted")
    return _parse_anthropic({**body, "model": request.match_info["model"]}, request)


class VertexClaudeFormat(AnthropicFormat):
    """The Messages format at Vertex's rawPredict: the model in the path, Google's OAuth token for the key, no
    ``anthropic-ratelimit-*`` headers (Vertex sends none)."""

    name = "vertex-anthropic"
    parse = staticmethod(_parse_vertex_claude)

    def key(self, request: web.Request) -> str:
        return _bearer(request)

    def cache_owner(self, request: web.Request) -> str:
        return _project(request)

    def rate_headers(self, buckets: list[Bucket], headers: dict[str, str]) -> None:
        pass

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return _unauthenticated(headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        return _unauthenticated(headers)


VERTEX_GEMINI = VertexGeminiFormat()
VERTEX_CLAUDE = VertexClaudeFormat()


#: a GenerateContentRequest label: "Label keys and values can be no longer than 63 characters (Unicode codepoints)
#: and can only contain lowercase letters, numeric characters, underscores, and dashes. [...] Label keys must start
#: with a letter." (cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.endpoints/generateContent;
#: the international characters it also allows are not taken here)
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def _labels_refusal(labels: Any) -> Refusal | None:
    if not isinstance(labels, dict):
        return Refusal("* GenerateContentRequest.labels: must be a map of strings\n")
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(str(key)) or not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
            return Refusal(f"* GenerateContentRequest.labels: label {key!r}: keys start with a lowercase letter; "
                           "keys and values are up to 63 lowercase letters, digits, underscores or dashes\n")
    return None


def _gemini_rule(body: dict[str, Any], model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """generativelanguage v1beta's rules, and Vertex's ``labels`` (which v1beta does not have)."""
    if "labels" in body:
        refused = _labels_refusal(body["labels"])
        if refused is not None:
            return refused
        body = {key: value for key, value in body.items() if key != "labels"}
    return strict_gemini.refusal(body, model, "v1beta")


def _claude_rule(body: dict[str, Any], model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    version = body.get("anthropic_version")
    if version is None:
        return Refusal("anthropic_version: Field required")
    if version != VERTEX_VERSION:
        return Refusal(f"anthropic_version: Input should be '{VERTEX_VERSION}'")
    rest = {key: value for key, value in body.items() if key != "anthropic_version"}
    return strict_anthropic.refusal(rest, model, {"anthropic-version": "2023-06-01"}, platform="vertex")


strict.RULES[VERTEX_GEMINI.name] = _gemini_rule
strict.RULES[VERTEX_CLAUDE.name] = _claude_rule


def _jwt_subject(assertion: str) -> str:
    try:
        payload = assertion.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return str(claims.get("iss", ""))
    except (IndexError, ValueError, AttributeError):
        return ""


async def _token(request: web.Request) -> web.Response:
    """Google's OAuth 2.0 token endpoint (RFC 6749 / RFC 7523 grants, as google-auth sends them)."""
    form = await request.post()
    grant = form.get("grant_type")
    if grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
        subject = _jwt_subject(str(form.get("assertion", "")))
    elif grant == "refresh_token":
        subject = str(form.get("refresh_token", ""))
    else:
        return web.json_response({"error": "unsupported_grant_type", "error_description": "Invalid grant_type."},
                                 status=400)
    if not subject:
        return web.json_response({"error": "invalid_request", "error_description": "Missing required parameter."},
                                 status=400)
    if "revoked" in subject:
        return web.json_response({"error": "invalid_grant", "error_description": "Token has been expired or "
                                  "revoked."}, status=400)
    return web.json_response({"access_token": issue_token(), "expires_in": 3600, "token_type": "Bearer"})


def _known(server: Any) -> set[str] | None:
    """The models the lookups know (``SimConfig.models``, comma-separated, a ``@version`` also known without it), or
    None when every model is."""
    names = getattr(server.config, "models", None)
    if not names:
        return None
    listed = names.split(",") if isinstance(names, str) else list(names)
    return {*listed, *(name.partition("@")[0] for name in listed)}


def add_routes(server: Any, app: web.Application) -> None:
    """Vertex's model routes, the token endpoint and the publisher-model lookup (see the module docstring), batch
    prediction's (:mod:`simserver.batch_vertex`) and the Cloud Storage objects it reads and writes
    (:mod:`simserver.gcs`)."""

    async def gemini(request: web.Request) -> web.Response:
        return await server.answer(request, VERTEX_GEMINI)

    async def claude(request: web.Request) -> web.Response:
        return await server.answer(request, VERTEX_CLAUDE)

    async def lookup(request: web.Request) -> web.Response:
        headers: dict[str, str] = {}
        if server.config.require_key and not _bearer(request):
            return _unauthenticated(headers)
        publisher, model = request.match_info["publisher"], request.match_info["model"]
        name = f"publishers/{publisher}/models/{model}"
        known = _known(server)
        if known is not None and model not in known:
            return GeminiFormat.error(404, "NOT_FOUND", f"Publisher Model `{name}` not found.", headers)
        return response(200, {"name": name, "versionId": "001", "openSourceCategory": "PROPRIETARY",
                              "launchStage": "GA", "publisherModelTemplate": name}, headers)

    app.router.add_post(_VERTEX + "/google/models/{model}:generateContent", gemini)
    app.router.add_post(_VERTEX + "/anthropic/models/{model}:rawPredict", claude)
    app.router.add_post("/token", _token)
    app.router.add_get("/v1/publishers/{publisher}/models/{model}", lookup)
    app.router.add_get(_VERTEX + "/{publisher}/models/{model}", lookup)
    from . import gcs  # (imported here: both import this module)
    from .batch_vertex import VertexBatchRoutes

    gcs.add_routes(server, app)
    VertexBatchRoutes(server).add_routes(app)
