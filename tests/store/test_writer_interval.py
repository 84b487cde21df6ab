"""The single writer's commits while results keep coming (``Writer.min_interval``, runner/store/writer.py): at
least that far apart, what arrives meanwhile joining the next batch, while a result after a quiet spell is
committed at once."""

from __future__ import annotations

import asyncio
from typing import Any

from runner.store.writer import Writer


class CountingStore:
    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def write_finished(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        return batch


async def test_results_arriving_meanwhile_join_the_next_commit() -> None:
    store = CountingStore()
    committed: list[Any] = []
    writer = Writer(store, committed.extend, min_interval=0.3)  # type: ignore[arg-type]
    writer.start()
    writer.put("first")
    await asyncio.sleep(0.05)
    assert store.batches == [["first"]]  # after a quiet spell: at once
    for i in range(20):  # within the interval: held for one commit
        writer.put(i)
        await asyncio.sleep(0.002)
    assert store.batches == [["first"]]
    await writer.flush()
    assert store.batches == [["first"], list(range(20))] and committed == ["first", *range(20)]
    await writer.close()


async def test_without_an_interval_each_result_is_committed_as_it_comes() -> None:
    store = CountingStore()
    writer = Writer(store, lambda batch: None, min_interval=0.0)  # type: ignore[arg-type]
    writer.start()
    for i in range(5):
        writer.put(i)
        await asyncio.sleep(0.01)
    await writer.close()
    assert store.batches == [[0], [1], [2], [3], [4]]


async def test_a_full_batch_does_not_wait() -> None:
    store = CountingStore()
    writer = Writer(store, lambda batch: None, batch_size=4, min_interval=5.0)  # type: ignore[arg-type]
    writer.start()
    writer.put("a")
    await asyncio.sleep(0.02)
    for i in range(8):
        writer.put(i)
    await asyncio.sleep(0.2)  # far less than 5 s: two full batches went at once
    assert store.batches == [["a"], [0, 1, 2, 3], [4, 5, 6, 7]]
    await writer.close()


async def test_next_commit_returns_at_the_commit_not_at_its_timeout() -> None:
    """What the reserver waits on when the store refuses a reservation while this process's settled answers are
    still queued here (runner/engine/reserver.py): the commit that writes them, not a fixed pause."""
    store = CountingStore()
    writer = Writer(store, lambda batch: None, min_interval=0.0)  # type: ignore[arg-type]
    writer.start()
    waiting = asyncio.create_task(writer.next_commit(60.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # nothing committed yet
    writer.put("settled")
    await asyncio.wait_for(waiting, 10)  # well before its 60 s: the commit woke it
    assert store.batches == [["settled"]]
    # and with no commit, it returns after its timeout, raising nothing
    await asyncio.wait_for(writer.next_commit(0.05), 10)
    await writer.close()

