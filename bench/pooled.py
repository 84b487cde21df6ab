#!/usr/bin/env python
"""One model served by three endpoints (``pools:``, runner/engine/pools.py): the rate they reach together, the
providers' prompt-cache reads, and a run that loses one of them.

    python bench/pooled.py [--rpm 1000] [--window 60] [--latency 0.2] [--part all|rate|cache|outage]
                           [--stall SECONDS [--stall-after 900]]

Each endpoint is a simulated server in its own process (``python -m simserver``), its RPM limit a token bucket (a
minute's worth may burst, then the limit per minute, refilled continuously), as OpenAI's and Anthropic's are. The
runner runs in this process. Three parts:

1. ``rate``: three endpoints of ``--rpm`` each (the job says so: ``providers: {sim: {rpm:}, sim:b: ..., sim:c:
   ...}``). The rate of answers of the three servers together, over ``--window`` seconds of steady state (from 5 s
   after the three bursts are spent), and the 429s over the whole run. ``--stall S`` blocks the runner's event loop
   for S seconds once, after its ``--stall-after``-th request was taken from the endpoints' buckets (while the bursts
   are on their way): what a loaded machine does by chance, on purpose (issue 38's 429s).
2. ``cache``: groups of questions sharing a 6,000-token prefix (a story), sent once to one endpoint and once to the
   pool of three: the share of input tokens the servers read from their prompt caches, each way.
3. ``outage``: three endpoints, one killed (SIGKILL) once the three bursts are spent and a fifth of the rest is
   answered. The run must complete on the other two: every task done once, one charge per request in the ledger, no
   key answered twice.

A script, not a test: its figures go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.throughput_common import SimProcess  # noqa: E402
from runner.engine.run import execute  # noqa: E402
from runner.spec.job import load_job  # noqa: E402
from runner.store import open_store  # noqa: E402

MODEL = "sim:gpt-4o"
LABELS = ("sim", "sim:b", "sim:c")
SETTLE = 5.0  # seconds after the bursts before the window opens


def stall_once(after: int, seconds: float) -> None:
    """Block the event loop for ``seconds`` once, right after the ``after``-th take from any endpoint's bucket:
    the requests taken so far reach their servers only when it runs again."""
    from runner.engine.buckets import Bucket

    take = Bucket.take
    taken = 0

    async def stalling(self: Bucket, amount: float) -> Any:
        nonlocal taken
        hold = await take(self, amount)
        taken += 1
        if taken == after:
            time.sleep(seconds)  # the stall: nothing else runs meanwhile
        return hold

    Bucket.take = stalling  # type: ignore[method-assign]


def write_job(folder: Path, urls: list[str], rows: list[dict[str, Any]], *, settings: dict[str, Any],
              user: str = "{{ question }}", pooled: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    providers = {label: {"base_url": url, **settings} for label, url in zip(LABELS, urls, strict=False)}
    job: dict[str, Any] = {
        "name": "pooled", "output_dir": str(folder / "results"), "models": [MODEL], "providers": providers,
        "params": {"temperature": 0, "max_tokens": 5}, "prices": {MODEL: {"input": 1.0, "output": 2.0}},
        "retry": {"rate_limit_attempts": 200, "max_elapsed": 3600},
        "stages": [{"name": "ask", "dataset": {"path": str(folder / "rows.jsonl"), "id": "id"},
                    "prompt": {"system": "Answer briefly.", "user": user}}]}
    if pooled:
        job["pools"] = {MODEL: {"endpoints": list(LABELS[:len(urls)])}}
    path = folder / "job.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def questions(n: int) -> list[dict[str, Any]]:
    return [{"id": f"q{i}", "question": f"Pooled question {i}: what is {i} plus one?"} for i in range(n)]


def stories(groups: int, per_group: int) -> list[dict[str, Any]]:
    """Questions about stories of 24,000 characters: 6,000 tokens by the simulated server's rule, one group each."""
    return [{"id": f"s{s}q{q}", "story": f"Story {s}. " + (f"The fox number {s} ran off to the hills. " * 700)[:24000],
             "question": f"Question {q}: where did it go?"} for s in range(groups) for q in range(per_group)]


