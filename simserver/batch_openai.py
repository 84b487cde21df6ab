"""OpenAI's Files and Batch APIs as the simulated server speaks them (key ``Authorization: Bearer``, errors as
``{"error": {...}}``); the batch state and line rules are :mod:`simserver.batches`'.

    ``POST   /v1/files``                  multipart ``file`` + ``purpose``: a file object (status ``processed``).
    ``GET    /v1/files``                  ``{"object": "list", "data", "first_id", "last_id", "has_more"}``;
                                          ``purpose``, ``limit``, ``after`` filter and page it (newest first).
    ``GET    /v1/files/{id}``             the file object; ``GET /v1/files/{id}/content`` its bytes.
    ``DELETE /v1/files/{id}``             ``{"id", "object": "file", "deleted": true}``.
    ``POST   /v1/batches``                ``{input_file_id, endpoint, completion_window: "24h", metadata}``;
                                          endpoint ``/v1/chat/completions`` or ``/v1/completions``.
    ``GET    /v1/batches``, ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

Statuses: the create answer says ``validating``; then ``in_progress`` (``finalizing`` in the last tenth of the
delay), and at the end ``completed``, or ``expired`` when a line expired (``batch_expire``) or the batch was
expired by ``/sim/batches/{id}/expire``; a cancel answers ``cancelling`` and the next look says ``cancelled``.
An input file that is not one JSON request per line (``custom_id`` unique, ``method`` POST, ``url`` the
batch's endpoint, ``body`` an object naming the same ``model`` as the first valid line: OpenAI's batch guide,
"each input file can only include requests to a single model") makes the batch ``failed`` with ``errors.data``
naming the lines (``{code, message, param, line}``, line numbers from 1), as OpenAI's validation does.
``request_counts`` are ``{total, completed, failed}`` (0 until the end; expired and canceled lines are in
neither), ``usage`` sums the answered lines' tokens. The output file (``output_file_id``) holds one line
``{id, custom_id, response: {status_code: 200, request_id, body}, error: null}`` per answered request, in
input order; the error file (``error_file_id``) holds the errored lines (``response.status_code`` 400 or 500
with the error body) and the unfinished ones with ``response: null`` and ``error.code`` ``batch_expired``
(as OpenAI writes them) or ``batch_cancelled``. Either id is null when its file would be empty.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .batches import Batch, BatchRoutes, Line, StoredFile, new_id, page
from .completions import COMPLETIONS
from .openai import OPENAI
from .wire import compact

if TYPE_CHECKING:
    pass

__all__ = ["OpenAIBatches"]

_ENDPOINTS = {"/v1/chat/completions": OPENAI, "/v1/completions": COMPLETIONS}
_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
_DAY = 86400
_EXPIRED = {"code": "batch_expired",
            "message": "This request could not be executed before the completion window expired."}
_CANCELLED = {"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."}


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> web.Response:
    return OPENAI.error(status, message, "invalid_request_error", code, OPENAI.new_headers(), param)


def _jsonl(items: list[dict[str, Any]]) -> bytes:
    return "".join(compact(item) + "\n" for item in items).encode()


def _file_json(stored: StoredFile) -> dict[str, Any]:
    return {"id": stored.id, "object": "file", "bytes": len(stored.data), "created_at": int(stored.created),
            "filename": stored.filename, "purpose": stored.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def _listing(items: list[dict[str, Any]], has_more: bool) -> web.Response:
    return web.json_response({"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                              "last_id": items[-1]["id"] if items else None, "has_more": has_more})


def _read_lines(data: bytes, endpoint: str) -> tuple[list[Line], list[dict[str, Any]]]:
    """The input file's requests, and the errors that fail the batch (``{code, message, param, line}``)."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []

    def fault(code: str, message: str, param: str | None, number: int | None) -> None:
        errors.append({"code": code, "message": message, "param": param, "line": number})

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        fault("invalid_file_format", "The input file is not UTF-8 encoded JSONL.", None, None)
        return [], errors
    seen: set[str] = set()
    model: Any = None  #: the model of the first valid line: every line must name the same
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:
            item = None
        if not isinstance(item, dict):
            fault("invalid_json_line", "This line is not parseable as valid JSON.", None, number)
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            fault("missing_required_parameter", "Missing required parameter: 'custom_id'.", "custom_id", number)
        elif custom_id in seen:
            fault("duplicate_custom_id", f"The custom_id '{custom_id}' is not unique within the batch.",
                  "custom_id", number)
        elif item.get("method") != "POST":
            fault("invalid_method", "The request's method must be 'POST'.", "method", number)
        elif item.get("url") != endpoint:
            fault("mismatched_url", f"The request's url must be the batch's endpoint, '{endpoint}'.", "url", number)
        elif not isinstance(item.get("body"), dict):
            fault("missing_required_parameter", "Missing required parameter: 'body'.", "body", number)
        elif model is not None and item["body"].get("model") != model:
            # "each input file can only include requests to a single model" (OpenAI's Batch API guide,
            # platform.openai.com/docs/guides/batch); the code and words are ours, the rule is OpenAI's
            fault("mismatched_model", f"The model '{item['body'].get('model')}' does not match the model of the "
                  f"batch's first request, '{model}': a batch takes requests to a single model.", "body.model",
                  number)
        else:
            model = item["body"].get("model") if model is None else model
            seen.add(custom_id)
            lines.append(Line(custom_id, item["body"], _ENDPOINTS[endpoint]))
    if not lines and not errors:
        fault("empty_file", "The input file has no requests.", None, None)
    return lines, errors


