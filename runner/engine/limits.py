"""Per-endpoint rate limits (ARCHITECTURE.md invariant 5).

An endpoint is provider + key + model: two models of one provider do not share limits. Each has

- token buckets for requests, tokens, input tokens and output tokens per minute. A bucket starts from the
  job's configured value, or from the first response's rate-limit headers when the job sets none; headers
  keep it in step with the server afterwards (its ``remaining``), and a configured value stays the ceiling;
- a pause shared by every request after a 429, for its Retry-After;
- a concurrency bound. While no rate-limit headers have been seen (local servers send none) the bound is
  adaptive: it halves on errors and grows by one per window of good responses while latency holds.

When several processes work on one run (runner/engine/workers.py) each takes an equal share of every bucket:
its capacity, its refill and what the server says remains, so together they stay within the server's limit.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from runner.providers.base import RateWindow

#: the kinds of limit a response's headers may carry, each counted per minute
KINDS = ("requests", "tokens", "input_tokens", "output_tokens")


class Bucket:
    """A token bucket: ``capacity`` per minute, refilled continuously. ``take`` waits until it can."""

    __slots__ = ("_clock", "_sleep", "capacity", "ceiling", "full", "level", "rate", "share", "stamp")

    def __init__(self, capacity: float, *, ceiling: float | None = None, clock: Callable[[], float],
                 sleep: Callable[[float], object], share: float = 1.0) -> None:
        self.ceiling = ceiling
        #: the limit per minute; this process uses ``share`` of it (1 / the processes working on the run)
        self.full = min(capacity, ceiling) if ceiling else capacity
        self.share = share
        self.capacity = self.full * share
        self.rate = self.capacity / 60.0
        self.level = self.capacity  # tokens available now
        self._clock = clock
        self._sleep = sleep
        self.stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        return now

    @property
    def margin(self) -> float:
        """Tokens kept back: the server starts refilling when a request arrives, not when we send it, so a
        slow first connection or a burst queued at the server would otherwise overdraw its bucket by the
        refill of that delay. Half a second's refill, at most 5 % of the bucket; the pace is unchanged."""
        return min(self.rate * 0.5, self.capacity * 0.05)

    async def take(self, amount: float) -> None:
        amount = min(amount, self.capacity - self.margin)  # a request larger than the bucket still goes, alone
        while True:
            self._refill()
            short = amount + self.margin - self.level
            if short <= 1e-9:  # float sums of refills may fall short by an ulp
                self.level -= amount
                return
            await self._sleep(max(short / self.rate, 1e-3))

    def resize(self, limit: int) -> None:
        """The server announced its limit: adopt it, below the configured ceiling."""
        full = float(min(limit, self.ceiling) if self.ceiling else limit)
        if full > 0 and full != self.full:
            self.full = full
            self._rescale()

    def set_share(self, share: float) -> None:
        """Another process joined the run or left it: use ``share`` of the limit from now on."""
        if share != self.share:
            self.share = share
            self._rescale()

    def _rescale(self) -> None:
        self._refill()
        self.capacity = self.full * self.share
        self.rate = self.capacity / 60.0
        self.level = min(self.level, self.capacity)

    def sync(self, remaining: int, age: float) -> None:
        """The server had ``remaining`` left when it admitted a request ``age`` seconds ago at most. Never
        believe more than our own count: other clients may share the key, and we may have sent more since."""
        self._refill()
        self.level = min(self.level, remaining * self.share + age * self.rate)


