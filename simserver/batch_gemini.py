"""Gemini batch mode as the simulated server speaks it (key ``x-goog-api-key`` or ``?key=``, errors as
``{"error": {"code", "message", "status"}}``), under ``/v1beta/`` only, as Gemini serves it (``/v1/batches`` is
OpenAI's); the batch state and line rules are :mod:`simserver.batches`'. Mirrors what google-genai's
``batches`` module sends and reads in Gemini Developer API mode:

    ``POST   /v1beta/models/{model}:batchGenerateContent``  ``{"batch": {"displayName", "inputConfig":
             {"requests": {"requests": [{"request": <GenerateContentRequest>, "metadata": {...}}]}}}}``: an
             operation ``{"name": "batches/{id}", "metadata": <GenerateContentBatch>, "done"?, "response"?}``.
    ``GET    /v1beta/batches/{id}``           the operation; ``GET /v1beta/batches`` lists them
             (``{"operations", "nextPageToken"}``, newest first, ``pageSize`` and ``pageToken``).
    ``POST   /v1beta/batches/{id}:cancel``    ``{}``; the batch is ``CANCELLED`` at the next look.
    ``DELETE /v1beta/batches/{id}``           ``{}`` once it ended.

The metadata's ``state`` is ``BATCH_STATE_PENDING`` in the create answer, ``BATCH_STATE_RUNNING`` until the
end, then ``BATCH_STATE_SUCCEEDED``, ``BATCH_STATE_EXPIRED`` (a line expired, or ``/sim/batches/{id}/expire``)
or ``BATCH_STATE_CANCELLED``; the SDK shows them as ``JOB_STATE_*``. ``batchStats`` counts requests
(int64 strings). Once ended, ``output.inlinedResponses.inlinedResponses`` has one entry per request, in request
order (Gemini pairs them by position): ``{"response": <the generateContent answer>, "metadata"}`` or ``{"error":
{"code", "message"}, "metadata"}`` with a ``google.rpc.Code``: 13 INTERNAL (``batch_line_errors``), 3
INVALID_ARGUMENT (a request generateContent would reject, its message naming the field), 4 DEADLINE_EXCEEDED
(expired) or 1 CANCELLED (expired and canceled requests get an entry too, to keep the positions); no
``details``, which google-genai 3.x reads as a list of strings only (``JobError.details``). A create body
over 20 MB (20971520 bytes: inline requests are for batches under 20 MB, batch mode docs) is refused with 400
INVALID_ARGUMENT "Request payload size exceeds the limit: 20971520 bytes.", as Google's front end words it. A
request's custom id, for the ``batch_*`` hashes, is its ``metadata.key`` when it has one, else its position.
File input (``inputConfig.fileName``) is not supported (a 400).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .batches import Batch, BatchRoutes, Line, new_id, page, rfc3339
from .gemini import GEMINI

if TYPE_CHECKING:
    pass

__all__ = ["GeminiBatches"]

_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta."
_STATES = {"completed": "BATCH_STATE_SUCCEEDED", "expired": "BATCH_STATE_EXPIRED",
           "cancelled": "BATCH_STATE_CANCELLED", "failed": "BATCH_STATE_FAILED"}
_UNFINISHED = {"expired": {"code": 4, "message": "The batch expired before this request was processed."},
               "canceled": {"code": 1, "message": "The batch was cancelled before this request was processed."}}
#: Gemini takes inline requests while a batch's total request size stays under 20 MB (ai.google.dev/gemini-api/
#: docs/batch-mode, "Inline requests"); a larger body is refused as Google's front end refuses any request over it
INLINE_LIMIT = 20 * 1024 * 1024
_INTERNAL = ("An internal error has occurred. Please retry or report in "
             "https://developers.generativeai.google/guide/troubleshooting")


def _error(code: int, status: str, message: str) -> web.Response:
    return GEMINI.error(code, status, message, {})


def _entry(line: Line) -> dict[str, Any]:
    if line.outcome == "succeeded":
        entry: dict[str, Any] = {"response": line.answer}
    elif line.outcome == "errored" and line.error is not None:
        internal = line.error.status >= 500
        entry = {"error": {"code": 13 if internal else 3, "message": _INTERNAL if internal else line.error.message}}
    else:
        entry = {"error": _UNFINISHED[line.outcome or "expired"]}
    if line.metadata is not None:
        entry["metadata"] = line.metadata
    return entry


class GeminiBatches(BatchRoutes):
    """The routes of Gemini batch mode on one server."""

    wire = GEMINI

    def add_routes(self, app: web.Application) -> None:
        add = app.router.add_route
        add("POST", "/v1beta/models/{model}:batchGenerateContent", self._keyed(self.create))
        add("GET", "/v1beta/batches", self._keyed(self.list))
        add("GET", "/v1beta/batches/{batch_id}", self._keyed(self.get))
        add("DELETE", "/v1beta/batches/{batch_id}", self._keyed(self.delete))
        add("POST", "/v1beta/batches/{batch_id}:cancel", self._keyed(self.cancel))

    async def create(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if len(raw) > INLINE_LIMIT:
            return _error(400, "INVALID_ARGUMENT", f"Request payload size exceeds the limit: {INLINE_LIMIT} bytes.")
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        batch_spec = body.get("batch") if isinstance(body, dict) else None
        config = batch_spec.get("inputConfig", batch_spec.get("input_config")) if isinstance(batch_spec, dict) else None
        if not isinstance(config, dict):
            return _error(400, "INVALID_ARGUMENT", "* BatchGenerateContentRequest.batch.input_config: "
                          "input_config is not specified\n")
        if "fileName" in config or "file_name" in config:
            return _error(400, "INVALID_ARGUMENT", "The simulated server supports only inlined requests, "
                          "not input files.")
        requests = config.get("requests")
        requests = requests.get("requests") if isinstance(requests, dict) else None
        if not isinstance(requests, list) or not requests:
            return _error(400, "INVALID_ARGUMENT", "* BatchGenerateContentRequest.batch.input_config.requests: "
                          "at least one request is required\n")
        model = request.match_info["model"].removeprefix("models/")
        lines = []
        for i, item in enumerate(requests):
            inner = item.get("request") if isinstance(item, dict) else None
            if not isinstance(inner, dict):
                return _error(400, "INVALID_ARGUMENT", f"* BatchGenerateContentRequest.batch.input_config."
                              f"requests.requests[{i}].request: request is not specified\n")
            metadata = item.get("metadata")
            key = metadata.get("key") if isinstance(metadata, dict) else None
            line_model = inner.get("model") if isinstance(inner.get("model"), str) else model
            lines.append(Line(key if isinstance(key, str) and key else str(i), inner, GEMINI,
                              line_model.removeprefix("models/"), metadata))
        info = {"model": model, "displayName": batch_spec.get("displayName", batch_spec.get("display_name"))}
        batch = self.store.add(new_id(""), "gemini", lines, info)
        return web.json_response(self._operation(batch, created=True))

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch = self.store.get(request.match_info["batch_id"], "gemini")
        return batch if batch is not None else _error(404, "NOT_FOUND", "Requested entity was not found.")

    async def get(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else web.json_response(self._operation(batch))

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is not None:
            return _error(400, "FAILED_PRECONDITION", f"Batch batches/{batch.id} has already ended.")
        self.store.cancel(batch)
        return web.json_response({})

    async def delete(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is None:
            return _error(400, "FAILED_PRECONDITION", f"Batch batches/{batch.id} is still running; cancel it "
                          "before deleting it.")
        del self.store.batches[batch.id]
        return web.json_response({})

    async def list(self, request: web.Request) -> web.Response:
        query = request.query
        chosen, more = page(self.store.listed("gemini"), lambda b: b.id, query.get("pageSize"),
                            query.get("pageToken"))
        answer: dict[str, Any] = {"operations": [self._operation(b) for b in chosen]}
        if more and chosen:
            answer["nextPageToken"] = chosen[-1].id
        return web.json_response(answer)

    def _operation(self, batch: Batch, created: bool = False) -> dict[str, Any]:
        name = f"batches/{batch.id}"
        ended = batch.end is not None and not created
        n = len(batch.lines)
        if ended:
            stats = {"requestCount": str(n), "successfulRequestCount": str(batch.count("succeeded")),
                     "failedRequestCount": str(n - batch.count("succeeded")), "pendingRequestCount": "0"}
            state = _STATES[batch.end or "completed"]
        else:
            stats = {"requestCount": str(n), "pendingRequestCount": str(n)}
            state = "BATCH_STATE_PENDING" if created else "BATCH_STATE_RUNNING"
        updated = batch.ended_at if ended and batch.ended_at is not None else batch.created
        meta: dict[str, Any] = {"@type": _TYPE + "GenerateContentBatch", "model": f"models/{batch.info['model']}",
                                "createTime": rfc3339(batch.created), "updateTime": rfc3339(updated),
                                "batchStats": stats, "state": state, "name": name}
        if batch.info.get("displayName") is not None:
            meta["displayName"] = batch.info["displayName"]
        operation: dict[str, Any] = {"name": name, "metadata": meta}
        if ended:
            output = {"inlinedResponses": {"inlinedResponses": [_entry(line) for line in batch.lines]}}
            meta["endTime"] = rfc3339(updated)
            meta["output"] = output
            operation["done"] = True
            operation["response"] = {"@type": _TYPE + "GenerateContentBatchOutput", **output}
        return operation
