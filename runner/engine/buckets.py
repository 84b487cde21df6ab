"""An endpoint's token buckets (runner/engine/limits.py): requests, tokens, input and output tokens per minute, each
refilled continuously, kept in step with the server's rate-limit headers and shared among the processes on one run;
what a request took counts as not yet at the server until its attempt ends."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

#: seconds after which a request taken from a bucket and still unanswered is counted as at the server (see Bucket)
HORIZON = 10.0


class Bucket:
    """A token bucket: ``capacity`` per minute, refilled continuously. ``take`` waits until it can.

    The server counts a request when it arrives, and its bucket, like ours, never holds more than its capacity. So
    while a request we took is on its way, the server's bucket may still be full and refill nothing: a burst taken
    at once from a full bucket but sent over two seconds (a loaded machine, three endpoints' bursts built by one
    event loop), or requests taken just before the loop stalled, would let us count two seconds' refill the server
    never had, and the steady pace after the burst then overdraws the server's bucket by that much (the 429s of
    bench/pooled.py under load, issue 38). Hence the bucket never refills past ``capacity`` less what is
    ``held``: taken by requests whose attempts have not ended (:meth:`arrived`; an answer, even a 429, proves the
    request reached the server, and an attempt that ended otherwise will not reach it any more), nor are younger
    than ``HORIZON`` seconds. That is the server's bucket if every such request arrived as late as it could,
    which is the worst case for what the server has left (a later arrival can only lose more refill at its cap).
    In steady state this never binds (held is the rate times the answer latency, at most ``HORIZON`` seconds of
    refill, a sixth of the bucket, and the bucket holds next to nothing); after a burst from a full bucket it
    withholds the refill of the time until the burst's first answers come (at most ``HORIZON``). A stall of more
    than ``HORIZON`` seconds between the limiter and the server could still overdraw it, by the refill of the
    excess less the margin."""

    __slots__ = ("_clock", "_sleep", "capacity", "ceiling", "full", "held", "holds", "level", "rate", "share",
                 "stamp")

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
        #: what requests on their way took, oldest first: [amount (0 once arrived), when taken]
        self.holds: deque[list[float]] = deque()
        #: the sum of the holds' amounts
        self.held = 0.0

    def _refill(self) -> float:
        now = self._clock()
        holds = self.holds
        while holds and (not holds[0][0] or holds[0][1] + HORIZON <= now):
            hold = holds.popleft()
            if hold[0]:  # unanswered for HORIZON seconds: at the server's count from then on
                self._advance(hold[1] + HORIZON)
                self.held -= hold[0]
                hold[0] = 0.0
        if not holds:
            self.held = 0.0  # no float residue
        self._advance(now)
        return now

    def _advance(self, now: float) -> None:
        """Refill up to ``now``, never past the capacity less what is held (each hold's end is applied at its
        own time: the refill before it is capped as it was then)."""
        self.level = min(self.capacity - self.held, self.level + max(0.0, now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def available(self) -> float:
        """What the bucket holds now."""
        self._refill()
        return max(0.0, self.level)

    @property
    def margin(self) -> float:
        """Tokens kept back: the server starts refilling when a request arrives, not when we send it, so a
        slow first connection or a burst queued at the server would otherwise overdraw its bucket by the
        refill of that delay. Half a second's refill, at most 5 % of the bucket; the pace is unchanged."""
        return min(self.rate * 0.5, self.capacity * 0.05)

    async def take(self, amount: float) -> list[float]:
        """Take ``amount`` once the bucket holds it and the margin; the hold to hand to :meth:`arrived` when the
        request's attempt ends."""
        amount = min(amount, self.capacity - self.margin)  # a request larger than the bucket still goes, alone
        while True:
            now = self._refill()
            short = amount + self.margin - self.level
            if short <= 1e-9:  # float sums of refills may fall short by an ulp
                self.level -= amount
                hold = [amount, now]
                self.holds.append(hold)
                self.held += amount
                return hold
            await self._sleep(max(short / self.rate, 1e-3))

    def arrived(self, hold: list[float]) -> None:
        """The attempt that took ``hold`` ended: what it took is at the server's count (or never will be)."""
        if hold[0]:
            self._refill()  # the refill until now, capped as it was while the request was on its way
            if hold[0]:  # (not counted as arrived by the horizon meanwhile)
                self.held -= hold[0]
                hold[0] = 0.0

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


#: what one attempt took from an endpoint's buckets: (bucket, its hold) each
Taken = list[tuple[Bucket, list[float]]]
#: what an endpoint with no buckets takes
NOTHING: Taken = []
