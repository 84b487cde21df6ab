"""The Batch API seam: what a provider that offers batches (half price, answers within a day) implements.

The engine gives a provider a list of :class:`BatchLine` (a custom id, the messages and the parameters) and
gets back the provider's id for the batch. It then polls :meth:`Batches.status` until the batch has ended and
reads :meth:`Batches.results`: one :class:`BatchResult` per line it submitted, the answer as a
:class:`~runner.providers.base.Completion` or an error. Lines the provider expired, cancelled or failed with a
server error are marked ``retry`` so the engine submits only those again.

Batch ids are the provider's; the engine keeps them in its store, so a later process (``runner resume``) asks
for a batch submitted by an earlier one instead of submitting it again. Before it submits, the engine records
its intent (the lines and their :func:`batch_label`); a process killed after the provider accepted a batch and
before its id was written leaves only that intent, and the next process asks :meth:`Batches.find` for the batch
by its label (and lines) and adopts it instead of submitting the lines again.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from runner.errors import ProviderError

from .base import Completion

#: the states the engine tells apart (each provider's own state is kept beside it, for the live view)
RUNNING = "running"
ENDED = "ended"
#: error classes of lines the provider did not run: submitted again
EXPIRED = "batch_expired"
CANCELLED = "batch_cancelled"
#: error class of a line of a batch refused for its other lines: submitted again once, then failed
REFUSED = "batch_refused"


@dataclass(slots=True)
class BatchLine:
    """One request of a batch: the engine's id for it (unique within the batch) and what to send."""

    custom_id: str
    messages: list[dict[str, str]]
    params: dict[str, Any]


@dataclass(slots=True)
class BatchStatus:
    """A batch as the provider last described it."""

    #: RUNNING or ENDED
    state: str
    #: the provider's own word for it ("in_progress", "finalizing", "JOB_STATE_RUNNING", "expired", ...)
    provider_state: str
    total: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(slots=True)
class BatchResult:
    """The outcome of one line of an ended batch."""

    custom_id: str
    completion: Completion | None = None
    error: ProviderError | None = None
    #: expired, cancelled or failed by the server: worth submitting again (a bad request is not)
    retry: bool = False
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Lookup:
    """What :meth:`Batches.find` found: the provider's id of the batch, or None; ``undecided`` counts batches that
    may be it but cannot be told apart yet (a Message Batch's custom ids can be read only once it ended)."""

    batch_id: str | None = None
    undecided: int = 0


#: seconds a provider's clock may be behind the runner's: a batch is looked for from its intent's time less this
CLOCK_SKEW = 600.0


def batch_label(run_id: str, stage: str, model: str, round: int, custom_ids: Collection[str]) -> str:
    """The label a batch is submitted under: readable (the run, the stage, the model, the round) and, after ``#``,
    a digest of all of these and every line's custom id, which names the batch exactly. A later process computes
    the same label from the lines its store recorded and finds the batch by it. A provider that must shorten a
    label shortens the readable part and keeps the digest (``_batch_common.safe_label``)."""
    parts = [run_id, stage, model, str(round), *sorted(custom_ids)]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    return f"{run_id}/{stage}/{model} r{round} #{digest}"


class Batches(ABC):
    """A provider's Batch API for one model, through the provider's official SDK."""

    @abstractmethod
    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        """Submit the lines as one batch; returns the provider's batch id. ``label`` names the run and stage
        in the batch's metadata, where the provider keeps any."""

    @abstractmethod
    async def find(self, label: str, custom_ids: Collection[str], *, since: float,
                   known: Collection[str] = ()) -> Lookup:
        """The batch of exactly these lines submitted under ``label`` at ``since`` (epoch seconds: when the engine
        recorded its intent to submit it) or after, if the provider accepted one; batches whose ids are in
        ``known`` (those the store has) are not it."""

    @abstractmethod
    async def status(self, batch_id: str) -> BatchStatus:
        """Where the batch stands now."""

    @abstractmethod
    async def results(self, batch_id: str) -> list[BatchResult]:
        """The outcome of every line of an ended batch (lines the provider does not report come back as
        expired, ``retry`` set)."""

    @abstractmethod
    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch (what it finished is still in its results)."""
