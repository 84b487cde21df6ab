"""Anthropic's Message Batches API through the official SDK (``client.messages.batches``).

Submit: ``{"custom_id", "params"}`` per line, the params exactly as the online path builds them
(``AnthropicProvider.request_of`` for the same model, so thinking takes the model's form: system prompt beside
the conversation, ``max_tokens`` or the default cap, ``stop_sequences``, and temperature / top_p as body
fields); the client is the online path's, so the pinned ``anthropic-version`` header goes with every call.
Custom ids must match ``^[a-zA-Z0-9_-]{1,64}$`` (Anthropic refuses the whole batch otherwise, so they are
checked before anything is sent). A Message Batch has no name or metadata, so the label goes into every custom id
instead (:func:`wire_id`): 16 hex digits of the label's hash (the label names the run, stage, model, round and
every line), then the engine's id, a 64-hex request key written in 43 base64url characters. Two runs sending the
same requests send the same keys, and only this prefix tells their batches apart. :func:`engine_id` reads the
engine's id back from a result (and takes an id without the prefix, from a batch submitted before ids had it, as
it is).

Find (a batch the provider accepted but the store never recorded): with no label to look for, a batch is known by
its requests' custom ids (each holding the label's hash), which the API gives back only in an ended batch's
results. ``messages.batches.list`` pages through the workspace's batches, most recent first (``limit`` 100,
``after_id``), back to the intent's time; a candidate was created within :data:`SUBMIT_WINDOW` of the intent, is
not one the store knows, and holds as many requests (``request_counts``) as the batch had lines. An ended
candidate is the batch when its results carry exactly the custom ids its label and lines make; a candidate still
running leaves the answer ``undecided`` (the engine looks again at its next poll), so a batch that was never
accepted is submitted again only once no running candidate may be it.

Results: every request has a result, matched by custom id. ``succeeded`` is a completion built as online from
the Message (``AnthropicProvider.completion_of``); ``errored`` is the online mapping of the error's type
(``api_error`` 500 and ``overloaded_error`` 529 are transient and retried, ``invalid_request_error`` is a bad
request), its message the provider's (``400 invalid_request_error: ...``); ``canceled`` and ``expired`` lines
are retried.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from runner.errors import BadRequest

from ._batch_common import (
    SDKBatches,
    answered,
    check_lines,
    described,
    failed,
    malformed,
    mapped,
    not_ended,
    status_error,
    unfinished,
)
from .batching import CANCELLED, CLOCK_SKEW, ENDED, EXPIRED, RUNNING, BatchLine, BatchResult, BatchStatus, Lookup

if TYPE_CHECKING:
    from .anthropic_messages import AnthropicProvider

_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_KEY = re.compile(r"[0-9a-f]{64}")
#: hex digits of the label's hash that begin every custom id, then one character saying how the engine's id follows:
#: ``_`` a request key in base64url, ``-`` the id as it is (one of at most :data:`MAX_PLAIN` characters)
TAG = 16
MAX_PLAIN = 64 - TAG - 1
#: batches a list page holds in ``find``
PAGE = 100
#: seconds after its intent a batch can have been created: the submit call started then and ends within its timeout
SUBMIT_WINDOW = 3600.0
#: an errored result's error type -> the HTTP status the Messages API answers it with online
_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
           "permission_error": 403, "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
           "api_error": 500, "timeout_error": 504, "overloaded_error": 529}


class AnthropicBatches(SDKBatches):
    """The Message Batches API of an :class:`~runner.providers.anthropic_messages.AnthropicProvider`."""

    provider: AnthropicProvider

    def __init__(self, provider: AnthropicProvider) -> None:
        super().__init__(provider)

    def params(self, model: str, line: BatchLine) -> dict[str, Any]:
        """A request's params: what ``messages.create`` sends online, sampling fields included."""
        kwargs, sampling = self.provider.request_of(line.messages, line.params, model)
        return {"model": model, **kwargs, **sampling}

    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        check_lines(self.where, lines)
        bad = next((line.custom_id for line in lines if not _KEY.fullmatch(line.custom_id)
                    and not (len(line.custom_id) <= MAX_PLAIN and _CUSTOM_ID.fullmatch(line.custom_id))), None)
        if bad is not None:
            raise BadRequest(f"{self.where}: custom id {bad!r} must be a request key or 1 to {MAX_PLAIN} letters, "
                             "digits, '-' or '_' (Message Batches refuse a custom id of more than 64 of them, and "
                             f"the batch's label takes {TAG + 1})")
        requests = [{"custom_id": wire_id(label, line.custom_id), "params": self.params(model, line)}
                    for line in lines]
        with self.errors():
            batch = await self.client.messages.batches.create(requests=requests)
        return str(batch.id)

    async def find(self, label: str, custom_ids: Collection[str], *, since: float,
                   known: Collection[str] = ()) -> Lookup:
        wanted = {wire_id(label, custom_id) for custom_id in custom_ids}
        undecided = 0
        with self.errors():
            async for batch in self.client.messages.batches.list(limit=PAGE):
                created = batch.created_at.timestamp()
                if created < since - CLOCK_SKEW:
                    break  # most recent first: the rest are older still
                counts = batch.request_counts
                total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
                if batch.id in known or total != len(wanted) or created > since + SUBMIT_WINDOW + CLOCK_SKEW:
                    continue
                if batch.processing_status != "ended":
                    undecided += 1
                    continue
                found = {str(item.custom_id) async for item in await self.client.messages.batches.results(batch.id)}
                if found == wanted:
                    return Lookup(str(batch.id))
        return Lookup(undecided=undecided)

    async def status(self, batch_id: str) -> BatchStatus:
        with self.errors():
            batch = await self.client.messages.batches.retrieve(batch_id)
        counts = batch.request_counts
        unanswered = counts.errored + counts.canceled + counts.expired
        state = ENDED if batch.processing_status == "ended" else RUNNING  # in_progress, canceling
        return BatchStatus(state, str(batch.processing_status), total=counts.processing + counts.succeeded
                           + unanswered, succeeded=counts.succeeded, failed=unanswered)

    async def results(self, batch_id: str) -> list[BatchResult]:
        with self.errors():
            batch = await self.client.messages.batches.retrieve(batch_id)
            if batch.processing_status != "ended":
                raise not_ended(self.where, batch_id, str(batch.processing_status))
            items = [item async for item in await self.client.messages.batches.results(batch_id)]
        with malformed(self.where):
            return [self._line(item) for item in items]

    def _line(self, item: Any) -> BatchResult:
        import anthropic

        custom_id, result = engine_id(str(item.custom_id)), item.result
        raw = item.to_dict(mode="json")
        if result.type == "succeeded":
            return answered(custom_id, lambda: self.provider.completion_of(result.message.to_dict(mode="json")), raw)
        if result.type == "errored":
            body = result.error.to_dict(mode="json")  # {"type": "error", "error": {"type", "message"}}
            words = body.get("error") if isinstance(body.get("error"), dict) else {}
            kind = words.get("type")
            status = _STATUS.get(str(kind), 500)  # a type this table does not know yet: a server error
            sdk_error = status_error(anthropic, self.client, status, body, "/v1/messages")
            return failed(custom_id, described(mapped(self.provider, sdk_error), self.where, status, kind,
                                               message=words.get("message")), raw)
        return unfinished(custom_id, self.where, CANCELLED if result.type == "canceled" else EXPIRED, raw)

    async def _cancel(self, batch_id: str) -> None:
        with self.errors():
            await self.client.messages.batches.cancel(batch_id)


def wire_id(label: str, custom_id: str) -> str:
    """The custom id a line is sent with: the label's hash, then the engine's ``custom_id`` (a request key
    compacted to fit Anthropic's 64 characters)."""
    tag = hashlib.sha256(label.encode("utf-8")).hexdigest()[:TAG]
    if _KEY.fullmatch(custom_id):
        return f"{tag}_{base64.urlsafe_b64encode(bytes.fromhex(custom_id)).decode('ascii').rstrip('=')}"
    return f"{tag}-{custom_id}"


def engine_id(sent: str) -> str:
    """The engine's id of a line sent as ``sent`` (:func:`wire_id`); an id without a label's hash as it is."""
    tag, kind, rest = sent[:TAG], sent[TAG:TAG + 1], sent[TAG + 1:]
    if len(tag) < TAG or any(c not in "0123456789abcdef" for c in tag):
        return sent
    if kind == "-" and rest:
        return rest
    if kind == "_" and len(rest) == 43:
        return base64.urlsafe_b64decode(rest + "=").hex()
    return sent
