"""Per-endpoint rate limits: requests/minute and tokens/minute (aiolimiter), a concurrency bound, and a
pause shared by every request of the endpoint after a 429.

An endpoint is provider + key + model (DESIGN invariant 5): two models of one provider do not share limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiolimiter import AsyncLimiter


class Endpoint:
    """The gate every request to one endpoint passes before it is sent."""

    __slots__ = ("_clock", "_sleep", "dead", "name", "paused_until", "rpm", "slots", "tpm")

    def __init__(
        self,
        name: str,
        *,
        concurrency: int,
        rpm: int | None = None,
        tpm: int | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], object] = asyncio.sleep,
    ) -> None:
        self.name = name
        #: bounds the requests in flight (and so the tasks and memory the dispatcher holds)
        self.slots = asyncio.Semaphore(concurrency)
        self.rpm = AsyncLimiter(rpm, 60) if rpm else None
        self.tpm = AsyncLimiter(tpm, 60) if tpm else None
        #: loop time before which nothing is sent (set by a 429's Retry-After)
        self.paused_until = 0.0
        #: set when the endpoint refused our key: nothing more is sent to it
        self.dead: Exception | None = None
        self._clock = clock or asyncio.get_running_loop().time
        self._sleep = sleep

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, self._clock() + seconds)

    async def ready(self, tokens: int = 0) -> None:
        """Wait out any pause, then take one request and ``tokens`` tokens from the limiters."""
        while (wait := self.paused_until - self._clock()) > 0:
            await self._sleep(wait)
        if self.rpm is not None:
            await self.rpm.acquire(1)
        if self.tpm is not None and tokens > 0:
            await self.tpm.acquire(min(tokens, self.tpm.max_rate))

    def __repr__(self) -> str:
        return f"<Endpoint {self.name} paused_until={self.paused_until:.2f} dead={self.dead is not None}>"


def estimate_tokens(messages: list[dict[str, str]], max_tokens: int | None) -> int:
    """A cheap upper-leaning estimate for the TPM limiter: about 4 characters a token, plus the output cap."""
    chars = sum(len(m.get("content") or "") for m in messages)
    return chars // 4 + 4 * len(messages) + (max_tokens or 0)
