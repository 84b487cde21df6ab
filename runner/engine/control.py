"""Whether a run goes on: the one flag every part of the engine reads before it starts something new, and the error
that ended the run, when one did; and the asyncio tasks the parts start beside the dispatch loop, which a stage's
end waits for and a second Ctrl-C cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from runner.errors import RunnerError


@dataclass(slots=True)
class RunControl:
    #: set by the first Ctrl-C, a run budget that ran out, or an error that ends the run: nothing new is dispatched
    stopping: bool = False
    #: the error that ends the run (a provider that cannot start, a refused key, an exhausted quota)
    fatal: RunnerError | None = None

    def stop(self) -> None:
        self.stopping = True

    def fail(self, exc: RunnerError) -> None:
        """End the run with ``exc`` (the first such error is the one the run reports)."""
        if self.fatal is None:
            self.fatal = exc
        self.stopping = True


class Spawned:
    """The asyncio tasks the engine's parts start beside the dispatch loop: a request sent, one waiting in its
    endpoint's line or behind its prompt-cache group's first, a task following an identical request, a Batch API
    line sent online. The dispatcher waits for them (``drain``) and cancels them (``abandon``)."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
