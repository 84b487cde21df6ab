"""OpenAI's Batch API (Files + ``/v1/batches``) through the official SDK, for ``openai:`` and ``sim:``.

Submit: one JSONL input file, a line ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``
per request, whose body is the one the online path sends (``OpenAIChatProvider.request_body``: same model id,
messages, temperature, ``max_completion_tokens`` or ``max_tokens``, top_p, stop, seed, logprobs...), uploaded
with ``purpose="batch"``; then a batch over it with ``completion_window="24h"`` and ``metadata={"runner":
label}``. The input file is kept: it is how a later process learns which custom ids a batch holds.

Results: the output file's lines (``response.status_code`` 200) become completions exactly as online
(``OpenAIChatProvider.completion_of`` on ``response.body``); the error file's lines are errors: with a
``response`` they are the online mapping of that status and body (a 500 is a ``TransientError``, a 400 a
``BadRequest``), without one they are ``batch_expired`` / ``batch_cancelled`` (retry). A line in neither file
expired. A batch that ended ``failed`` refused its input file: every line is a ``BadRequest``, not retried.
OpenAI-compatible servers (vLLM, llama.cpp) have no Batch API in general, so ``openai-compatible`` has none.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from runner.errors import BadRequest, TransientError

from ._batch_common import (
    CANCELLED,
    EXPIRED,
    SDKBatches,
    answered,
    check_lines,
    failed,
    malformed,
    mapped,
    not_ended,
    safe_label,
    stainless_error,
    unfinished,
)
from .batching import ENDED, RUNNING, BatchLine, BatchResult, BatchStatus

if TYPE_CHECKING:
    from .openai_chat import OpenAIChatProvider

ENDPOINT = "/v1/chat/completions"
#: OpenAI's batch statuses that are final (validating, in_progress, finalizing and cancelling are not)
_ENDED = frozenset({"completed", "expired", "cancelled", "failed"})
#: the longest metadata value OpenAI takes
_METADATA_VALUE = 512


def _jsonl(text: str) -> list[dict[str, Any]]:
    items = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(item, dict) for item in items):
        raise TypeError("a line is not a JSON object")
    return items


class OpenAIBatches(SDKBatches):
    """The Batch API of an :class:`~runner.providers.openai_chat.OpenAIChatProvider` (or ``SimProvider``)."""

    provider: OpenAIChatProvider

    def __init__(self, provider: OpenAIChatProvider) -> None:
        super().__init__(provider)

    def input_file(self, model: str, lines: list[BatchLine]) -> bytes:
        """The JSONL input file: each line's body exactly as the online request's."""
        body = self.provider.request_body
        return "".join(json.dumps({"custom_id": line.custom_id, "method": "POST", "url": ENDPOINT,
                                   "body": body(model, line.messages, line.params)},
                                  ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines).encode()

    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        check_lines(self.where, lines)
        data = self.input_file(model, lines)
        metadata = {"runner": safe_label(label, self.provider, _METADATA_VALUE)}
        with self.errors():
            upload = await self.client.files.create(file=("batch-input.jsonl", data), purpose="batch")
            batch = await self.client.batches.create(input_file_id=upload.id, endpoint=ENDPOINT,
                                                     completion_window="24h", metadata=metadata)
        return str(batch.id)

    async def status(self, batch_id: str) -> BatchStatus:
        with self.errors():
            batch = await self.client.batches.retrieve(batch_id)
        return self._status(batch)

    @staticmethod
    def _status(batch: Any) -> BatchStatus:
        counts = batch.request_counts
        return BatchStatus(ENDED if batch.status in _ENDED else RUNNING, str(batch.status),
                           total=counts.total if counts else 0, succeeded=counts.completed if counts else 0,
                           failed=counts.failed if counts else 0)

    async def _download(self, file_id: str | None) -> list[dict[str, Any]]:
        if not file_id:
            return []
        with self.errors():
            content = await self.client.files.content(file_id)
        with malformed(self.where):
            return _jsonl(content.text)

    async def _custom_ids(self, file_id: str) -> list[str]:
        """The custom ids of the batch's input file, in order (lines that cannot be read are skipped: a batch
        with such lines failed, and its readable lines are what can be reported)."""
        with self.errors():
            content = await self.client.files.content(file_id)
        ids: dict[str, None] = {}  # ordered, without repeats
        for raw in content.text.splitlines():
            try:
                custom_id = json.loads(raw).get("custom_id")
            except (ValueError, AttributeError):
                continue
            if isinstance(custom_id, str):
                ids[custom_id] = None
        return list(ids)

    async def results(self, batch_id: str) -> list[BatchResult]:
        with self.errors():
            batch = await self.client.batches.retrieve(batch_id)
        if batch.status not in _ENDED:
            raise not_ended(self.where, batch_id, str(batch.status))
        submitted = await self._custom_ids(batch.input_file_id)
        if batch.status == "failed":
            return self._refused(batch, submitted)
        found: dict[str, BatchResult] = {}
        for item in [*await self._download(batch.output_file_id), *await self._download(batch.error_file_id)]:
            if isinstance(item.get("custom_id"), str):
                found[item["custom_id"]] = self._line(item)
        missing = CANCELLED if batch.status == "cancelled" else EXPIRED
        results = [found.pop(cid, None) or unfinished(cid, self.where, missing) for cid in submitted]
        return results + list(found.values())

    def _refused(self, batch: Any, submitted: list[str]) -> list[BatchResult]:
        """Every line of a batch whose input file was refused: the file's fault, so no line is retried."""
        problems = list(getattr(batch.errors, "data", None) or [])
        codes = sorted({str(problem.code) for problem in problems if getattr(problem, "code", None)})
        reason = ", ".join(codes) or "no reason given"
        return [BatchResult(cid, error=BadRequest(f"{self.where}: batch {batch.id} failed: its input file was "
                                                  f"refused ({reason})"), retry=False) for cid in submitted]

    def _line(self, item: dict[str, Any]) -> BatchResult:
        """One line of the output or the error file."""
        custom_id, response, error = item["custom_id"], item.get("response"), item.get("error")
        status = response.get("status_code") if isinstance(response, dict) else None
        if status == 200:
            return answered(custom_id, lambda: self.provider.completion_of(response.get("body")), item)
        if isinstance(status, int):
            sdk_error = stainless_error(self.client, status, response.get("body"), ENDPOINT.removeprefix("/v1"))
            return failed(custom_id, mapped(self.provider, sdk_error), item)
        code = error.get("code") if isinstance(error, dict) else None
        if code in (EXPIRED, CANCELLED):
            return unfinished(custom_id, self.where, code, item)
        return failed(custom_id, TransientError(f"{self.where}: the batch line failed ({code or 'no reason given'})",
                                                error_class="batch_error"), item)

    async def _cancel(self, batch_id: str) -> None:
        with self.errors():
            await self.client.batches.cancel(batch_id)
