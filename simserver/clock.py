"""The simulated server's time, for tests and benchmarks of what takes hours at the real APIs.

``SimConfig.time_scale`` (real seconds per simulated second; 1 by default) scales every duration the server
states: its clock (:class:`ScaledClock`, which the rate limits, the batches, the prompt caches and the explicit
caches read) runs ``1 / time_scale`` times as fast as the wall, and the seconds it sleeps (``latency``,
``flex_latency``, ``hang_seconds``, ``count_latency``) or tells a client to wait (``retry-after``) are multiplied by
``time_scale``. So ``time_scale: 0.001`` makes a batch of a 1-hour turnaround end after 3.6 s, a flex answer of
``flex_latency: 600`` take 0.6 s, and an ``rpm`` of 60 admit 60 requests per 60 ms.

A batch's turnaround (:func:`batch_delay`) is ``batch_delay`` when ``batch_median`` is 0; else drawn from a
lognormal of median ``batch_median`` and 95th percentile ``batch_p95`` (simulated seconds; a ``batch_p95`` below the
median is taken as the median: no spread), the draw of the n-th batch since the last reset seeded by ``seed`` and n
alone (:func:`turnaround`), so a benchmark can replay the same turnarounds elsewhere. A batch still running
``batch_window`` seconds after its creation ends expired, its lines done by then answered (the Batch APIs' 24 h).
"""

from __future__ import annotations

import math
import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import SimConfig

__all__ = ["Z95", "ScaledClock", "batch_delay", "turnaround"]

#: the standard normal's 95th percentile
Z95 = 1.6448536269514722


class ScaledClock:
    """Monotonic seconds running ``1 / scale`` times as fast as the wall; a new scale takes effect from now on
    (the clock never jumps)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self._anchor = self._base = time.monotonic()

    def __call__(self) -> float:
        return self._base + (time.monotonic() - self._anchor) / self.scale

    def rescale(self, scale: float) -> None:
        self._base, self._anchor = self(), time.monotonic()
        self.scale = scale

    def __repr__(self) -> str:
        return f"ScaledClock(scale={self.scale}, now={self():.3f})"


def turnaround(median: float, p95: float, seed: int, index: int) -> float:
    """The ``index``-th batch's turnaround (seconds) under ``seed``: lognormal of that median and 95th percentile."""
    sigma = math.log(max(p95, median) / median) / Z95
    rng = random.Random(f"batch-turnaround\0{seed}\0{index}")
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def batch_delay(config: SimConfig, index: int) -> float:
    """The simulated seconds the ``index``-th batch since the last reset takes to end."""
    if config.batch_median > 0:
        return turnaround(config.batch_median, config.batch_p95, config.seed, index)
    return config.batch_delay
