"""The rows the engine writes, as typed records: a finished task, a memo entry and a ledger charge. Their fields are
the store's columns (``TASK_COLUMNS``, ``RESPONSE_COLUMNS`` and ``LEDGER_COLUMNS`` of runner/store/base.py), in
order; :meth:`params` of each is the one place a row becomes the parameter tuple the store takes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TaskRow:
    run_id: str
    stage: str
    item: str
    model: str
    row_id: str
    variant_json: str
    key: str
    #: "done" or "failed"
    status: str
    cache_hit: bool
    attempts: int
    error_class: str | None
    error: str | None
    input_tokens: int
    output_tokens: int
    cost: float
    latency: float | None
    score: float | None
    valid: bool
    result_json: str
    cached_tokens: int
    #: what a cache hit would have cost
    saved: float
    #: what the Batch API's price saved (None: not sent through a batch)
    batch_saved: float | None

    def params(self) -> tuple:
        return (self.run_id, self.stage, self.item, self.model, self.row_id, self.variant_json, self.key, self.status,
                int(self.cache_hit), self.attempts, self.error_class, self.error, self.input_tokens,
                self.output_tokens, self.cost, self.latency, self.score, int(self.valid), self.result_json,
                self.cached_tokens, self.saved, self.batch_saved)


#: where the task's item is in :meth:`TaskRow.params` (the writer's callbacks read committed rows by it)
TASK_ITEM = 2


@dataclass(slots=True)
class ResponseRow:
    """A memo entry: the first answer to a request (by its cache key) and what it cost."""

    key: str
    provider: str
    model: str
    request_json: str
    response_text: str
    response_json: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float
    latency: float | None
    created: str
    thinking: str | None
    reasoning_tokens: int

    def params(self) -> tuple:
        return (self.key, self.provider, self.model, self.request_json, self.response_text, self.response_json,
                self.finish_reason, self.input_tokens, self.output_tokens, self.cached_tokens, self.cost,
                self.latency, self.created, self.thinking, self.reasoning_tokens)


#: where the request's cache key is in :meth:`ResponseRow.params`
RESPONSE_KEY = 0


@dataclass(slots=True)
class LedgerRow:
    """A ledger entry (a charge: what an answer or a billed refusal cost)."""

    run_id: str
    stage: str
    model: str
    key: str
    kind: str
    amount: float
    created: str

    def params(self) -> tuple:
        return (self.run_id, self.stage, self.model, self.key, self.kind, self.amount, self.created)
