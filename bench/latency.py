#!/usr/bin/env python
"""Requests in flight at long latencies: Little's law under a limit, the ramp without one, memory per request.

    python bench/latency.py                 # all three parts at full size (about 7 minutes)
    python bench/latency.py --quick         # smaller sizes, about 3 minutes
    python bench/latency.py --part limit --requests 10000 --rpm 6000 --latency 20

Each part runs the simulated server in its own process and the runner in another (so its peak RSS is its own):

1. ``limit``: ``--requests`` at ``--latency`` s under a server-enforced ``--rpm`` the job does not state (the
   runner learns it from the headers), with a fresh key (the server's bucket holds a minute's burst) and with one
   whose burst another client spent just before (``--key``). Prints the answer rate in steady state (from one
   latency after the runner's first answer to the start of the last wave) over the limit, the 429s, the most
   requests in flight and the runner's peak RSS. The rate may pass the limit while the bucket still holds what it
   saved up (the burst, or what refilled while the first request went alone).
2. ``plain``: ``--plain-requests`` at ``--plain-latency`` s with no limit: the runner (the job sets only
   ``max_in_flight: --in-flight``, so it ramps from the provider's default, 64, to that) against a plain aiohttp
   client holding ``--in-flight`` requests in flight from the start. Prints both wall times and their ratio.
3. ``memory``: all of ``--memory-requests`` in flight at once (``concurrency`` set to that) against a run of a
   tenth as many: the runner's RSS above its floor, and the difference per request in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from bench.ratelimit import sample  # noqa: E402
from bench.throughput_common import SimProcess, proc_status_kb  # noqa: E402

SETTLE = 5.0  # seconds after the first answers before the steady-state window opens


def write_job(folder: Path, url: str, rows: int, settings: dict[str, Any], job_extra: dict[str, Any]) -> Path:
    dataset = folder / "rows.jsonl"
    with open(dataset, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"question": f"Latency question {i}?"}) + "\n")
    job = {
        "name": "latency", "output_dir": str(folder / "results"), "models": ["sim:bench"],
        "providers": {"sim": {"base_url": url, "timeout": 600, **settings}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"rate_limit_attempts": 200, "max_elapsed": 3600},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
        **job_extra,
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path


# -- the runner, in a process of its own ----------------------------------------------------------------------

def child(job_path: str, store_path: str) -> None:
    """Runs in the subprocess: execute the job, counting requests in flight, then print one JSON line."""
    from runner.engine import limits
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    flying = {"now": 0, "peak": 0}
    acquire, release = limits.Slots.acquire, limits.Slots.release

    async def counted_acquire(self: limits.Slots) -> None:
        await acquire(self)
        flying["now"] += 1
        flying["peak"] = max(flying["peak"], flying["now"])

    def counted_release(self: limits.Slots) -> None:
        flying["now"] -= 1
        release(self)

    limits.Slots.acquire = counted_acquire  # type: ignore[method-assign]
    limits.Slots.release = counted_release  # type: ignore[method-assign]
    job = load_job(Path(job_path))
    store = open_store(Path(store_path))
    floor_kb = proc_status_kb("VmRSS") or 0

    async def go() -> tuple[Any, float]:
        started = time.monotonic()
        outcome = await execute(job, store)
        return outcome, time.monotonic() - started

    outcome, seconds = asyncio.run(go())
    totals = outcome.stats.totals()
    store.close()
    print("LATENCY " + json.dumps({
        "status": outcome.status, "seconds": seconds, "peak_in_flight": flying["peak"], "floor_kb": floor_kb,
        "peak_kb": proc_status_kb("VmHWM") or 0, "done": totals.done, "errors": totals.errors,
        "retries": totals.retries,
    }), flush=True)


def run_child(job_path: Path, store_path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", str(job_path), str(store_path)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("LATENCY "):
            return json.loads(line.removeprefix("LATENCY "))
    raise RuntimeError(f"the runner's process printed no figures:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


async def spend_the_burst(server: SimProcess, requests: int) -> asyncio.Future[Any]:
    """Send ``requests`` (a minute's worth) from another client and return once the server admitted them all, as
    if the key had been busy elsewhere: the server's bucket is then empty and the runner meets the limit at once.
    The future resolves when their answers are in."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=3600))

    async def one(i: int) -> None:
        body = {"model": "bench", "messages": [{"role": "user", "content": f"Elsewhere {i}?"}], "max_tokens": 5}
        async with session.post(server.url + "/chat/completions", json=body,
                                headers={"Authorization": "Bearer sim"}) as response:
            await response.read()

    async def all_of_them() -> None:
        try:
            await asyncio.gather(*(one(i) for i in range(requests)))
        finally:
            await session.close()

    spending = asyncio.ensure_future(all_of_them())
    while server.stats()["received"] < requests:
        await asyncio.sleep(0.2)
    return spending


async def sampled_child(server: SimProcess, job_path: Path, store_path: Path, spent: int
                        ) -> tuple[dict[str, Any], list[tuple[float, int, int]]]:
    """The runner's figures and the server's samples, ``spent`` requests sent from elsewhere first."""
    spending = await spend_the_burst(server, spent) if spent else None
    samples: list[tuple[float, int, int]] = []
    stop = asyncio.Event()
    poller = asyncio.ensure_future(sample(server.root, samples, stop, every=0.5))
    runner = asyncio.ensure_future(asyncio.to_thread(run_child, job_path, store_path))
    if spending is not None:
        await spending
    figures = await runner
    stop.set()
    await poller
    return figures, samples


def steady_rate(samples: list[tuple[float, int, int]], latency: float, spent: int, total: int
                ) -> tuple[float, float]:
    """(answers per minute, seconds) in steady state: from one latency and SETTLE s after the runner's first answer
    (the requests the bucket saved up while that first one went alone are answered by then) to the start of the
    last wave (the answers of the last ``latency`` seconds trail off as the dataset runs out)."""
    first = next((t for t, done, _ in samples if done > spent), None)
    last = next((t for t, done, _ in samples if done >= total), samples[-1][0])
    if first is None:
        return 0.0, 0.0
    opened, closed = first + latency + SETTLE, last - latency

    def answered_at(moment: float) -> float:  # linear between the samples around ``moment``
        for (t0, d0, _), (t1, d1, _) in zip(samples, samples[1:], strict=False):
            if t0 <= moment <= t1:
                return d0 + (d1 - d0) * (moment - t0) / (t1 - t0 or 1)
        return float(samples[-1][1])

    window = closed - opened
    if window <= 1.0:
        return 0.0, window
    return (answered_at(closed) - answered_at(opened)) / window * 60.0, window


def part_limit(args: argparse.Namespace) -> None:
    for key in ("fresh", "spent") if args.key == "both" else (args.key,):
        spent = args.rpm if key == "spent" else 0
        server = SimProcess(extra=["--rpm", str(args.rpm), "--latency", str(args.latency)])
        try:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                job = write_job(folder, server.url, args.requests, {}, {})
                figures, samples = asyncio.run(sampled_child(server, job, folder / "store.sqlite", spent))
                final = server.stats()
        finally:
            server.stop()
        rate, window = steady_rate(samples, args.latency, spent, args.requests + spent)
        rss = (figures["peak_kb"] - figures["floor_kb"]) / 1024
        # with a fresh key, the fastest any client could be: the minute's burst at once, the rest at the limit, the
        # last answer one latency later
        ideal = max(0, args.requests - args.rpm) / (args.rpm / 60) + args.latency
        best = f" (the bucket allows {ideal:.0f} s at best: {ideal / figures['seconds']:.0%})" if not spent else ""
        what = "a fresh key (its minute's burst in the bucket)" if key == "fresh" else \
            "a key whose minute's burst was spent elsewhere"
        steady = f"{rate:,.0f} answers/min over {window:.0f} s of steady state = {rate / args.rpm:.1%} of the limit" \
            if window > 1.0 else "no steady state (the requests fit in what the bucket held)"
        little = args.rpm / 60 * args.latency
        print(f"limit, {what}: {args.requests:,} requests at {args.latency:g} s under {args.rpm:,} RPM (learned from "
              f"headers): {steady}; {final['by_status'].get('429', 0)} x 429 ({figures['retries']} retries); "
              f"{figures['done']:,} done, {figures['errors']} errors, {figures['status']} in "
              f"{figures['seconds']:.1f} s{best}; at most {figures['peak_in_flight']:,} in flight (Little's law: "
              f"{little:,.0f}); runner peak RSS {figures['peak_kb'] / 1024:.0f} MB ({rss:.0f} MB above its floor of "
              f"{figures['floor_kb'] / 1024:.0f} MB)")


async def plain_client(url: str, requests: int, in_flight: int) -> tuple[int, float]:
    """A plain aiohttp client: ``in_flight`` workers posting chat completions until ``requests`` are answered."""
    left = iter(range(requests))
    done = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        for i in left:
            body = {"model": "bench", "messages": [{"role": "user", "content": f"Plain question {i}?"}],
                    "temperature": 0, "max_tokens": 5}
            async with session.post(url + "/chat/completions", json=body,
                                    headers={"Authorization": "Bearer sim"}) as response:
                answer = await response.json()
            if answer.get("choices"):
                done += 1

    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(session) for _ in range(in_flight)))
    return done, time.monotonic() - started


