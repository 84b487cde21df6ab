"""Azure OpenAI's paths as the simulated server speaks them: a resource's deployments, ``api-version`` on every
call, the key in ``api-key`` (or a Microsoft Entra ID token in ``Authorization: Bearer``), to the Chat Completions
format (:mod:`simserver.openai`) and OpenAI's Files and Batches (:mod:`simserver.batch_openai`).

    ``POST /openai/deployments/{deployment}/chat/completions?api-version=V``  Chat Completions; the answer names the
                                     model behind the deployment, as Azure's do.
    ``GET  /openai/models?api-version=V``  the models the resource offers (the pre-flight check's free call).
    ``/openai/files…``, ``/openai/batches…``  OpenAI's Files and Batch API with ``api-version``; a line's ``url``
                                     and the batch's ``endpoint`` are ``/chat/completions``, its ``model`` a deployment.
    ``POST /sim/azure/deployments``  ``{"deployments": {"NAME": "MODEL", ...}}`` makes only those deployments exist
                                     (``null``: any name is a deployment serving the model of its own name);
                                     ``GET`` shows them.
    ``GET  /sim/azure/identity``     a managed identity endpoint as App Service serves it (point azure-identity's
                                     IDENTITY_ENDPOINT here, IDENTITY_HEADER anything): a Microsoft Entra ID token
                                     for ``resource=https://cognitiveservices.azure.com``, which the resource then
                                     takes as its key (https://learn.microsoft.com/azure/app-service/
                                     overview-managed-identity, "REST endpoint reference").

Azure's rules, each from the Azure OpenAI REST reference (https://learn.microsoft.com/azure/ai-services/openai/reference)
unless marked: every data-plane call needs ``api-version`` in the query; without it the service answers 404
"Resource not found", with one it does not serve 400 "API version not supported". A deployment the resource does not
have is 404 ``DeploymentNotFound``. A missing key is 401 "Access denied due to missing subscription key", a wrong one
401 "Access denied due to invalid subscription key or wrong API endpoint"; Azure's own errors are
``{"error": {"code", "message"}}``, a model's refusal of a body keeps OpenAI's shape. Rate limits are 429 with
``retry-after`` and only the ``x-ratelimit-remaining-*`` headers (learn.microsoft.com/azure/ai-services/openai/
how-to/quota, "Understanding rate limits"). Batches take API version 2024-07-01-preview or later
(learn.microsoft.com/azure/ai-services/openai/how-to/batch); a line naming a deployment the resource does not have
fails the batch's validation (``model_not_found``). Strict mode checks a body as OpenAI's Chat Completions with the
capability rules of the model behind the deployment.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import strict, strict_openai
from .batch_openai import OpenAIBatches, _read_lines
from .batches import Batch, new_id, page
from .buckets import Blocked, Bucket
from .openai import OPENAI, OpenAIFormat
from .refusals import Refusal
from .wire import Ask, response, retry_headers

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["API_VERSIONS", "AzureFormat", "add_routes", "set_deployments"]

NAME = "azure-openai"
#: the data-plane API versions served (GA and preview, from the REST reference's version list and
#: https://learn.microsoft.com/azure/ai-services/openai/api-version-deprecation; 2025-10-01-preview and 2025-12-01,
#: the versions service tiers need, from Azure's priority processing page)
API_VERSIONS = frozenset({
    "2022-12-01", "2023-05-15", "2024-02-01", "2024-06-01", "2024-10-21",
    "2024-07-01-preview", "2024-08-01-preview", "2024-09-01-preview", "2024-10-01-preview", "2024-12-01-preview",
    "2025-01-01-preview", "2025-02-01-preview", "2025-03-01-preview", "2025-04-01-preview", "2025-10-01-preview",
    "2025-12-01", "preview", "latest",
})
#: the first API version with the Batch API (Azure's batch how-to)
BATCH_SINCE = "2024-07-01"
ENDPOINT = "/chat/completions"
#: the audience of Azure OpenAI's Entra ID tokens (its scope without ``/.default``)
AUDIENCE = "https://cognitiveservices.azure.com"
_OPENAI_ENDPOINT = "/v1/chat/completions"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def azure_error(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """Azure's own error body (REST reference, "Error response")."""
    return response(status, {"error": {"code": code, "message": message}}, dict(headers or {}))


