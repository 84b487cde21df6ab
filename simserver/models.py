"""The simulated server's model lookups, what a pre-flight check asks (``runner check``, the first seconds of
``runner submit``): each API's cheapest call, answered in its own shape.

    ``GET /v1/models``, ``GET /v1/models/{model}``  OpenAI's list and retrieve; Anthropic's when the request carries
                                                   ``anthropic-version`` or ``x-api-key``; Gemini's (v1) when it
                                                   carries ``x-goog-api-key`` or ``?key=``.
    ``GET /v1beta/models``, ``GET /v1beta/models/{model}``  Gemini's list and get.

Every model is known unless ``SimConfig.models`` names the known ones (``--models a,b``); an unknown model is each
API's 404. The key is checked as on the model routes (``require_key``, ``api_key``) with each format's 401/400. A
lookup is not a model request: it is not counted in ``received``, ``by_route`` or ``by_status``, draws no fault dice
and takes nothing from the rate-limit buckets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from .anthropic import ANTHROPIC
from .gemini import GEMINI
from .openai import OPENAI
from .wire import WireFormat, key_refused, response

if TYPE_CHECKING:
    from .server import SimServer

#: the time every simulated model was "created" (OpenAI's ``created`` is Unix seconds, Anthropic's RFC 3339)
CREATED = 1700000000
CREATED_AT = "2023-11-14T22:13:20Z"
#: the models a list names when every model is known (the ones the bundled jobs and tests use most)
LISTED = ("sim-model", "gpt-4o-mini", "claude-haiku-4-5", "gemini-2.0-flash")


def known_models(server: SimServer) -> tuple[str, ...] | None:
    """The models the server knows (``SimConfig.models``, comma-separated), or None when it knows every model."""
    names = server.config.models
    if names is None:
        return None
    return tuple(name.strip() for name in names.split(",") if name.strip())


def _format_of(request: web.Request) -> WireFormat:
    """Whose lookup a ``/v1/models`` request is, by the headers each SDK sends (the paths are the same)."""
    if request.path.startswith("/v1beta/") or request.headers.get("x-goog-api-key") or "key" in request.query:
        return GEMINI
    if request.headers.get("anthropic-version") or request.headers.get("x-api-key"):
        return ANTHROPIC
    return OPENAI


def _openai_model(name: str) -> dict[str, Any]:
    # https://platform.openai.com/docs/api-reference/models/object (openai.types.Model)
    return {"id": name, "object": "model", "created": CREATED, "owned_by": "simulated"}


def _anthropic_model(name: str) -> dict[str, Any]:
    # https://docs.anthropic.com/en/api/models (anthropic.types.ModelInfo: id, type, display_name, created_at)
    return {"type": "model", "id": name, "display_name": name, "created_at": CREATED_AT, "lifecycle": "active"}


def _gemini_model(name: str) -> dict[str, Any]:
    # https://ai.google.dev/api/models#Model (google.genai.types.Model)
    return {"name": f"models/{name}", "version": "001", "displayName": name, "inputTokenLimit": 1048576,
            "outputTokenLimit": 8192, "supportedGenerationMethods": ["generateContent", "countTokens"]}


def _not_found(fmt: WireFormat, model: str, api_version: str, headers: dict[str, str]) -> web.Response:
    """Each API's 404 for a model it does not know."""
    if fmt is ANTHROPIC:
        # https://docs.anthropic.com/en/api/errors: 404 not_found_error; the message names the model as "model: X"
        return ANTHROPIC.error(404, "not_found_error", f"model: {model}", headers)
    if fmt is GEMINI:
        # google.rpc.Status with NOT_FOUND (https://ai.google.dev/api/rest/v1beta/Status); wording as the API's
        # generateContent 404 is widely reported ("models/X is not found for API version v1beta, ...")
        return GEMINI.error(404, "NOT_FOUND", f"models/{model} is not found for API version {api_version}.", headers)
    # code model_not_found (https://platform.openai.com/docs/guides/error-codes); wording as the API answers it
    return OPENAI.error(404, f"The model `{model}` does not exist or you do not have access to it.",
                        "invalid_request_error", "model_not_found", headers)


def add_routes(server: SimServer, app: web.Application) -> None:
    """The lookups' routes on ``app``, answering from ``server``'s config."""

    async def retrieve(request: web.Request) -> web.Response:
        fmt = _format_of(request)
        headers = fmt.new_headers()
        if (refused := key_refused(server.config, fmt, request, headers)) is not None:
            return refused
        model = request.match_info["model"].removeprefix("models/")
        known = known_models(server)
        if known is not None and model not in known:
            return _not_found(fmt, model, request.path.split("/")[1], headers)
        shape = {OPENAI.name: _openai_model, ANTHROPIC.name: _anthropic_model}.get(fmt.name, _gemini_model)
        return response(200, shape(model), headers)

    async def listing(request: web.Request) -> web.Response:
        fmt = _format_of(request)
        headers = fmt.new_headers()
        if (refused := key_refused(server.config, fmt, request, headers)) is not None:
            return refused
        names = known_models(server) or LISTED
        if fmt is ANTHROPIC:
            body: dict[str, Any] = {"data": [_anthropic_model(n) for n in names], "has_more": False,
                                    "first_id": names[0] if names else None, "last_id": names[-1] if names else None}
        elif fmt is GEMINI:
            body = {"models": [_gemini_model(n) for n in names]}
        else:
            body = {"object": "list", "data": [_openai_model(n) for n in names]}
        return response(200, body, headers)

    for version in ("v1", "v1beta"):
        app.router.add_get(f"/{version}/models", listing)
        # {model:[^:]+}: a Gemini model's ``:generateContent`` stays the model routes' (those are POSTs anyway)
        app.router.add_get(f"/{version}/models/{{model:[^:]+}}", retrieve)
