"""OpenAI's Batch API (Files + ``/v1/batches``) through the official SDK, for ``openai:`` and ``sim:``.

Submit: one JSONL input file, a line ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``
per request, whose body is the one the online path sends (``OpenAIChatProvider.request_body``: same model id,
messages, temperature, ``max_completion_tokens`` or ``max_tokens``, top_p, stop, seed, logprobs...), uploaded
with ``purpose="batch"``; then a batch over it with ``completion_window="24h"`` and ``metadata={"runner":
label}``. The input file is kept: it is how a later process learns which custom ids a batch holds.

Find (a batch the provider accepted but the store never recorded): ``batches.list`` pages through the
organization's batches, newest first (``limit`` 100, ``after`` the last id), back to the intent's time; the batch
is the one whose ``metadata["runner"]`` is its label (:func:`~runner.providers.batching.batch_label`, which ends
in a digest of the run, stage, model, round and custom ids). The list has no filter by metadata, so it is read
page by page until a page's worth of batches in a row is older than the intent.

Results: the output file's lines (``response.status_code`` 200) become completions exactly as online
(``OpenAIChatProvider.completion_of`` on ``response.body``); the error file's lines are errors: with a
``response`` they are the online mapping of that status and body (a 500 is a ``TransientError``, a 400 a
``BadRequest``), their message the provider's own (``400 invalid_request_error (param stop): ...``); without
one they are ``batch_expired`` / ``batch_cancelled`` (retry). A line in neither file expired. A batch that
ended ``failed`` refused its input file (OpenAI validates it first, naming the bad lines in ``errors.data``):
the lines named fail with their error, not retried; the others come back ``batch_refused``, to be submitted
again in a batch without the bad lines (once: see :mod:`runner.engine.batch`).
OpenAI-compatible servers (vLLM, llama.cpp) have no Batch API in general, so ``openai-compatible`` has none.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import BadRequest, TransientError

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
    status_error,
    unfinished,
)
from .batching import (
    CANCELLED,
    CLOCK_SKEW,
    ENDED,
    EXPIRED,
    REFUSED,
    RUNNING,
    BatchLine,
    BatchResult,
    BatchStatus,
    Lookup,
)
from .wire import words

if TYPE_CHECKING:
    from .openai_chat import OpenAIChatProvider

ENDPOINT = "/v1/chat/completions"
#: OpenAI's batch statuses that are final (validating, in_progress, finalizing and cancelling are not)
_ENDED = frozenset({"completed", "expired", "cancelled", "failed"})
#: the longest metadata value OpenAI takes
_METADATA_VALUE = 512
#: batches a list page holds (OpenAI's most); ``find`` stops after this many older than its batch in a row
PAGE = 100


def _jsonl(text: str) -> list[dict[str, Any]]:
    items = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(item, dict) for item in items):
        raise TypeError("a line is not a JSON object")
    return items


class OpenAIBatches(SDKBatches):
    """The Batch API of an :class:`~runner.providers.openai_chat.OpenAIChatProvider` (or ``SimProvider``)."""

    provider: OpenAIChatProvider
    #: the batch's endpoint and every line's ``url`` (Azure's differ: runner/providers/azure_batch.py)
    endpoint: ClassVar[str] = ENDPOINT

    def __init__(self, provider: OpenAIChatProvider) -> None:
        super().__init__(provider)

    def input_file(self, model: str, lines: list[BatchLine]) -> bytes:
        """The JSONL input file: each line's body exactly as the online request's."""
        body = self.provider.request_body
        return "".join(json.dumps({"custom_id": line.custom_id, "method": "POST", "url": self.endpoint,
                                   "body": body(model, line.messages, line.params)},
                                  ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines).encode()

    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        check_lines(self.where, lines)
        data = self.input_file(model, lines)
        metadata = {"runner": safe_label(label, self.provider, _METADATA_VALUE)}
        with self.errors():
            upload = await self.client.files.create(file=("batch-input.jsonl", data), purpose="batch")
            batch = await self.client.batches.create(input_file_id=upload.id, endpoint=self.endpoint,
                                                     completion_window="24h", metadata=metadata)
        return str(batch.id)

    async def find(self, label: str, custom_ids: Collection[str], *, since: float,
                   known: Collection[str] = ()) -> Lookup:
        wanted = safe_label(label, self.provider, _METADATA_VALUE)
        older = 0
        with self.errors():
            async for batch in self.client.batches.list(limit=PAGE):
                if batch.created_at < since - CLOCK_SKEW:
                    older += 1
                    if older >= PAGE:
                        break
                    continue
                older = 0
                if batch.id not in known and (batch.metadata or {}).get("runner") == wanted:
                    return Lookup(str(batch.id))
        return Lookup()

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

    async def _custom_ids(self, file_id: str) -> dict[int, str]:
        """The custom ids of the batch's input file by line number (from 1, as OpenAI counts the lines its
        validation errors name), in order and each once; lines that cannot be read are skipped (a batch with such
        lines failed, and its readable lines are what can be reported)."""
        with self.errors():
            content = await self.client.files.content(file_id)
        ids: dict[int, str] = {}
        seen: set[str] = set()
        for number, raw in enumerate(content.text.splitlines(), 1):
            try:
                custom_id = json.loads(raw).get("custom_id")
            except (ValueError, AttributeError):
                continue
            if isinstance(custom_id, str) and custom_id not in seen:
                ids[number] = custom_id
                seen.add(custom_id)
        return ids

    async def results(self, batch_id: str) -> list[BatchResult]:
        with self.errors():
            batch = await self.client.batches.retrieve(batch_id)
        if batch.status not in _ENDED:
            raise not_ended(self.where, batch_id, str(batch.status))
        by_line = await self._custom_ids(batch.input_file_id)
        submitted = list(by_line.values())
        if batch.status == "failed":
            return self._refused(batch, by_line)
        found: dict[str, BatchResult] = {}
        for item in [*await self._download(batch.output_file_id), *await self._download(batch.error_file_id)]:
            if isinstance(item.get("custom_id"), str):
                found[item["custom_id"]] = self._line(item)
        missing = CANCELLED if batch.status == "cancelled" else EXPIRED
        results = [found.pop(cid, None) or unfinished(cid, self.where, missing) for cid in submitted]
        return results + list(found.values())

    def _refused(self, batch: Any, by_line: dict[int, str]) -> list[BatchResult]:
        """The lines of a batch whose input file OpenAI's validation refused (``status: "failed"``, ``errors.data``
        a list of ``{code, message, param, line}``). A line an error names fails with that error, not retried.
        The others were refused only for those lines: they come back as ``batch_refused``, to be submitted again
        (the engine does so once). An error naming no line (or a line that is not one of ours) is about the whole
        file: every line fails with it."""
        problems = list(getattr(batch.errors, "data", None) or [])
        prefix = f"{self.where}: batch {batch.id} refused its input file"
        named: dict[str, BadRequest] = {}
        whole: list[str] = []
        for problem in problems:
            line = getattr(problem, "line", None)
            said = words(None, getattr(problem, "code", None), None, getattr(problem, "param", None),
                         getattr(problem, "message", None))
            if isinstance(line, int) and line in by_line:
                named.setdefault(by_line[line], BadRequest(f"{prefix} at line {line}: {said}", status=400))
            else:
                whole.append(said)
        results: list[BatchResult] = []
        for cid in by_line.values():
            if whole or not named:
                error = BadRequest(f"{prefix}: {'; '.join(whole) or 'no reason given'}", status=400)
                results.append(BatchResult(cid, error=error, retry=False))
            elif cid in named:
                results.append(BatchResult(cid, error=named[cid], retry=False))
            else:
                lines = ", ".join(str(n) for n, other in by_line.items() if other in named)
                error = BadRequest(f"{prefix} for other lines ({lines}); this line was not run", status=400,
                                   error_class=REFUSED)
                results.append(BatchResult(cid, error=error, retry=True))
        return results

    def _line(self, item: dict[str, Any]) -> BatchResult:
        """One line of the output or the error file."""
        import openai

        custom_id, response, error = item["custom_id"], item.get("response"), item.get("error")
        status = response.get("status_code") if isinstance(response, dict) else None
        if status == 200:
            return answered(custom_id, lambda: self.provider.completion_of(response.get("body")), item)
        if isinstance(status, int):
            body = response.get("body")
            sdk_error = status_error(openai, self.client, status, body, ENDPOINT.removeprefix("/v1"),
                                     error_object=True)
            said = body.get("error") if isinstance(body, dict) else None
            said = said if isinstance(said, dict) else {}
            return failed(custom_id, described(mapped(self.provider, sdk_error), self.where, status, said.get("type"),
                                               said.get("code"), said.get("param"), said.get("message")), item)
        error = error if isinstance(error, dict) else {}
        code = error.get("code")
        if code in (EXPIRED, CANCELLED):
            return unfinished(custom_id, self.where, code, item)
        lost = TransientError(f"{self.where}: the batch line failed ({code or 'no reason given'})",
                              error_class="batch_error")
        return failed(custom_id, described(lost, self.where, code=code, param=error.get("param"),
                                           message=error.get("message")), item)

    async def _cancel(self, batch_id: str) -> None:
        with self.errors():
            await self.client.batches.cancel(batch_id)
