"""The parts of a run that do nothing, for what a run does not use: :class:`NoBatcher` in place of the Batch API
side (runner/engine/batch.py) when every stage is online, :class:`NoPromptCache` in place of the prompt-cache plan
(runner/engine/prompt_cache.py) when nothing is cached, and :class:`NoStoredPrompts` in place of the prefixes stored
at a provider (runner/engine/stored_prompts.py). Their own module, so that a run that sends online alone does not
import the Batch API's or the prompt cache's (runner/engine/assembly.py imports those when a run uses them); each
of those modules names its own here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.plan.prefixes import CacheRule
    from runner.plan.request import Task
    from runner.providers.base import CacheMarks, Provider
    from runner.providers.batching import BatchLine

__all__ = ["NoBatcher", "NoPromptCache", "NoStoredPrompts"]


class NoStoredPrompts:
    """The stored prefixes of a run none of whose providers keeps any (``Provider.stores_prompts``): it serves no
    request, so nothing is chosen, stored, kept or deleted. :class:`~runner.engine.prompt_cache.PromptCachePlan`
    holds it in place of :class:`~runner.engine.stored_prompts.StoredPrompts` and calls it without asking which it
    has."""

    __slots__ = ()

    def serves(self, task: Task) -> bool:
        return False

    def choose(self, rule: CacheRule, planned: list[tuple[Task, CacheMarks]]) -> dict[str, CacheMarks]:
        return {}

    async def ready(self, task: Task, marks: CacheMarks) -> CacheMarks:
        return marks

    async def close(self) -> None:
        """Nothing was stored: nothing to delete."""


class NoPromptCache:
    """The plan of a run that plans no provider prompt caching (no stage with ``prompt_cache: auto``, or no provider
    whose API caches prompts): no request waits for another or is marked, and nothing is stored at a provider. The
    dispatcher, the sender and the Batch API side hold it in place of
    :class:`~runner.engine.prompt_cache.PromptCachePlan` and call it without asking which they have; each call does
    nothing."""

    __slots__ = ()

    #: no prefix is stored at a provider: the run's end has nothing to delete
    stored = NoStoredPrompts()

    def plan(self, tasks: list[Task]) -> None:
        pass

    def forget(self, key: str) -> None:
        pass

    def group(self, task: Task) -> str | None:
        return None

    def gate(self, task: Task, answer: asyncio.Future[Any]) -> asyncio.Future[Any] | None:
        return None

    def marks(self, task: Task) -> CacheMarks | None:
        return None

    def writes(self, task: Task, batch: bool) -> tuple[int | None, bool]:
        return 0, False  # nothing is marked: nothing is written to a cache at the write price

    async def ready(self, task: Task, marks: CacheMarks) -> CacheMarks:
        return marks

    def mark_lines(self, provider: Provider, tasks: list[Task], lines: list[BatchLine]) -> list[BatchLine]:
        return lines


class NoBatcher:
    """The Batch API side of a run whose stages are all ``mode: online``: it wants no task, so nothing is ever
    batched, submitted, waited for or collected. The dispatcher and the run hold it in place of
    :class:`~runner.engine.batch.Batcher` and call it without asking which they have."""

    __slots__ = ()

    def wants(self, task: Task) -> bool:
        return False

    def wants_any(self, tasks: Iterable[Task]) -> bool:
        return False

    async def add(self, task: Task) -> None:
        raise AssertionError(f"no stage of this run uses a Batch API, so none wants {task.key}")

    async def submit_pending(self, stage: str) -> None:
        pass

    async def finish(self, stages: set[str]) -> None:
        pass

    def busy(self, stage: str) -> bool:
        return False
