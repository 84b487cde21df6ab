"""Per-model rate limits as token buckets, like the real providers'.

A bucket holds its per-minute limit and refills continuously at limit/60 per second; a request is admitted
only if every configured bucket holds its cost (``rpm``: 1; ``tpm``: input + max tokens, 16 when absent;
``itpm``: input; ``otpm``: max tokens), and is then charged to all of them. Otherwise it gets a 429 whose
``retry-after`` is the wait until the bucket would admit it, rounded up to a millisecond; a request costing
more than a bucket's capacity could never be admitted and gets a 400 instead (a 429 would invite retries that
can never succeed). Rate-limit headers go on every response of an authenticated, valid request while a limit
is configured: OpenAI ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (rpm and tpm only; reset as
"1s", "6m0s", "120ms"), Anthropic ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
remaining,reset}`` (reset an RFC 3339 time); Gemini sends none, only ``RetryInfo`` in its 429 body. "Reset" is
when the bucket is full again. Every 429 carries ``retry-after`` in seconds (OpenAI also ``retry-after-ms``).
Each wire format module writes its own headers from these buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_TOKENS", "LIMITS", "PER_MINUTE", "Blocked", "Bucket", "wait_ms", "why_blocked"]

DEFAULT_MAX_TOKENS = 16  # what a request without max tokens is charged to the token buckets
#: (SimConfig field, bucket kind) of every limit, in the order a model's buckets are built
LIMITS = (("rpm", "requests"), ("tpm", "tokens"), ("itpm", "input-tokens"), ("otpm", "output-tokens"))
PER_MINUTE = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)",
              "input-tokens": "input tokens per min (ITPM)", "output-tokens": "output tokens per min (OTPM)"}


class Bucket:
    """One per-minute limit of one model: holds up to ``capacity``, refills at ``capacity / 60`` per second."""

    __slots__ = ("capacity", "kind", "level", "rate", "stamp")

    def __init__(self, kind: str, capacity: int, now: float) -> None:
        self.kind = kind  #: "requests", "tokens", "input-tokens" or "output-tokens"
        self.capacity = capacity
        self.rate = capacity / 60.0
        self.level = float(capacity)
        self.stamp = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def cost(self, input_tokens: int, output_tokens: int) -> int:
        kind = self.kind
        if kind == "requests":
            return 1
        if kind == "tokens":
            return input_tokens + output_tokens
        return input_tokens if kind == "input-tokens" else output_tokens

    def remaining(self) -> int:
        return max(0, int(self.level + 1e-9))

    def full_in(self) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level) / self.rate


@dataclass(slots=True)
class Blocked:
    """Why a request was not admitted: the bucket that makes it wait longest."""

    bucket: Bucket
    cost: int
    wait: float  #: seconds; inf when the cost exceeds the capacity


def why_blocked(buckets: list[Bucket], input_tokens: int, output_tokens: int) -> Blocked | None:
    """Why the request cannot be admitted now (buckets refilled by the caller), or None."""
    worst: Blocked | None = None
    for bucket in buckets:
        cost = bucket.cost(input_tokens, output_tokens)
        if cost > bucket.capacity:
            return Blocked(bucket, cost, math.inf)
        if cost > bucket.level + 1e-9:
            wait = (cost - bucket.level) / bucket.rate
            if worst is None or wait > worst.wait:
                worst = Blocked(bucket, cost, wait)
    return worst


def wait_ms(seconds: float) -> int:
    """A bucket's wait in whole milliseconds, rounded up."""
    return math.ceil(round(seconds * 1000, 6))
