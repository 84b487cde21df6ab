"""What a stage plans: provider calls (what is sent, and the memo's key) and evaluation tasks (what an answer is
scored against).

A :class:`Call` is everything that goes into a request's cache key and nothing else: provider, model id, kind,
messages (or log-likelihood pairs), the output-changing parameters and the sample index. Two tasks with equal
calls share one answer, paid once. A :class:`Task` is one row × model × variant of a stage: its identity in
the run, the options as shown (permutation), the gold, and the call that answers it.

Cache key (ARCHITECTURE.md invariant 1): the SHA-256 of the canonical JSON (sorted keys, no whitespace) of the call.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

#: generation parameters that change the output, hence belong in the cache key
FLOAT_PARAMS = ("temperature", "top_p")

#: the kinds of call: a chat completion, or the log-likelihood of continuations after contexts
CHAT = "chat"
LOGLIKELIHOOD = "loglikelihood"

canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical_params(params: dict[str, Any]) -> dict[str, Any]:
    """Drop unset parameters and write numbers one way (temperature 0 and 0.0 are the same request)."""
    out = {k: v for k, v in params.items() if v is not None}
    for name in FLOAT_PARAMS:
        if name in out:
            out[name] = float(out[name])
    return out


def canonical_request(
    provider: str, model_id: str, messages: list[dict[str, str]], params: dict[str, Any], sample: int = 0
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "provider": provider,
        "model": model_id,
        "messages": messages,
        "params": canonical_params(params),
    }
    if sample:
        body["sample"] = sample
    return body


def canonical_loglikelihood(provider: str, model_id: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """A log-likelihood call's canonical body: its kind and (context, continuation) pairs. No generation
    parameter changes a log-likelihood, so none is keyed."""
    return {"kind": LOGLIKELIHOOD, "model": model_id, "pairs": [list(pair) for pair in pairs], "provider": provider}


def cache_key(canonical: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no whitespace) of the request. ARCHITECTURE.md invariant 1."""
    return key_of(canonical_json(canonical))


def key_of(canonical_text: str) -> str:
    return hashlib.sha256(canonical_text.encode("utf-8")).hexdigest()


_quote = json.encoder.encode_basestring  # a JSON string literal, as the encoder writes it (ensure_ascii off)


def canonical_tail(provider: str, model_id: str, params: dict[str, Any], sample: int = 0) -> str:
    """Everything of a request's canonical JSON after its messages (keys sort as messages < model < params
    < provider < sample), computed once per stage and model instead of once per request."""
    tail = f',"model":{_quote(model_id)},"params":{canonical_json(canonical_params(params))}'
    tail += f',"provider":{_quote(provider)}'
    if sample:
        tail += f',"sample":{canonical_json(sample)}'
    return tail + "}"


def canonical_text(messages: list[dict[str, str]], tail: str) -> str:
    """The canonical JSON of a request, written directly: exactly ``canonical_json(canonical_request(...))``
    (a test pins this) at a fraction of the cost, since it is computed for every request of every run."""
    parts = []
    for message in messages:
        if len(message) != 2 or "role" not in message or "content" not in message:
            parts.append(canonical_json(message))
        else:
            parts.append(f'{{"content":{_quote(message["content"])},"role":{_quote(message["role"])}}}')
    return '{"messages":[' + ",".join(parts) + "]" + tail


@dataclass(slots=True)
class Call:
    """One provider call: what is sent and what keys it in the memo."""

    provider: str
    #: the model as the provider is asked for it (an alias or an endpoint label)
    model_name: str
    #: the model id that goes into the key (aliases resolved)
    model_id: str
    messages: list[dict[str, str]]
    params: dict[str, Any]
    #: the canonical JSON of the call, stored with its response; its SHA-256 is ``key``
    canonical: str
    key: str
    kind: str = CHAT
    #: a log-likelihood call's (context, continuation) pairs
    pairs: list[tuple[str, str]] | None = None
    #: input tokens, counted once when first needed (budget reservation and token buckets)
    input_tokens: int | None = None
    #: whether ``input_tokens`` is the provider's own count (its count endpoint's: runner/engine/exact_counts.py),
    #: which a budget reserves as it is, rather than an estimate beside which the byte bound is reserved
    tokens_exact: bool = False


@dataclass(slots=True)
class Task:
    """One row × model × variant of a stage, and the call that answers it."""

    stage: str
    #: the task's identity within the stage: row id, model and variant
    item: str
    row_id: str
    #: the model as the job names it (``provider:model``)
    model: str
    variant: dict[str, Any]
    variant_json: str
    call: Call
    perm: list[int] | None = None
    options: list[str] | None = None
    gold: Any = None
    #: how many options the row has (some may not be shown: Know-No's prompts without the gold)
    n_options: int = 0
    #: the removed gold option's text, for a review stage without the gold (what a person or a judge needs)
    gold_text: str | None = None
    #: row fields the stage records in its result lines (``record:``)
    fields: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # The call's fields most code reads, without spelling ``task.call`` each time.
    @property
    def key(self) -> str:
        return self.call.key

    @property
    def provider(self) -> str:
        return self.call.provider

    @property
    def model_name(self) -> str:
        return self.call.model_name

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.call.messages