class OpenAIBatches(BatchRoutes):
    """The routes of the Files and Batch APIs on one server."""

    wire = OPENAI

    def add_routes(self, app: web.Application) -> None:
        add = app.router.add_route
        add("POST", "/v1/files", self._keyed(self.create_file))
        add("GET", "/v1/files", self._keyed(self.list_files))
        add("GET", "/v1/files/{file_id}", self._keyed(self.get_file))
        add("GET", "/v1/files/{file_id}/content", self._keyed(self.file_content))
        add("DELETE", "/v1/files/{file_id}", self._keyed(self.delete_file))
        add("POST", "/v1/batches", self._keyed(self.create_batch))
        add("GET", "/v1/batches", self._keyed(self.list_batches))
        add("GET", "/v1/batches/{batch_id}", self._keyed(self.get_batch))
        add("POST", "/v1/batches/{batch_id}/cancel", self._keyed(self.cancel_batch))

    # -- files -----------------------------------------------------------------------------------------

    async def create_file(self, request: web.Request) -> web.Response:
        try:
            form = await request.post()
        except ValueError:
            return _error(400, "The request must be multipart/form-data with 'file' and 'purpose'.")
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, web.FileField):
            return _error(400, "Missing required parameter: 'file'.", "file")
        if purpose not in _PURPOSES:
            return _error(400, f"Invalid value for 'purpose': expected one of {', '.join(_PURPOSES)}.", "purpose")
        stored = self.store.add_file(upload.filename or "upload.jsonl", purpose, upload.file.read())
        return web.json_response(_file_json(stored))

    def _file(self, request: web.Request) -> StoredFile | web.Response:
        file_id = request.match_info["file_id"]
        stored = self.store.files.get(file_id)
        return stored if stored is not None else _error(404, f"No such File object: {file_id}", "id")

    async def get_file(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        return stored if isinstance(stored, web.Response) else web.json_response(_file_json(stored))

    async def file_content(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        del self.store.files[stored.id]
        return web.json_response({"id": stored.id, "object": "file", "deleted": True})

    async def list_files(self, request: web.Request) -> web.Response:
        purpose = request.query.get("purpose")
        files = [f for f in reversed(self.store.files.values()) if purpose is None or f.purpose == purpose]
        if request.query.get("order") == "asc":
            files.reverse()
        chosen, more = page(files, lambda f: f.id, request.query.get("limit", 10000), request.query.get("after"))
        return _listing([_file_json(f) for f in chosen], more)

    # -- batches ---------------------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.")
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        metadata = body.get("metadata")
        if not isinstance(file_id, str) or not file_id:
            return _error(400, "Missing required parameter: 'input_file_id'.", "input_file_id")
        if endpoint not in _ENDPOINTS:
            return _error(400, f"Invalid value for 'endpoint': the simulated server batches only "
                          f"{' and '.join(_ENDPOINTS)}.", "endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "Invalid value for 'completion_window': only '24h' is supported.",
                          "completion_window")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            return _error(400, "Invalid 'metadata': expected up to 16 string keys and string values.", "metadata")
        stored = self.store.files.get(file_id)
        if stored is None:
            return _error(404, f"No such File object: {file_id}", "input_file_id")
        if stored.purpose != "batch":
            return _error(400, f"The file {file_id} was not uploaded with purpose 'batch'.", "input_file_id")
        lines, errors = _read_lines(stored.data, endpoint)
        model = next((line.body.get("model") for line in lines if isinstance(line.body.get("model"), str)), None)
        info = {"input_file_id": file_id, "endpoint": endpoint, "metadata": metadata, "model": model,
                "output_file_id": None, "error_file_id": None, "errors": None}
        batch = self.store.add(new_id("batch_"), "openai", [] if errors else lines, info, self._write_files)
        if errors:
            info["errors"] = {"object": "list", "data": errors}
            self.store.fail(batch)
        return web.json_response(self._batch_json(batch, created=True))

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch_id = request.match_info["batch_id"]
        batch = self.store.get(batch_id, "openai")
        return batch if batch is not None else _error(404, f"No batch found with id '{batch_id}'.", "batch_id")

    async def get_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else web.json_response(self._batch_json(batch))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is not None:
            status = self._batch_json(batch)["status"]
            return _error(409, f"Cannot cancel a batch with status '{status}'.", None, "batch_not_cancellable")
        self.store.cancel(batch)
        return web.json_response(self._batch_json(batch))

    async def list_batches(self, request: web.Request) -> web.Response:
        chosen, more = page(self.store.listed("openai"), lambda b: b.id, request.query.get("limit"),
                            request.query.get("after"))
        return _listing([self._batch_json(b) for b in chosen], more)

    def _status(self, batch: Batch, created: bool) -> str:
        if created:
            return "validating"
        if batch.end is not None:
            return batch.end
        if batch.cancel_at is not None:
            return "cancelling"
        return "finalizing" if self.store.elapsed(batch) >= 0.9 * batch.delay else "in_progress"

    def _batch_json(self, batch: Batch, created: bool = False) -> dict[str, Any]:
        status = self._status(batch, created)
        info, made = batch.info, int(batch.created)
        ended = int(batch.ended_at) if batch.ended_at is not None else None
        usage = None
        if batch.end is not None and batch.end != "failed":
            answered = [line.answer["usage"] for line in batch.lines if line.answer is not None]
            usage_in = sum(u["prompt_tokens"] for u in answered)
            usage_out = sum(u["completion_tokens"] for u in answered)
            usage = {"input_tokens": usage_in, "input_tokens_details": {"cached_tokens": 0},
                     "output_tokens": usage_out, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": usage_in + usage_out}
        done = batch.end is not None
        return {
            "id": batch.id, "object": "batch", "endpoint": info["endpoint"], "model": info["model"],
            "errors": info["errors"], "input_file_id": info["input_file_id"], "completion_window": "24h",
            "status": status, "output_file_id": info["output_file_id"], "error_file_id": info["error_file_id"],
            "created_at": made, "in_progress_at": made if status not in ("validating", "failed") else None,
            "expires_at": made + _DAY,
            "finalizing_at": ended if batch.end in ("completed", "expired") else None,
            "completed_at": ended if batch.end == "completed" else None,
            "failed_at": ended if batch.end == "failed" else None,
            "expired_at": ended if batch.end == "expired" else None,
            "cancelling_at": int(batch.cancel_at) if batch.cancel_at is not None else None,
            "cancelled_at": ended if batch.end == "cancelled" else None,
            "request_counts": {"total": len(batch.lines),
                               "completed": batch.count("succeeded") if done else 0,
                               "failed": batch.count("errored") if done else 0},
            "usage": usage,
            "metadata": info["metadata"],
        }

    def _write_files(self, batch: Batch) -> None:
        """At the end: the output file (answered lines) and the error file (errored and unfinished lines)."""
        out: list[dict[str, Any]] = []
        err: list[dict[str, Any]] = []
        for line in batch.lines:
            item: dict[str, Any] = {"id": new_id("batch_req_"), "custom_id": line.custom_id}
            if line.outcome == "succeeded":
                out.append({**item, "response": {"status_code": 200, "request_id": new_id("req_"),
                                                 "body": line.answer}, "error": None})
            elif line.outcome == "errored" and line.error is not None:
                e = line.error
                kind = "server_error" if e.status >= 500 else "invalid_request_error"
                body = {"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code}}
                err.append({**item, "response": {"status_code": e.status, "request_id": new_id("req_"),
                                                 "body": body}, "error": None})
            else:
                err.append({**item, "response": None,
                            "error": _EXPIRED if line.outcome == "expired" else _CANCELLED})
        if out:
            name = f"batch_{batch.id}_output.jsonl"
            batch.info["output_file_id"] = self.store.add_file(name, "batch_output", _jsonl(out)).id
        if err:
            name = f"batch_{batch.id}_error.jsonl"
            batch.info["error_file_id"] = self.store.add_file(name, "batch_output", _jsonl(err)).id