class Slots:
    """A semaphore whose size can change while requests hold it."""

    __slots__ = ("held", "limit", "waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.held < self.limit and not self.waiters:
            self.held += 1
            return
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            await future  # the releaser counted us in ``held`` before waking us
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()
            elif future in self.waiters:  # a release may have dropped it already, cancelled beside others
                self.waiters.remove(future)
            raise

    def release(self) -> None:
        self.held -= 1
        self._wake()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def _wake(self) -> None:
        while self.waiters and self.held < self.limit:
            future = self.waiters.popleft()
            if not future.done():
                self.held += 1
                future.set_result(None)


class Adaptive:
    """Additive increase, multiplicative decrease of an endpoint's concurrency, for servers that say nothing
    about their limits. Grows by one after ``limit`` good answers in a row whose latency stays within twice
    the best seen; halves on an error, at most once per latency window so one burst counts once."""

    __slots__ = ("_clock", "best", "ceiling", "good", "last_cut", "slots")

    def __init__(self, slots: Slots, ceiling: int, clock: Callable[[], float]) -> None:
        self.slots = slots
        self.ceiling = ceiling
        self.best = math.inf
        self.good = 0
        self.last_cut = -math.inf
        self._clock = clock

    def success(self, latency: float) -> None:
        self.best = min(self.best, latency)
        if latency > 2 * self.best + 0.005:  # queueing somewhere: hold, do not grow
            self.good = 0
            return
        self.good += 1
        if self.good >= self.slots.limit and self.slots.limit < self.ceiling:
            self.good = 0
            self.slots.resize(self.slots.limit + 1)

    def failure(self) -> None:
        now = self._clock()
        self.good = 0
        if now - self.last_cut < max(self.best, 0.05) * 2:
            return
        self.last_cut = now
        self.slots.resize(max(1, self.slots.limit // 2))


class Endpoint:
    """The gate every request to one endpoint passes before it is sent."""

    def __init__(
        self,
        name: str,
        *,
        concurrency: int,
        rpm: int | None = None,
        tpm: int | None = None,
        itpm: int | None = None,
        otpm: int | None = None,
        adaptive: bool = False,
        adaptive_start: int = 4,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], object] = asyncio.sleep,
    ) -> None:
        self.name = name
        self._clock = clock or asyncio.get_running_loop().time
        self._sleep = sleep
        #: this process's share of the limits (1 / the processes working on the run)
        self.share = 1.0
        #: configured per-minute ceilings by kind
        self.ceilings: dict[str, int | None] = {"requests": rpm, "tokens": tpm, "input_tokens": itpm,
                                                "output_tokens": otpm}
        self.buckets: dict[str, Bucket] = {
            kind: self._bucket(limit, limit) for kind, limit in self.ceilings.items() if limit
        }
        self.ceiling = concurrency
        #: bounds the requests in flight (and so the tasks and memory the dispatcher holds). The first request
        #: goes alone: its answer brings the server's limits, or a refused key, before anything else is sent.
        self.slots = Slots(1)
        self.opening = min(adaptive_start, concurrency) if adaptive else concurrency
        self.probing = True
        self.adaptive = Adaptive(self.slots, concurrency, self._clock) if adaptive else None
        #: the last windows the server reported, for the live view and the report
        self.reported: dict[str, RateWindow] = {}
        #: loop time before which nothing is sent (set by a 429's Retry-After)
        self.paused_until = 0.0
        #: set when the endpoint refused our key: nothing more is sent to it
        self.dead: Exception | None = None

    def _bucket(self, capacity: int, ceiling: int | None) -> Bucket:
        return Bucket(capacity, ceiling=ceiling, clock=self._clock, sleep=self._sleep, share=self.share)

    def set_share(self, share: float) -> None:
        """Split the endpoint's rate limits with other processes working on the same run."""
        self.share = share
        for bucket in self.buckets.values():
            bucket.set_share(share)

    @property
    def counts_tokens(self) -> bool:
        return any(kind in self.buckets for kind in ("tokens", "input_tokens", "output_tokens"))

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, self._clock() + seconds)

    async def ready(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Wait out any pause, then take one request and the request's tokens from the buckets."""
        while (wait := self.paused_until - self._clock()) > 0:
            await self._sleep(wait)
        buckets = self.buckets
        if not buckets:
            return
        for kind, amount in (("requests", 1), ("tokens", input_tokens + output_tokens),
                             ("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            bucket = buckets.get(kind)
            if bucket is not None and amount > 0:
                await bucket.take(amount)

    def answered(self) -> None:
        """An answer (or an error) came back: after the endpoint's first, let the others go."""
        if self.probing:
            self.probing = False
            self.slots.resize(self.opening)

    def observe(self, rate: dict[str, RateWindow] | None, latency: float) -> None:
        """A response arrived: learn the server's limits from its headers, or adapt to its latency."""
        if rate:
            if self.adaptive is not None:  # the server states its limits: they govern, not our guesses
                self.adaptive = None
                self.slots.resize(self.ceiling)
            self.reported.update(rate)
            for kind, window in rate.items():
                bucket = self.buckets.get(kind)
                if window.limit:
                    if bucket is None:
                        bucket = self.buckets[kind] = self._bucket(window.limit, self.ceilings.get(kind))
                    else:
                        bucket.resize(window.limit)
                if bucket is not None and window.remaining is not None:
                    bucket.sync(window.remaining, latency)
        elif self.adaptive is not None:
            self.adaptive.success(latency)

    def failed(self) -> None:
        """A request failed in a way that says the server is loaded (429, 5xx, timeout, dropped connection)."""
        if self.adaptive is not None:
            self.adaptive.failure()

    def __repr__(self) -> str:
        return f"<Endpoint {self.name} slots={self.slots.limit} paused_until={self.paused_until:.2f}>"