async def sample(roots: list[str], samples: list[tuple[float, list[int], list[int]]], stop: asyncio.Event,
                 every: float = 0.5) -> None:
    """Every ``every`` seconds: (time, answers so far, 429s so far) per server, from the servers' own counters (a
    server that no longer answers keeps its last figures)."""
    last = [(0, 0)] * len(roots)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while not stop.is_set():
            for n, root in enumerate(roots):
                try:
                    async with session.get(root + "/sim/stats") as response:
                        by_status = (await response.json())["by_status"]
                    last[n] = (int(by_status.get("200", 0)), int(by_status.get("429", 0)))
                except (aiohttp.ClientError, TimeoutError):
                    pass
            samples.append((time.monotonic(), [a for a, _ in last], [b for _, b in last]))
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass


def steady_rate(samples: list[tuple[float, list[int], list[int]]], burst: int, window: float) -> float:
    """Answers per minute of all servers together over ``window`` seconds starting SETTLE s after ``burst``."""
    totals = [(t, sum(done)) for t, done, _ in samples]
    start = next((t for t, done in totals if done >= burst), None)
    if start is None:
        return 0.0
    opened, closed = start + SETTLE, start + SETTLE + window

    def answered_at(moment: float) -> float:  # linear between the samples around ``moment``
        for (t0, d0), (t1, d1) in zip(totals, totals[1:], strict=False):
            if t0 <= moment <= t1:
                return d0 + (d1 - d0) * (moment - t0) / (t1 - t0 or 1)
        return float(totals[-1][1])

    return (answered_at(closed) - answered_at(opened)) / window * 60.0


async def rate(rpm: int, window: float, latency: float) -> None:
    servers = [SimProcess(extra=["--rpm", str(rpm), "--latency", str(latency)]) for _ in LABELS]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            burst = rpm * len(servers)
            rows = burst + int((SETTLE + window + 10) * burst / 60)
            job = load_job(write_job(Path(tmp), [s.url for s in servers], questions(rows), settings={"rpm": rpm}))
            samples: list[tuple[float, list[int], list[int]]] = []
            stop = asyncio.Event()
            poller = asyncio.ensure_future(sample([s.root for s in servers], samples, stop))
            started = time.monotonic()
            outcome = await execute(job, open_store(Path(tmp) / "store.sqlite"))
            elapsed = time.monotonic() - started
            stop.set()
            await poller
            finals = [s.stats()["by_status"] for s in servers]
    finally:
        for server in servers:
            server.stop()
    answers = [int(f.get("200", 0)) for f in finals]
    limited = sum(int(f.get("429", 0)) for f in finals)
    steady = steady_rate(samples, burst, window)
    when = [f"{t - started:.1f} s: {sum(lim)}" for (t, _, lim), (_, _, was) in zip(samples[1:], samples, strict=False)
            if sum(lim) != sum(was)]
    print(f"rate: 3 endpoints of {rpm:,} RPM (latency {latency:g} s), {rows:,} requests: {steady:,.0f} RPM together "
          f"over {window:g} s of steady state ({steady / rpm:.2f}x one endpoint's limit, {steady / burst:.1%} of the "
          f"three's); {limited} x 429; answers per endpoint {', '.join(f'{a:,}' for a in answers)}; {elapsed:.1f} s; "
          f"run {outcome.status}")
    if when:
        print(f"rate: 429s so far, by when the servers counted them (s from the start): {'; '.join(when)}")


