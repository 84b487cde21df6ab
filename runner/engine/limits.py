"""Per-endpoint rate limits (ARCHITECTURE.md invariant 5) and the requests each endpoint keeps in flight.

An endpoint is provider + key + model: two models of one provider do not share limits. Each has

- token buckets for requests, tokens, input tokens and output tokens per minute. A bucket starts from the
  job's configured value, or from the first response's rate-limit headers when the job sets none; headers
  keep it in step with the server afterwards (its ``remaining``), and a configured value stays the ceiling.
  What a request took is counted as not yet at the server until its attempt ends (``Bucket``,
  runner/engine/buckets.py): a server's bucket that is full refills nothing until the request arrives, so refill
  counted while it is on its way (a stalled event loop, a burst still being sent) is refill the server never had;
- a pause shared by every request after a 429, for its Retry-After;
- a bound on the requests in flight. Where a request limit is known (configured or from headers) it follows
  Little's law: the rate the buckets allow times the mean answer latency, with headroom, plus what they hold
  saved up; a 6,000 RPM key with 20 s answers keeps about 2,500 in flight once its first minute is spent. While no
  rate-limit headers have been seen (local servers send none) it ramps: doubling per window of clean answers until
  latency rises above its floor or errors come, then additive increase and multiplicative decrease
  (:class:`Ramp`). An explicit ``concurrency`` caps both, and ``max_in_flight`` (memory) and the process's
  open-files limit bound them.

When several processes work on one run (runner/engine/workers.py) each takes an equal share of every bucket:
its capacity, its refill and what the server says remains, so together they stay within the server's limit.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from runner.engine.buckets import NOTHING, Bucket, Taken

# DEFAULT_MAX_IN_FLIGHT: the default of the max_in_flight setting, beside the setting (the SDKs' pools use it too)
from runner.providers.base import DEFAULT_MAX_IN_FLIGHT, RateWindow

#: the kinds of limit a response's headers may carry, each counted per minute
KINDS = ("requests", "tokens", "input_tokens", "output_tokens")

#: Little's law's target is rate x mean latency times this (latency's spread, the bucket's bursts) ...
HEADROOM = 1.25
#: ... plus this many, so that an endpoint with short answers still has a few to spare
SLACK = 8
#: weight of the newest answer in the mean latency (about the last 20 answers count)
LATENCY_WEIGHT = 0.05
#: a window's median latency this far above the floor is queueing: the ramp stops doubling and backs off
RISE = 1.5
#: open files kept for everything but connections (the store, its journal, logs, the SDKs' own)
RESERVED_FILES = 256


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


def connection_room(wanted: int) -> int:
    """Connections this process may hold at once, up to ``wanted``: its open-files limit less
    ``RESERVED_FILES``. A soft limit below ``wanted`` is raised towards the hard one first (each connection
    in flight is an open file)."""
    try:
        import resource
    except ImportError:  # no RLIMIT_NOFILE to respect (Windows)
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_FILES))


class Ramp:
    """The bound on requests in flight of a server that states no limits. Slow start: each clean answer adds
    one, so the bound doubles per window (as many answers as the bound was when the window opened). At each
    window's end its median latency is set against the floor (the lowest window median seen): past ``RISE`` x the
    floor the server queues, and the bound is cut to what it answered without queueing (Little's law: bound x
    floor / median, at least half the window's opening bound). Once latency rose or an error came, growth is
    additive: ``step`` per clean window; an error halves the bound, at most once per latency window (one burst
    counts once)."""

    __slots__ = ("_clock", "ceiling", "doubling", "floor", "last_cut", "size", "slots", "step", "window")

    def __init__(self, slots: Slots, ceiling: int, clock: Callable[[], float], step: int = 4) -> None:
        self.slots = slots
        self.ceiling = ceiling
        self.step = step
        self.doubling = True
        self.floor = math.inf
        #: the latencies of the window so far, and the answers that close it
        self.window: list[float] = []
        self.size = slots.limit
        self.last_cut = -math.inf
        self._clock = clock

    def success(self, latency: float) -> None:
        window = self.window
        window.append(latency)
        slots = self.slots
        if self.doubling and slots.limit < self.ceiling:
            slots.resize(slots.limit + 1)
        if len(window) < self.size:
            return
        import statistics  # imported when a window first ends, not at every start

        median = statistics.median(window)
        window.clear()
        self.floor = min(self.floor, median)
        limit = slots.limit
        if median > RISE * self.floor + 0.005:  # queueing somewhere
            self.doubling = False
            slots.resize(max(self.size // 2, int(limit * self.floor / median)))
        elif not self.doubling:
            slots.resize(min(limit + self.step, self.ceiling))
        self.size = slots.limit

    def failure(self) -> None:
        now = self._clock()
        self.doubling = False
        self.window.clear()
        spacing = self.floor if self.floor < math.inf else 1.0  # no window measured yet: a second
        if now - self.last_cut < max(spacing, 0.05) * 2:
            return
        self.last_cut = now
        self.slots.resize(max(1, self.slots.limit // 2))
        self.size = self.slots.limit


class Endpoint:
    """The gate every request to one endpoint passes before it is sent."""

    def __init__(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        max_in_flight: int | None = None,
        opening: int = 16,
        rpm: int | None = None,
        tpm: int | None = None,
        itpm: int | None = None,
        otpm: int | None = None,
        adaptive: bool = False,
        adaptive_start: int = 4,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], object] = asyncio.sleep,
    ) -> None:
        """``concurrency``: the user's explicit bound (a hard cap; fixed where no limit is known).
        ``max_in_flight``: the memory bound (``DEFAULT_MAX_IN_FLIGHT`` when neither is set). ``opening``: the
        bound after the first answer until a latency is known (the provider's default concurrency)."""
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
        bounds = [bound for bound in (concurrency, max_in_flight) if bound]
        #: the most requests ever in flight: the explicit concurrency, the memory bound, the open files
        self.ceiling = connection_room(min(bounds) if bounds else DEFAULT_MAX_IN_FLIGHT)
        #: bounds the requests in flight (and so the tasks and memory the dispatcher holds). The first request
        #: goes alone: its answer brings the server's limits, or a refused key, before anything else is sent.
        self.slots = Slots(1)
        #: the bound while a known limit cannot be turned into requests yet (tokens per request unknown)
        self.fallback = min(concurrency or opening, self.ceiling)
        self.opening = min(adaptive_start, self.ceiling) if adaptive else self.fallback
        self.probing = True
        self.ramp = Ramp(self.slots, self.ceiling, self._clock) if adaptive else None
        #: mean answer latency (seconds), for Little's law
        self.latency: float | None = None
        #: mean tokens a request takes from each token bucket, to turn a token limit into requests
        self.per_request: dict[str, float] = {}
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

    async def ready(self, input_tokens: int = 0, output_tokens: int = 0) -> Taken:
        """Wait out any pause, then take one request and the request's tokens from the buckets. What was taken
        goes to :meth:`arrived` when the attempt ends, however it ends (see :class:`Bucket`)."""
        while (wait := self.paused_until - self._clock()) > 0:
            await self._sleep(wait)
        buckets = self.buckets
        if not buckets:
            return NOTHING
        per_request = self.per_request
        taken: Taken = []
        try:
            for kind, amount in (("requests", 1), ("tokens", input_tokens + output_tokens),
                                 ("input_tokens", input_tokens), ("output_tokens", output_tokens)):
                bucket = buckets.get(kind)
                if bucket is not None and amount > 0:
                    if kind != "requests":
                        mean = per_request.get(kind)
                        per_request[kind] = amount if mean is None else mean + LATENCY_WEIGHT * (amount - mean)
                    taken.append((bucket, await bucket.take(amount)))
        except BaseException:  # cancelled while waiting for a later bucket: nothing is sent
            self.arrived(taken)
            raise
        return taken

    @staticmethod
    def arrived(taken: Taken) -> None:
        """The attempt that took ``taken`` (:meth:`ready`) ended: answered, refused, or never to reach the server."""
        for bucket, hold in taken:
            bucket.arrived(hold)

    def answered(self) -> None:
        """An answer (or an error) came back: after the endpoint's first, let the others go."""
        if self.probing:
            self.probing = False
            self.slots.resize(self.opening)

    def observe(self, rate: dict[str, RateWindow] | None, latency: float) -> None:
        """A response arrived: learn the server's limits from its headers, or ramp on its latency; then size the
        requests in flight to the limits and the latency."""
        mean = self.latency
        self.latency = latency if mean is None else mean + LATENCY_WEIGHT * (latency - mean)
        if rate:
            self.ramp = None  # the server states its limits: they govern, not our guesses
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
        elif self.ramp is not None:
            self.ramp.success(latency)
            return
        if self.buckets and not self.probing:
            self.retarget()

    def in_flight_target(self) -> int | None:
        """Little's law over a token bucket: the requests the buckets let go within one mean latency (what each
        holds now, plus its refill over the latency with headroom), in requests (a token bucket's over the mean
        tokens a request takes from it), plus the slack, within the ceiling. None while no limit can be counted in
        requests or no latency is known. In steady state a bucket holds next to nothing and this is rate x
        latency; a fresh key's saved-up minute goes at once, as the server's own bucket allows."""
        latency = self.latency
        if latency is None:
            return None
        allowed = math.inf
        for kind, bucket in self.buckets.items():
            per = 1.0 if kind == "requests" else self.per_request.get(kind)
            if per:
                allowed = min(allowed, (bucket.available() + bucket.rate * latency * HEADROOM) / per)
        if allowed == math.inf:
            return None
        return max(1, min(math.ceil(allowed) + SLACK, self.ceiling))

    def retarget(self) -> None:
        target = self.in_flight_target() or self.fallback
        if target != self.slots.limit:
            self.slots.resize(target)

    def failed(self) -> None:
        """A request failed in a way that says the server is loaded (429, 5xx, timeout, dropped connection)."""
        if self.ramp is not None:
            self.ramp.failure()

    def __repr__(self) -> str:
        return f"<Endpoint {self.name} slots={self.slots.limit} paused_until={self.paused_until:.2f}>"
