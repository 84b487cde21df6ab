"""A worker's heartbeat and its leases taken at the same time (runner/engine/workers.py): heartbeats go through a
connection and a thread of their own, so a lease can be taken while one is on its way. The heartbeat's answer lists
the leases the store had for the worker when it ran; a lease taken after that is not in it, and must not be taken
for lost (a lease taken for lost is not sent, and the worker's end-of-stage finish would mark it done in the store
with its tasks never written: a run "completed" with a lease of tasks missing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runner.engine.workers import Crew
from runner.store import open_store
from runner.store.offloop import LoopStore

STAGE = "mc"


class HeldBeats(LoopStore):
    """The store as heartbeats reach it, whose heartbeat runs in the store at once and answers only once
    ``release`` is set: what a heartbeat on its own thread looks like when the loop takes a lease meanwhile."""

    def __init__(self, store, ran: asyncio.Event, release: asyncio.Event) -> None:
        super().__init__(store)
        self.ran, self.release = ran, release

    async def heartbeat(self, worker: str, ttl: float):
        held = self.sync.heartbeat(worker, ttl)
        self.ran.set()
        await self.release.wait()
        return held


async def _crew(tmp_path: Path) -> tuple[Crew, HeldBeats, list[list[tuple[str, int]]]]:
    store = open_store(tmp_path / "store.sqlite")
    run_id = store.create_run("job", "job.yaml", "{}", "fp", 10)
    beats = HeldBeats(store, asyncio.Event(), asyncio.Event())
    crew = Crew(store, run_id, ttl=30, beats=beats)
    lost: list[list[tuple[str, int]]] = []
    crew.on_lost = lost.append
    await crew.join()
    assert crew._beat is not None
    crew._beat.cancel()  # heartbeats asked for by the test only
    return crew, beats, lost


async def test_a_lease_taken_while_a_heartbeat_is_on_its_way_is_not_lost(tmp_path):
    crew, beats, lost = await _crew(tmp_path)
    assert (await crew.claim_chunks(STAGE, [0]))[0] == "new"
    beating = asyncio.ensure_future(crew.beat())
    await beats.ran.wait()  # the heartbeat ran in the store: it saw chunk 0 only
    assert (await crew.claim_chunks(STAGE, [1]))[1] == "new"
    beats.release.set()
    await beating
    assert lost == [], "a lease taken while the heartbeat was on its way was taken for lost"
    assert set(crew.leases) == {(STAGE, 0), (STAGE, 1)}
    assert crew.fence(STAGE, 1) is not None


async def test_a_lease_finished_while_a_heartbeat_is_on_its_way_is_not_lost(tmp_path):
    crew, beats, lost = await _crew(tmp_path)
    await crew.claim_chunks(STAGE, [0, 1])
    beating = asyncio.ensure_future(crew.beat())
    await beats.ran.wait()
    crew.finish(STAGE, [0])
    beats.release.set()
    await beating
    assert lost == []
    assert set(crew.leases) == {(STAGE, 1)}


async def test_a_lease_another_worker_took_is_still_found_lost(tmp_path):
    crew, beats, lost = await _crew(tmp_path)
    await crew.claim_chunks(STAGE, [0, 1])
    store = beats.sync
    store.join_run(crew.run_id, "other", "host", 1, 30)
    # the other worker takes chunk 1 over (as after this worker's lease expired): the store's token grows
    store.execute("UPDATE leases SET worker = 'other', token = token + 1 WHERE chunk = 1")
    beats.release.set()
    await crew.beat()
    assert lost == [[(STAGE, 1)]]
    assert set(crew.leases) == {(STAGE, 0)}