def version_problem(request: web.Request, *, batch: bool = False) -> web.Response | None:
    """Azure's answer to a call without a usable ``api-version``, or None."""
    version = request.query.get("api-version")
    if not version:
        return azure_error(404, "404", "Resource not found")
    if version not in API_VERSIONS or (batch and version[:10] < BATCH_SINCE and version not in ("preview", "latest")):
        return azure_error(400, "BadRequest", "API version not supported")
    return None


class AzureFormat(OpenAIFormat):
    """Chat Completions on a deployment of one simulated resource (:class:`AzureResource`)."""

    name = NAME

    def __init__(self, resource: AzureResource) -> None:
        self.resource = resource

    def parse(self, body: Any, request: web.Request) -> Ask:  # type: ignore[override]
        deployment = request.match_info.get("deployment") or (body.get("model") if isinstance(body, dict) else "")
        fixed = {**body, "model": self.resource.model_of(str(deployment or ""))} if isinstance(body, dict) else body
        return OPENAI.parse(fixed, request)

    def key(self, request: web.Request) -> str:
        """The key sent, or for a token this resource's identity endpoint issued, the key it stands for."""
        key = request.headers.get("api-key", "").strip() or super().key(request)
        if key in self.resource.issued:
            return self.resource.server.config.api_key or key
        return key

    def rate_headers(self, buckets: list[Bucket], headers: dict[str, str]) -> None:
        for b in buckets:
            if b.kind in ("requests", "tokens"):
                headers[f"x-ratelimit-remaining-{b.kind}"] = str(b.remaining())

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return azure_error(401, "401", "Access denied due to missing subscription key. Make sure to include "
                           "subscription key when making requests to an API.", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        return azure_error(401, "401", "Access denied due to invalid subscription key or wrong API endpoint. Make "
                           "sure to provide a valid key for an active subscription and use a correct regional API "
                           "endpoint for your resource.", headers)

    def limited(self, model: str, blocked: Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        what = "request" if blocked is None or blocked.bucket.kind == "requests" else "token"
        return azure_error(429, "429", f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API "
                           f"have exceeded {what} rate limit of your current pricing tier. Please retry after "
                           f"{max(1, round(retry))} seconds.", headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        return azure_error(429, "429", "The deployment's quota is used up for now. Please retry later or raise "
                           "the deployment's quota.", headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return azure_error(500, "InternalServerError", "The server had an error while processing your request.",
                           headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return azure_error(503, "ServiceUnavailable", "The service is temporarily unable to process your request.",
                           headers)


def _strict_rule(body: dict[str, Any], model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """OpenAI's Chat Completions rules with the model behind the deployment (``model``); Azure needs no ``model``
    in the body (the path names the deployment)."""
    return strict_openai.refusal({**body, "model": model}, model, _OPENAI_ENDPOINT)


strict.RULES[NAME] = _strict_rule


class AzureResource:
    """One simulated Azure OpenAI resource on a server: its deployments and its routes."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        #: deployment -> model; None: every name is a deployment of the model of that name
        self.deployments: dict[str, str] | None = None
        #: the Entra ID tokens the identity endpoint gave out
        self.issued: set[str] = set()
        self.format = AzureFormat(self)
        self.batches = AzureBatches(server, self)

    def model_of(self, deployment: str) -> str:
        return (self.deployments or {}).get(deployment, deployment)

    def knows(self, deployment: str) -> bool:
        return self.deployments is None or deployment in self.deployments

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self.chat)
        app.router.add_get("/openai/models", self.models)
        app.router.add_post("/sim/azure/deployments", self.configure)
        app.router.add_get("/sim/azure/deployments", self.shown)
        app.router.add_get("/sim/azure/identity", self.identity)
        self.batches.add_routes(app)

    def key_problem(self, request: web.Request) -> web.Response | None:
        cfg = self.server.config
        if cfg.require_key or cfg.api_key is not None:
            key = self.format.key(request)
            if not key:
                return self.format.missing_key({})
            if cfg.api_key is not None and key != cfg.api_key:
                return self.format.wrong_key({})
        return None

    def refusal(self, request: web.Request) -> web.Response | None:
        """The answer to a call without a usable ``api-version`` or key, or None. (Not ``a or b``: before aiohttp
        3.12 a response is an empty mapping, so falsy, and the refusal would be passed over.)"""
        refused = version_problem(request)
        return refused if refused is not None else self.key_problem(request)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        if not self.knows(request.match_info["deployment"]):
            return azure_error(404, "DeploymentNotFound", "The API deployment for this resource does not exist. If "
                               "you created the deployment within the last 5 minutes, please wait a moment and try "
                               "again.")
        return await self.server.answer(request, self.format)

    async def models(self, request: web.Request) -> web.Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        names = sorted(set((self.deployments or {}).values())) or ["gpt-4o", "gpt-4o-mini"]
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 1700000000, "owned_by": "system", "status": "succeeded",
             "lifecycle_status": "generally-available",
             "capabilities": {"chat_completion": True, "completion": False, "embeddings": False,
                              "fine_tune": False, "inference": True}} for name in names]})

    async def configure(self, request: web.Request) -> web.Response:
        try:
            given = json.loads(await request.read()).get("deployments")
            if given is not None and not (isinstance(given, dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in given.items())):
                raise TypeError("deployments must be an object of names to models, or null")
        except (ValueError, TypeError, AttributeError) as exc:
            return azure_error(400, "BadRequest", str(exc))
        self.deployments = dict(given) if given is not None else None
        return await self.shown(request)

    async def identity(self, request: web.Request) -> web.Response:
        """App Service's managed identity endpoint: ``api-version=2019-08-01``, ``resource``, ``X-IDENTITY-HEADER``."""
        if not request.headers.get("X-IDENTITY-HEADER"):
            return web.json_response({"error": "missing X-IDENTITY-HEADER"}, status=401)
        if request.query.get("resource", "").rstrip("/") != AUDIENCE:
            return web.json_response({"statusCode": 400, "message": f"this resource gives tokens for {AUDIENCE} only"},
                                     status=400)
        token = "sim-entra-" + os.urandom(16).hex()
        self.issued.add(token)
        return web.json_response({"access_token": token, "expires_on": str(int(time.time()) + 3600),
                                  "resource": AUDIENCE, "token_type": "Bearer"})

    async def shown(self, request: web.Request) -> web.Response:
        return web.json_response({"deployments": self.deployments})


class AzureBatches(OpenAIBatches):
    """OpenAI's Files and Batch routes under ``/openai/`` with ``api-version``; batches are the ``azure``
    provider's in the server's batch store, their lines answered in the resource's format."""

    def __init__(self, server: SimServer, resource: AzureResource) -> None:
        super().__init__(server)
        self.resource = resource
        self.wire = resource.format

    def _versioned(self, handler: Handler) -> Handler:
        keyed = self._keyed(handler)

        async def run(request: web.Request) -> web.StreamResponse:
            refused = version_problem(request, batch=True)
            return refused if refused is not None else await keyed(request)
        return run

    def add_routes(self, app: web.Application) -> None:
        add, v = app.router.add_route, self._versioned
        add("POST", "/openai/files", v(self.create_file))
        add("GET", "/openai/files", v(self.list_files))
        add("GET", "/openai/files/{file_id}", v(self.get_file))
        add("GET", "/openai/files/{file_id}/content", v(self.file_content))
        add("DELETE", "/openai/files/{file_id}", v(self.delete_file))
        add("POST", "/openai/batches", v(self.create_batch))
        add("GET", "/openai/batches", v(self.list_batches))
        add("GET", "/openai/batches/{batch_id}", v(self.get_batch))
        add("POST", "/openai/batches/{batch_id}/cancel", v(self.cancel_batch))

    async def create_batch(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return OPENAI.error(400, "We could not parse the JSON body of your request.", "invalid_request_error",
                                None, {})
        if not isinstance(body, dict):
            return OPENAI.error(400, "The request body must be a JSON object.", "invalid_request_error", None, {})
        file_id, endpoint, metadata = body.get("input_file_id"), body.get("endpoint"), body.get("metadata")
        problem = None
        if endpoint != ENDPOINT:
            problem = (f"Invalid value for 'endpoint': Azure batches take '{ENDPOINT}'.", "endpoint")
        elif body.get("completion_window") != "24h":
            problem = ("Invalid value for 'completion_window': only '24h' is supported.", "completion_window")
        elif metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            problem = ("Invalid 'metadata': expected up to 16 string keys and string values.", "metadata")
        if problem is not None:
            return OPENAI.error(400, problem[0], "invalid_request_error", None, {}, problem[1])
        stored = self.store.files.get(file_id) if isinstance(file_id, str) else None
        if stored is None or stored.purpose != "batch":
            return OPENAI.error(404, f"No batch input file found with id {file_id!r}.", "invalid_request_error",
                                None, {}, "input_file_id")
        lines, errors = _read_lines(_as_openai_urls(stored.data), _OPENAI_ENDPOINT)
        for error in errors:
            error["message"] = error["message"].replace(_OPENAI_ENDPOINT, ENDPOINT)
        for number, line in enumerate(lines, 1):
            line.fmt = self.resource.format
            deployment = str(line.body.get("model") or "")
            if not self.resource.knows(deployment):
                errors.append({"code": "model_not_found", "message": f"The provided model deployment "
                               f"'{deployment}' does not exist in the AOAI resource.", "param": "body.model",
                               "line": _line_number(stored.data, line.custom_id) or number})
        model = next((self.resource.model_of(str(line.body.get("model"))) for line in lines), None)
        info = {"input_file_id": file_id, "endpoint": endpoint, "metadata": metadata, "model": model,
                "output_file_id": None, "error_file_id": None, "errors": None}
        batch = self.store.add(new_id("batch_"), "azure", [] if errors else lines, info, self._write_files)
        if errors:
            info["errors"] = {"object": "list", "data": errors}
            self.store.fail(batch)
        return web.json_response(self._batch_json(batch, created=True))

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch_id = request.match_info["batch_id"]
        batch = self.store.get(batch_id, "azure")
        if batch is None:
            return OPENAI.error(404, f"No batch found with id '{batch_id}'.", "invalid_request_error", None, {},
                                "batch_id")
        return batch

    async def list_batches(self, request: web.Request) -> web.Response:
        chosen, more = page(self.store.listed("azure"), lambda b: b.id, request.query.get("limit"),
                            request.query.get("after"))
        items = [self._batch_json(b) for b in chosen]
        return web.json_response({"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                                  "last_id": items[-1]["id"] if items else None, "has_more": more})


def _as_openai_urls(data: bytes) -> bytes:
    """The input file with Azure's line url (``/chat/completions``) written as OpenAI's, so OpenAI's line reader
    checks the rest; other lines are kept as they are (its errors then name them, line numbers unchanged) but for
    OpenAI's url, made one that matches nothing."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    out = []
    for raw in text.splitlines():
        try:
            item = json.loads(raw)
        except ValueError:
            item = None
        if isinstance(item, dict) and item.get("url") in (ENDPOINT, _OPENAI_ENDPOINT):
            # OpenAI's own url is not Azure's: it stays a mismatched url
            raw = json.dumps({**item, "url": _OPENAI_ENDPOINT if item["url"] == ENDPOINT else None},
                             ensure_ascii=False)
        out.append(raw)
    return "\n".join(out).encode()


def _line_number(data: bytes, custom_id: str) -> int | None:
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        try:
            if json.loads(raw).get("custom_id") == custom_id:
                return number
        except (ValueError, AttributeError):
            continue
    return None


#: each server's resource, for :func:`set_deployments`
_RESOURCES: weakref.WeakKeyDictionary[Any, AzureResource] = weakref.WeakKeyDictionary()


def set_deployments(server: SimServer, deployments: Mapping[str, str] | None) -> None:
    """In the server's process, what ``POST /sim/azure/deployments`` does: only these deployments (name -> model)
    exist, or with None any name is a deployment of the model of that name."""
    _RESOURCES[server].deployments = dict(deployments) if deployments is not None else None


def add_routes(server: Any, app: Any) -> None:
    """Add one simulated Azure OpenAI resource's routes to ``app`` (``server`` is the
    :class:`~simserver.server.SimServer`)."""
    _RESOURCES[server] = AzureResource(server)
    _RESOURCES[server].add_routes(app)
