"""Anthropic's Message Batches API as the simulated server speaks it (key ``x-api-key`` or ``Authorization:
Bearer``, errors as ``{"type": "error", ...}``); the batch state and line rules are :mod:`simserver.batches`'.

    ``POST   /v1/messages/batches``                 ``{"requests": [{"custom_id", "params"}]}``: the batch.
    ``GET    /v1/messages/batches``                 ``{"data", "has_more", "first_id", "last_id"}`` (newest first;
                                                    ``limit``, ``after_id``, ``before_id``).
    ``GET    /v1/messages/batches/{id}``            the batch.
    ``GET    /v1/messages/batches/{id}/results``    JSONL, one ``{"custom_id", "result"}`` per request in input
                                                    order, once the batch ended (a 400 before).
    ``POST   /v1/messages/batches/{id}/cancel``     the batch, ``canceling`` until the next look.
    ``DELETE /v1/messages/batches/{id}``            ``{"id", "type": "message_batch_deleted"}`` once ended.

``processing_status`` goes ``in_progress`` -> (``canceling``) -> ``ended``. ``request_counts`` are all
``processing`` until the end, then ``succeeded``, ``errored``, ``canceled`` and ``expired``, as Anthropic
counts them. ``results_url`` (null until the end) is this server's results route, built from the host the
request came to. A result is ``{"type": "succeeded", "message": <the Messages answer>}``, ``{"type":
"errored", "error": {"type": "error", "error": {"type": "api_error" | "invalid_request_error", "message"}}}``
(params are validated per line, as Anthropic does, so a bad one errors its line only), ``{"type":
"canceled"}`` or ``{"type": "expired"}``. Custom ids must match ``^[a-zA-Z0-9_-]{1,64}$`` and be unique.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .anthropic import ANTHROPIC
from .batches import Batch, BatchRoutes, Line, new_id, page, rfc3339
from .wire import compact

if TYPE_CHECKING:
    pass

__all__ = ["AnthropicBatches"]

_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_DAY = 86400


def _error(status: int, kind: str, message: str) -> web.Response:
    return ANTHROPIC.error(status, kind, message, ANTHROPIC.new_headers())


def _result(line: Line) -> dict[str, Any]:
    if line.outcome == "succeeded":
        return {"type": "succeeded", "message": line.answer}
    if line.outcome == "errored" and line.error is not None:
        kind, message = ("api_error", "Internal server error") if line.error.status >= 500 else (
            "invalid_request_error", line.error.message)
        return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message}}}
    return {"type": line.outcome}


class AnthropicBatches(BatchRoutes):
    """The routes of the Message Batches API on one server."""

    wire = ANTHROPIC

    def add_routes(self, app: web.Application) -> None:
        add = app.router.add_route
        add("POST", "/v1/messages/batches", self._keyed(self.create))
        add("GET", "/v1/messages/batches", self._keyed(self.list))
        add("GET", "/v1/messages/batches/{batch_id}", self._keyed(self.get))
        add("DELETE", "/v1/messages/batches/{batch_id}", self._keyed(self.delete))
        add("GET", "/v1/messages/batches/{batch_id}/results", self._keyed(self.results))
        add("POST", "/v1/messages/batches/{batch_id}/cancel", self._keyed(self.cancel))

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "invalid_request_error", "The request body is not valid JSON.")
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return _error(400, "invalid_request_error", "requests: at least one request is required")
        lines, seen = [], set()
        version = {"anthropic-version": request.headers.get("anthropic-version", "")}  # strict mode checks by it
        for i, item in enumerate(requests):
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
                return _error(400, "invalid_request_error",
                              f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            if custom_id in seen:
                return _error(400, "invalid_request_error",
                              f"requests.{i}.custom_id: custom_id '{custom_id}' is not unique within the batch")
            if not isinstance(item.get("params"), dict):
                return _error(400, "invalid_request_error", f"requests.{i}.params: Field required")
            seen.add(custom_id)
            lines.append(Line(custom_id, item["params"], ANTHROPIC, headers=version))
        batch = self.store.add(new_id("msgbatch_"), "anthropic", lines)
        return web.json_response(self._batch_json(batch, request))

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch_id = request.match_info["batch_id"]
        batch = self.store.get(batch_id, "anthropic")
        if batch is None:
            return _error(404, "not_found_error", f"Message Batch {batch_id} not found")
        return batch

    async def get(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else web.json_response(self._batch_json(batch, request))

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is not None:
            return _error(400, "invalid_request_error",
                          f"Message Batch {batch.id} has already ended and can no longer be canceled.")
        self.store.cancel(batch)
        return web.json_response(self._batch_json(batch, request))

    async def delete(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is None:
            return _error(400, "invalid_request_error",
                          f"Message Batch {batch.id} is still processing; cancel it before deleting it.")
        del self.store.batches[batch.id]
        return web.json_response({"id": batch.id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is None:
            return _error(400, "invalid_request_error",
                          f"Message Batch {batch.id} has not finished processing; its results are not ready.")
        data = "".join(compact({"custom_id": line.custom_id, "result": _result(line)}) + "\n"
                       for line in batch.lines)
        return web.Response(body=data.encode(), content_type="application/x-jsonl")

    async def list(self, request: web.Request) -> web.Response:
        query = request.query
        chosen, more = page(self.store.listed("anthropic"), lambda b: b.id, query.get("limit"),
                            query.get("after_id"), query.get("before_id"))
        return web.json_response({"data": [self._batch_json(b, request) for b in chosen], "has_more": more,
                                  "first_id": chosen[0].id if chosen else None,
                                  "last_id": chosen[-1].id if chosen else None})

    def _batch_json(self, batch: Batch, request: web.Request) -> dict[str, Any]:
        ended = batch.end is not None
        if ended:
            status = "ended"
        else:
            status = "canceling" if batch.cancel_at is not None else "in_progress"
        counts = {"processing": 0 if ended else len(batch.lines),
                  "succeeded": batch.count("succeeded"), "errored": batch.count("errored"),
                  "canceled": batch.count("canceled"), "expired": batch.count("expired")}
        origin = f"{request.scheme}://{request.host}"
        return {
            "id": batch.id, "type": "message_batch", "processing_status": status, "request_counts": counts,
            "ended_at": rfc3339(batch.ended_at) if batch.ended_at is not None else None,
            "created_at": rfc3339(batch.created), "expires_at": rfc3339(batch.created + _DAY),
            "archived_at": None,
            "cancel_initiated_at": rfc3339(batch.cancel_at) if batch.cancel_at is not None else None,
            "results_url": f"{origin}/v1/messages/batches/{batch.id}/results" if ended else None,
        }
