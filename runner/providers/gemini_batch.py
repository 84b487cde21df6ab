"""Gemini batch mode through ``google-genai`` (``client.aio.batches``), with inlined requests.

Submit: one ``InlinedRequest`` per line, its contents and config exactly as the online path builds them
(``GeminiProvider.request_of``: system instruction, generation config), and its custom id in the request's
``metadata`` as ``{"key": custom_id}``, which the SDK sends and Gemini hands back with each response; the
batch's ``display_name`` is the label. Inline requests must stay under 20 MB a batch: the engine asks
:meth:`GeminiBatches.chunks` how to cut its lines, by their JSON size. The batch id is the job's name,
``batches/...``. Batch mode is served under ``v1beta`` only, while google-genai 3.x talks ``v1`` by default:
every batch call here asks for ``v1beta`` in its own ``http_options`` (the client's timeout and retry settings
stay as they are).

Results: ``dest.inlined_responses``, one per request in request order. The custom id is the response's
``metadata["key"]``; should a response come back without it (users have reported Gemini not echoing
metadata), the line is named by its position, as a string ("0", "1", ...: the engine's lines not among the
results are then reported missing by it). A job that failed as a whole with no responses raises its error. A
``response`` is a completion built as online (``GeminiProvider.completion_of``); an ``error`` is a
``google.rpc`` code: 4 DEADLINE_EXCEEDED (expired) and 1 CANCELLED are retried as not run, the others go
through the online mapping of their HTTP equivalent (13 INTERNAL -> 500, retried; 3 INVALID_ARGUMENT -> 400,
not). This SDK reads no request counts for Gemini batches: ``status`` counts the responses once it ended.

Find (a batch the provider accepted but the store never recorded): ``batches.list`` (``pageSize`` 100,
``pageToken``) and the job whose ``display_name`` is the batch's label (which ends in a digest of the run, stage,
model, round and custom ids) and that was created no earlier than the intent. The Gemini Developer API takes no
list filter (google-genai refuses ``filter`` outside Vertex) and documents no order, so every page is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from runner.errors import BadRequest, ProviderError

from ._batch_common import (
    SDKBatches,
    answered,
    check_lines,
    described,
    failed,
    malformed,
    mapped,
    not_ended,
    safe_label,
    unfinished,
)
from .batching import CANCELLED, CLOCK_SKEW, ENDED, EXPIRED, RUNNING, BatchLine, BatchResult, BatchStatus, Lookup

if TYPE_CHECKING:
    from .gemini import GeminiProvider

#: job states that are final (queued, pending, running, cancelling, paused, updating are not)
_ENDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
                    "JOB_STATE_PARTIALLY_SUCCEEDED"})
#: google.rpc.Code -> (HTTP status, status name), as Google APIs map them
_RPC = {2: (500, "UNKNOWN"), 3: (400, "INVALID_ARGUMENT"), 5: (404, "NOT_FOUND"), 6: (409, "ALREADY_EXISTS"),
        7: (403, "PERMISSION_DENIED"), 8: (429, "RESOURCE_EXHAUSTED"), 9: (400, "FAILED_PRECONDITION"),
        10: (409, "ABORTED"), 11: (400, "OUT_OF_RANGE"), 12: (501, "UNIMPLEMENTED"), 13: (500, "INTERNAL"),
        14: (503, "UNAVAILABLE"), 15: (500, "DATA_LOSS"), 16: (401, "UNAUTHENTICATED")}
_DISPLAY_NAME = 128
#: jobs a list page holds in ``find``
PAGE = 100
#: a generateContent validation message naming its field: "* GenerateContentRequest.contents[0].role: ..."
_FIELD = re.compile(r"\s*\*\s*GenerateContentRequest\.([\w.\[\]]+):")
#: Gemini takes inline requests while a batch's total request size stays under 20 MB; a larger one must go
#: through the File API (ai.google.dev/gemini-api/docs/batch-mode, "Inline requests"); above it
#: batchGenerateContent answers 400 INVALID_ARGUMENT "Request payload size exceeds the limit: 20971520 bytes."
INLINE_LIMIT = 20 * 1024 * 1024
#: what one inline batch may hold, by the JSON bytes of its requests: the limit less a tenth, for the envelope
#: around them and the difference between this measure and the SDK's own encoding of the body
INLINE_BUDGET = INLINE_LIMIT * 9 // 10
#: the API version that serves batch mode, as a call's config
_API_VERSION = "v1beta"
_V1BETA: dict[str, Any] = {"http_options": {"api_version": _API_VERSION}}


def _field(message: str, details: list[Any]) -> str | None:
    """The parameter a ``google.rpc.Status`` names: the first field violation of a ``google.rpc.BadRequest`` in
    its details (``{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field"}]}``),
    else the field its message starts with (``* GenerateContentRequest.generation_config.max_output_tokens: ...``)."""
    for detail in details:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.BadRequest"):
            for violation in detail.get("fieldViolations") or detail.get("field_violations") or []:
                if isinstance(violation, dict) and violation.get("field"):
                    return str(violation["field"])
    found = _FIELD.match(message)
    return found.group(1) if found is not None else None


def inline_size(request: Any) -> int:
    """The bytes of JSON an ``InlinedRequest`` takes in a batch's body (as the SDK encodes a body: ``json.dumps``,
    ASCII only), by its wire names."""
    return len(json.dumps(request.model_dump(mode="json", exclude_none=True, by_alias=True)).encode())


def _state(job: Any) -> str:
    return str(getattr(job.state, "value", job.state))


class GeminiBatches(SDKBatches):
    """The batch mode of a :class:`~runner.providers.gemini.GeminiProvider`."""

    provider: GeminiProvider

    def __init__(self, provider: GeminiProvider) -> None:
        super().__init__(provider)

    def requests(self, model: str, lines: list[BatchLine]) -> list[Any]:
        """The lines as inline requests, each built as the online request for ``model`` is."""
        from google.genai import types

        requests = []
        for line in lines:
            contents, config = self.provider.request_of(line.messages, line.params, model)
            requests.append(types.InlinedRequest(contents=contents, config=config, metadata={"key": line.custom_id}))
        return requests

    def chunks(self, model: str, lines: list[BatchLine]) -> list[list[BatchLine]]:
        """``lines`` in order, cut into batches whose inline requests stay within :data:`INLINE_BUDGET` bytes of
        JSON (a single line larger than that goes alone, for Gemini to refuse with its own error)."""
        parts: list[list[BatchLine]] = []
        part: list[BatchLine] = []
        size = 0
        for line, request in zip(lines, self.requests(model, lines), strict=True):
            n = inline_size(request)
            if part and size + n > INLINE_BUDGET:
                parts.append(part)
                part, size = [], 0
            part.append(line)
            size += n
        if part:
            parts.append(part)
        return parts

    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        from google.genai import types

        check_lines(self.where, lines)
        config = types.CreateBatchJobConfig(display_name=safe_label(label, self.provider, _DISPLAY_NAME),
                                            http_options=types.HttpOptions(api_version=_API_VERSION))
        try:
            with self.errors():
                job = await self.client.aio.batches.create(model=model, src=self.requests(model, lines),
                                                           config=config)
        except BadRequest as exc:  # why Gemini refused the batch (its size, a field) is worth keeping
            cause = exc.__cause__
            raise described(exc, self.where, getattr(cause, "code", None), getattr(cause, "status", None),
                            message=getattr(cause, "message", None)) from cause
        return str(job.name)

    async def find(self, label: str, custom_ids: Collection[str], *, since: float,
                   known: Collection[str] = ()) -> Lookup:
        wanted = safe_label(label, self.provider, _DISPLAY_NAME)
        config = {"page_size": PAGE, "http_options": {"api_version": _API_VERSION}}
        with self.errors():
            async for job in await self.client.aio.batches.list(config=config):
                created = job.create_time.timestamp() if job.create_time is not None else since
                if job.display_name == wanted and created >= since - CLOCK_SKEW and job.name not in known:
                    return Lookup(str(job.name))
        return Lookup()

    async def _get(self, batch_id: str) -> Any:
        with self.errors():
            return await self.client.aio.batches.get(name=batch_id, config=_V1BETA)

    async def status(self, batch_id: str) -> BatchStatus:
        job = await self._get(batch_id)
        state = _state(job)
        entries = (job.dest.inlined_responses if job.dest else None) or []
        answered_lines = sum(1 for entry in entries if entry.response is not None)
        return BatchStatus(ENDED if state in _ENDED else RUNNING, state, total=len(entries), succeeded=answered_lines,
                           failed=len(entries) - answered_lines)

    async def results(self, batch_id: str) -> list[BatchResult]:
        job = await self._get(batch_id)
        state = _state(job)
        if state not in _ENDED:
            raise not_ended(self.where, batch_id, state)
        entries = (job.dest.inlined_responses if job.dest else None) or []
        if not entries and job.error is not None:
            raise self._error(job.error)  # the job failed as a whole: no line was run
        with malformed(self.where):
            return [self._line(entry, str(i)) for i, entry in enumerate(entries)]

    def _line(self, entry: Any, by_position: str) -> BatchResult:
        key = (entry.metadata or {}).get("key")
        custom_id = key if isinstance(key, str) and key else by_position
        raw = entry.model_dump(mode="json", exclude_none=True, exclude={"response": {"sdk_http_response"}})
        if entry.response is not None:
            return answered(custom_id, lambda: self.provider.completion_of(entry.response), raw)
        code = getattr(entry.error, "code", None)
        if code in (4, 1):  # DEADLINE_EXCEEDED: the batch expired first; CANCELLED
            return unfinished(custom_id, self.where, EXPIRED if code == 4 else CANCELLED, raw)
        return failed(custom_id, self._error(entry.error), raw)

    def _error(self, error: Any) -> ProviderError:
        """A line's (or the job's) ``google.rpc.Status`` as the online path maps its HTTP equivalent."""
        from google.genai import errors

        code = getattr(error, "code", None)
        status, name = _RPC.get(code if isinstance(code, int) else 2, (500, "UNKNOWN"))
        message = str(getattr(error, "message", "") or "")
        details = list(getattr(error, "details", None) or [])
        body = {"error": {"code": status, "message": message, "status": name, "details": details}}
        sdk_error = errors.ClientError(status, body) if status < 500 else errors.ServerError(status, body)
        return described(mapped(self.provider, sdk_error), self.where, status, name, param=_field(message, details),
                         message=message)

    async def _cancel(self, batch_id: str) -> None:
        with self.errors():
            await self.client.aio.batches.cancel(name=batch_id, config=_V1BETA)