def part_plain(args: argparse.Namespace) -> None:
    """Both clients at once, each against a server of its own: at this latency neither is busy, and side by side
    they see the same machine."""
    servers = [SimProcess(extra=["--latency", str(args.plain_latency)]) for _ in range(2)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            job = write_job(folder, servers[1].url, args.plain_requests, {}, {"max_in_flight": args.in_flight})

            async def both() -> tuple[tuple[int, float], dict[str, Any]]:
                plain = asyncio.ensure_future(plain_client(servers[0].url, args.plain_requests, args.in_flight))
                figures = await asyncio.to_thread(run_child, job, folder / "store.sqlite")
                return await plain, figures

            (done, plain_seconds), figures = asyncio.run(both())
    finally:
        for server in servers:
            server.stop()
    print(f"plain: {args.plain_requests:,} requests at {args.plain_latency:g} s, no limit, {args.in_flight} in "
          f"flight: plain aiohttp {plain_seconds:.1f} s ({done:,} answered), runner {figures['seconds']:.1f} s "
          f"({figures['done']:,} done, at most {figures['peak_in_flight']} in flight, ramping from the provider's "
          f"default, 64): "
          f"runner / plain = {figures['seconds'] / plain_seconds:.3f}")


def part_memory(args: argparse.Namespace) -> None:
    server = SimProcess(extra=["--latency", str(args.memory_latency)])
    try:
        runs = {}
        for n in (max(1, args.memory_requests // 10), args.memory_requests):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                job = write_job(folder, server.url, n, {"concurrency": n}, {})
                runs[n] = run_child(job, folder / "store.sqlite")
    finally:
        server.stop()
    (small, few), (big, many) = sorted(runs.items())
    grown_small, grown_big = few["peak_kb"] - few["floor_kb"], many["peak_kb"] - many["floor_kb"]
    per = (grown_big - grown_small) / max(1, many["peak_in_flight"] - few["peak_in_flight"])
    print(f"memory: {few['peak_in_flight']:,} in flight: +{grown_small / 1024:.0f} MB; {many['peak_in_flight']:,} in "
          f"flight: +{grown_big / 1024:.0f} MB above the runner's floor ({many['floor_kb'] / 1024:.0f} MB): "
          f"{per:.1f} kB per request in flight")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--part", choices=("limit", "plain", "memory", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="smaller sizes: about a minute in all")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rpm", type=int, default=6_000)
    parser.add_argument("--latency", type=float, default=20.0)
    parser.add_argument("--key", choices=("fresh", "spent", "both"), default="both",
                        help="limit: a fresh key, one whose minute's burst another client spent, or both")
    parser.add_argument("--plain-requests", type=int, default=20_000)
    parser.add_argument("--plain-latency", type=float, default=2.0)
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument("--memory-requests", type=int, default=2_000)
    parser.add_argument("--memory-latency", type=float, default=5.0)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rpm, args.latency = 3_000, 3_000, 10.0
        args.plain_requests, args.plain_latency, args.in_flight = 4_000, 1.0, 256
        args.memory_requests, args.memory_latency = 1_000, 3.0
    for part in ("memory", "limit", "plain") if args.part == "all" else (args.part,):
        {"limit": part_limit, "plain": part_plain, "memory": part_memory}[part](args)


if __name__ == "__main__":
    main()
