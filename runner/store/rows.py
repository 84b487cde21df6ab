"""The rows the engine writes, as typed records: a finished task, a memo entry and a ledger charge. Their fields,
in order, are the store's columns (``TASK_COLUMNS`` and the others in runner/store/base.py are these fields). Each
is a ``NamedTuple``, so a row is itself the parameter tuple the store binds: nothing is copied between the record
and the SQL (measured against slotted dataclasses turned into tuples: bench/RESULTS.md, issue 22)."""

from __future__ import annotations

from typing import NamedTuple


class TaskRow(NamedTuple):
    run_id: str
    stage: str
    item: str
    model: str
    row_id: str
    variant_json: str
    key: str
    #: "done" or "failed"
    status: str
    #: 1 or 0 (an integer column on both databases: PostgreSQL refuses a boolean for it)
    cache_hit: int
    attempts: int
    error_class: str | None
    error: str | None
    input_tokens: int
    output_tokens: int
    cost: float
    latency: float | None
    score: float | None
    #: 1 or 0, as cache_hit
    valid: int
    result_json: str
    cached_tokens: int
    #: what a cache hit would have cost
    saved: float
    #: what the Batch API's price saved (None: not sent through a batch)
    batch_saved: float | None
    #: what the provider's prompt cache saved against the same input uncached (less its write premium: negative for
    #: a request that only wrote); 0 for a request that neither read nor wrote it
    cache_saved: float = 0.0


class ResponseRow(NamedTuple):
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
    #: the model the provider said answered, and what sent the request (SDK and version, or the lean wire)
    reported_model: str | None = None
    sent_with: str | None = None


class LedgerRow(NamedTuple):
    """A ledger entry (a charge: what an answer or a billed refusal cost, in USD and in tokens)."""

    run_id: str
    stage: str
    model: str
    key: str
    kind: str
    amount: float
    created: str
    #: input + output tokens billed (what a token budget counts; 0 for a charge that is no request's)
    tokens: int = 0
    #: the service tier the answer was served and charged at (standard, flex, priority: runner/engine/tiers.py);
    #: None when its stage asked none and the answer named none
    tier: str | None = None
    #: the endpoint of a pooled model that answered and charged it (its label in ``pools:``); None outside pools
    endpoint: str | None = None