async def cache(latency: float, groups: int, per_group: int) -> None:
    shares = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pooled in (False, True):  # fresh servers each time: no prefix is cached from the other case
            servers = [SimProcess(extra=["--latency", str(latency)]) for _ in (LABELS if pooled else LABELS[:1])]
            try:
                folder = Path(tmp) / ("pool" if pooled else "one")
                path = write_job(folder, [s.url for s in servers], stories(groups, per_group),
                                 settings={"concurrency": 64}, user="{{ story }}\n\n{{ question }}", pooled=pooled)
                store = open_store(folder / "store.sqlite")
                outcome = await execute(load_job(path), store)
                hits = [int(s.stats().get("prompt_cache", {}).get("hits", 0)) for s in servers]
            finally:
                for server in servers:
                    server.stop()
            responses = store.responses()
            cached = sum(r["cached_tokens"] for r in responses)
            total = sum(r["input_tokens"] for r in responses)
            shares[pooled] = cached / total
            print(f"cache: {'pool of 3' if pooled else 'one endpoint'}: {groups} groups x {per_group} questions "
                  f"sharing a 6,000-token prefix: cache read share {cached / total:.1%} ({cached:,} of {total:,} "
                  f"input tokens); cache hits per server {hits}; run {outcome.status}")
    one, pool = shares[False], shares[True]
    print(f"cache: the pool's read share is {pool / one:.3f}x one endpoint's ({(pool - one) / one:+.1%}; "
          f"acceptance: within 5 %)")


async def outage(rpm: int, latency: float, count: int) -> None:
    servers = [SimProcess(extra=["--rpm", str(rpm), "--latency", str(latency)]) for _ in LABELS]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_job(Path(tmp), [s.url for s in servers], questions(count), settings={"rpm": rpm})
            store = open_store(Path(tmp) / "store.sqlite")
            samples: list[tuple[float, list[int], list[int]]] = []
            stop = asyncio.Event()
            poller = asyncio.ensure_future(sample([s.root for s in servers], samples, stop, every=0.1))
            run = asyncio.ensure_future(execute(load_job(path), store))
            burst = rpm * len(servers)  # the first minute's worth goes at once: kill it once it serves at its limit
            while not samples or sum(samples[-1][1]) < burst + (count - burst) // 5:
                await asyncio.sleep(0.05)
            servers[2].proc.kill()  # SIGKILL: answers in flight are lost with it
            killed_at = samples[-1][1][2]
            outcome = await run
            stop.set()
            await poller
            finals = [s.stats()["by_status"] for s in servers[:2]]
            tasks = store.tasks(outcome.run_id)
            kinds = Counter(r["kind"] for r in store.ledger(outcome.run_id))
            charged = Counter(r["key"] for r in store.ledger(outcome.run_id, "charge"))
            by_endpoint = Counter(r["endpoint"] for r in store.ledger(outcome.run_id, "charge"))
            notes = [n for n in outcome.stats.notes if "taken out" in n]
    finally:
        for server in servers:
            server.stop()
    done = sum(1 for t in tasks if t["status"] == "done")
    answered = sum(int(f.get("200", 0)) for f in finals)
    print(f"outage: {count:,} requests over 3 endpoints of {rpm:,} RPM; sim:c killed after answering {killed_at:,} "
          f"(its last count seen); run {outcome.status}: {done:,} of {len(tasks):,} tasks done, ledger {dict(kinds)}, "
          f"charges per endpoint {dict(by_endpoint)}, keys charged twice: {sum(1 for n in charged.values() if n > 1)}; "
          f"answered by the two left {answered:,} (+ {killed_at:,} = {answered + killed_at:,})")
    for note in notes:
        print(f"outage: note: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--rpm", type=int, default=1000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--groups", type=int, default=30)
    parser.add_argument("--per-group", type=int, default=20)
    parser.add_argument("--outage-requests", type=int, default=4500)
    parser.add_argument("--part", choices=["all", "rate", "cache", "outage"], default="all")
    parser.add_argument("--stall", type=float, default=0.0, help="block the event loop this long once (rate part)")
    parser.add_argument("--stall-after", type=int, default=900, help="... after this many requests were taken")
    args = parser.parse_args()
    if args.stall > 0:
        stall_once(args.stall_after, args.stall)
    if args.part in ("all", "rate"):
        asyncio.run(rate(args.rpm, args.window, args.latency))
    if args.part in ("all", "cache"):
        asyncio.run(cache(0.05, args.groups, args.per_group))
    if args.part in ("all", "outage"):
        asyncio.run(outage(args.rpm, args.latency, args.outage_requests))


if __name__ == "__main__":
    main()
