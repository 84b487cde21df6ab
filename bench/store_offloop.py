#!/usr/bin/env python
"""What a store call costs the event loop, made three ways (issue 35: the store off the event loop).

    python bench/store_offloop.py [--calls 2000] [--rounds 5]

For the runner's most frequent store calls (a chunk's memo lookup, ``lookup_many`` of 256 keys of which half are in
the memo; a heartbeat, one short write transaction), on a SQLite file and on a throwaway PostgreSQL server on
127.0.0.1 (devservers/postgres.py), it prints per call:

- ``direct``: the call made on the event loop, as before: the loop is blocked for all of it;
- ``thread``: the call handed to the store's thread (runner/store/offloop.py) and awaited: what the loop spends is
  the hand-over, measured as the loop's own CPU time per call (``time.thread_time`` of the loop's thread);
- ``async``: PostgreSQL only, psycopg's ``AsyncConnection`` running the same statement (the alternative to a thread).

Each figure is the median of ``--rounds`` rounds of ``--calls`` calls, the ways interleaved (ABBA). A script, not a
test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runner.store import ResponseRow, open_store  # noqa: E402
from runner.store.offloop import LoopStore, StoreThread  # noqa: E402


def _fill(store: Any, keys: int) -> list[str]:
    """Half of the keys in the memo; returns all of them."""
    names = [f"{i:064x}" for i in range(keys)]
    rows = [ResponseRow(k, "sim", "m", "{}", "A", "{}", "stop", 10, 1, 0, 0.0, 0.01, "2026-01-01", None, 0)
            for k in names[::2]]
    store.write_batch([], rows, [])
    return names


async def _direct(store: Any, call: Any, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        call(store)
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


async def _thread(calls: LoopStore, call: Any, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        await calls.run(call, calls.sync)
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


async def _async_pg(url: str, sql: str, args: Any, n: int) -> tuple[float, float]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await (await conn.execute(sql, args)).fetchall()
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(n):
            await (await conn.execute(sql, args)).fetchall()
        return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


async def measure(where: str, label: str, n: int, rounds: int, out: Any) -> None:
    store = open_store(where)
    run_id = store.create_run("bench", "bench.yaml", "{}", "fp", 1)
    store.join_run(run_id, "w1", "host", 1, 30.0)
    keys = _fill(store, 256)
    calls = LoopStore(store, StoreThread("bench-store"))
    probes = {
        "lookup_many(256)": lambda s: s.lookup_many(keys),
        "heartbeat": lambda s: s.heartbeat("w1", 30.0),
    }
    for name, call in probes.items():
        ways: dict[str, list[tuple[float, float]]] = {"direct": [], "thread": []}
        if label == "postgres" and name.startswith("lookup"):
            ways["async"] = []
        call(store)
        await calls.run(call, store)
        order = list(ways)
        for r in range(rounds):
            for way in order if r % 2 == 0 else reversed(order):
                if way == "direct":
                    got = await _direct(store, call, n)
                elif way == "thread":
                    got = await _thread(calls, call, n)
                else:
                    got = await _async_pg(where, "SELECT key, response_text FROM responses WHERE key = ANY(%s)",
                                          (keys,), n)
                ways[way].append(got)
        for way, figures in ways.items():
            wall = statistics.median(f[0] for f in figures) * 1e6
            cpu = statistics.median(f[1] for f in figures) * 1e6
            blocked = wall if way == "direct" else cpu
            out(f"{label:8} {name:17} {way:6}: {wall:8.1f} us per call, the loop busy {blocked:7.1f} us of it "
                f"(loop thread CPU {cpu:7.1f} us)")
    await calls.close()
    store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    def out(text: str) -> None:
        print(text, flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-offloop-") as tmp:
        asyncio.run(measure(str(Path(tmp) / "store.sqlite"), "sqlite", args.calls, args.rounds, out))
    from devservers import postgres

    server = postgres.start_server()
    if server is None:
        out("postgres: skipped (no PostgreSQL server binary)")
        return 0
    try:
        asyncio.run(measure(server.new_schema(), "postgres", args.calls, args.rounds, out))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
