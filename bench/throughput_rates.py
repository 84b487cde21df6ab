"""Phases 1-4 of ``bench/throughput.py`` (with phase 5 at their end, :mod:`bench.throughput_stream`): the bare
OpenAI SDK's requests/s, the runner's uncached requests/s for the same requests and their ratio, and cache hits/s
on a re-run (the stage replayed whole, and planned one by one), in ABBA rounds after an untimed warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.throughput_common import (
    MAX_TOKENS,
    MODEL,
    TARGET_HITS_PER_S,
    TARGET_RATIO,
    Meter,
    SimProcess,
    bare_prompt,
    completed,
    count_lines,
    distinct_row,
    median,
    new_store,
    report_totals,
    run_job,
    write_job,
    write_jsonl,
)
from bench.throughput_stream import run_stream

if TYPE_CHECKING:
    import openai


# -- phase 1: the bare SDK ------------------------------------------------------------------------------

async def bare_sdk(url: str, n: int, concurrency: int, timeout: float, tag: str) -> tuple[int, float]:
    """N distinct requests through the SDK alone, ``concurrency`` worker tasks; returns (answers, seconds)."""
    import openai

    indices = iter(range(n))
    answered = 0

    async def worker(client: openai.AsyncOpenAI) -> None:
        nonlocal answered
        for i in indices:
            response = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": bare_prompt(i, tag)}],
                max_tokens=MAX_TOKENS, temperature=0,
            )
            if response.choices and response.choices[0].message.content:
                answered += 1

    async with asyncio.timeout(timeout):
        started = time.perf_counter()
        client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0,
                                    http_client=openai.DefaultAioHttpClient())
        try:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        finally:
            await client.close()
        return answered, time.perf_counter() - started


# -- phases 2 and 4: the runner -------------------------------------------------------------------------


def phase_bare(server: SimProcess, n: int, concurrency: int, timeout: float, tag: str) -> tuple[float, Meter]:
    before = server.stats()
    with Meter(server) as m:
        answered, seconds = asyncio.run(bare_sdk(server.url, n, concurrency, timeout, tag))
    served = completed(server.stats()) - completed(before)
    if answered != n or served != n:
        raise SystemExit(f"bare SDK: {answered} answers, server completed {served}; expected {n}")
    return seconds, m


# -- phases 2 and 4: the runner -------------------------------------------------------------------------

def phase_runner(server: SimProcess, tmp: Path, n: int, concurrency: int, timeout: float,
                 tag: str) -> tuple[float, Meter, Path, Path, int]:
    """A fresh job and store under ``tmp/tag``; returns (seconds, meter, job, store, result lines)."""
    folder = tmp / tag
    folder.mkdir()
    dataset = folder / "rows.jsonl"
    write_jsonl(dataset, (distinct_row(i, tag) for i in range(n)))
    job_path = folder / "job.yaml"
    write_job(job_path, "bench-throughput", dataset, server.url, concurrency, folder / "results")
    store_path = new_store(folder)
    before = server.stats()
    with Meter(server) as m:
        outcome, seconds = run_job(job_path, store_path, timeout)
    after = server.stats()
    received = after["received"] - before["received"]
    served = completed(after) - completed(before)
    result_lines = count_lines(next(iter((outcome.results or {}).values())))
    if outcome.status != "completed" or received != n or served != n or result_lines != n:
        raise SystemExit(f"runner: status {outcome.status} ({outcome.message}), server received {received}, "
                         f"completed {served}, results lines {result_lines}; expected {n}")
    return seconds, m, job_path, store_path, result_lines


def phase_hits(server: SimProcess, job_path: Path, store_path: Path, n: int, timeout: float,
               reuse: bool = True) -> tuple[float, Meter]:
    before = server.stats()
    with Meter(server) as m:
        outcome, seconds = run_job(job_path, store_path, timeout, reuse)
    received = server.stats()["received"] - before["received"]
    totals = report_totals(store_path, outcome.run_id)
    if outcome.status != "completed" or totals["cache_hits"] != n or totals["done"] != n or received != 0:
        raise SystemExit(f"re-run: status {outcome.status}, report cache_hits {totals['cache_hits']}, "
                         f"server received {received}; expected {n} hits and no request")
    return seconds, m


# -- phases 1-5 in rounds -------------------------------------------------------------------------------

def run_main(args: argparse.Namespace, server: SimProcess, tmp: Path, out: Callable[[str], None]) -> bool:
    """Phases 1-5."""
    n, concurrency = args.n, args.concurrency
    all_met = True
    if args.warmup > 0:
        # first calls pay for lazy imports and caches in the SDK, pydantic and jinja2: not measured
        phase_bare(server, args.warmup, concurrency, args.timeout, "warmup-bare")
        phase_runner(server, tmp, args.warmup, concurrency, args.timeout, "warmup-runner")
        out(f"warm-up: {args.warmup} requests through the bare SDK and {args.warmup} through the runner")

    bare_rps: list[float] = []
    runner_rps: list[float] = []
    hits_rps: list[float] = []
    planned_rps: list[float] = []

    def load() -> str:
        return f"load {os.getloadavg()[0]:.2f}"

    for r in range(1, args.rounds + 1):
        # ABBA order: odd rounds measure the bare SDK first, even rounds the runner first, so a slow drift
        # in background load does not favour one side
        for side in ("bare", "runner") if r % 2 else ("runner", "bare"):
            if side == "bare":
                seconds, m = phase_bare(server, n, concurrency, args.timeout, f"bare-{r}")
                bare_rps.append(n / seconds)
                out(f"   round {r} bare SDK:   {n / seconds:8,.0f} requests/s ({n:,} in {seconds:.2f} s; "
                    f"CPU: bench {m.cpu:.1f} s, server {m.server_cpu:.1f} s; {load()})")
                continue
            seconds, m, job_path, store_path, lines = phase_runner(server, tmp, n, concurrency, args.timeout,
                                                                   f"runner-{r}")
            runner_rps.append(n / seconds)
            out(f"   round {r} runner:     {n / seconds:8,.0f} requests/s ({n:,} in {seconds:.2f} s; status "
                f"completed, server completed {n:,}, {lines:,} result lines; "
                f"CPU: bench {m.cpu:.1f} s, server {m.server_cpu:.1f} s; {load()})")
            seconds, m = phase_hits(server, job_path, store_path, n, args.timeout)
            hits_rps.append(n / seconds)
            out(f"   round {r} cache hits: {n / seconds:8,.0f} hits/s ({n:,} in {seconds:.2f} s; report "
                f"cache_hits {n:,}, server received 0; CPU: bench {m.cpu:.1f} s; {load()})")
            seconds, m = phase_hits(server, job_path, store_path, n, args.timeout, reuse=False)
            planned_rps.append(n / seconds)
            out(f"   round {r} hits, planned one by one: {n / seconds:8,.0f} hits/s ({n:,} in {seconds:.2f} s; "
                f"report cache_hits {n:,}, server received 0; CPU: bench {m.cpu:.1f} s; {load()})")

    # Each figure is requests over the seconds summed over all rounds (the rate of one long interleaved
    # run); the median and range of the rounds show the noise.
    total = n * args.rounds

    def overall(rates: list[float]) -> float:
        return total / sum(n / rate for rate in rates)

    def spread(rates: list[float]) -> str:
        return f"median {median(rates):,.0f}, rounds {min(rates):,.0f}-{max(rates):,.0f}"

    bare, runner, hits = overall(bare_rps), overall(runner_rps), overall(hits_rps)
    out(f"1. bare SDK requests/s:              {bare:,.0f} ({total:,} requests in {args.rounds} rounds; "
        f"{spread(bare_rps)})")
    out(f"2. runner uncached requests/s:       {runner:,.0f} ({total:,} requests in {args.rounds} rounds; "
        f"{spread(runner_rps)}; every run completed, the server counted {n:,} completions each)")
    ratio = runner / bare
    ratios = [x / b for x, b in zip(runner_rps, bare_rps, strict=True)]
    met = ratio >= TARGET_RATIO
    all_met &= met
    out(f"3. runner / bare SDK:                {100 * ratio:.1f} % (median of the rounds' ratios "
        f"{100 * median(ratios):.1f} %, rounds {100 * min(ratios):.0f}-{100 * max(ratios):.0f} %)  "
        f"target >= {100 * TARGET_RATIO:.0f} %: {'MET' if met else 'MISSED'}")
    met = hits >= TARGET_HITS_PER_S
    all_met &= met
    out(f"4. cache hits/s (re-run):            {hits:,.0f} ({spread(hits_rps)}; each re-run: report "
        f"cache_hits == {n:,}, server received 0; the unchanged stage replayed whole)  "
        f"target >= {TARGET_HITS_PER_S:,.0f}/s: {'MET' if met else 'MISSED'}")
    out(f"4b. cache hits/s, planned one by one: {overall(planned_rps):,.0f} ({spread(planned_rps)}; "
        "reuse=False, as `--replan`: every request planned, looked up, parsed and recorded)")

    if args.rows > 0:
        all_met &= run_stream(server, tmp, args.rows, concurrency, args.stream_timeout, out)
    else:
        out("5. streamed job: skipped (--rows 0)")
    return all_met
