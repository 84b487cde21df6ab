"""Phase 5 of ``bench/throughput.py``: the peak RSS of a ``--rows``-row streamed job (rows cycling over a few
questions, so nearly every request is a memo hit), run in a fresh process (:func:`stream_child`, started as
``bench/throughput.py --stream-child``), its rows/s and its results file's lines.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.throughput_common import (
    ROOT,
    SCRIPT,
    TARGET_RSS_MB,
    SimProcess,
    count_lines,
    cycling_row,
    proc_status_kb,
    vm_hwm_kb,
    write_job,
    write_jsonl,
)


def stream_child(job_path: Path, store_path: Path, timeout: float) -> None:
    """Runs in the subprocess: execute the job, then print one JSON line with the peak RSS."""
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    job = load_job(job_path)
    store = open_store(store_path)
    # imports, job and store: the floor under the peak
    before_kb = vm_hwm_kb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    samples: list[tuple[float, int]] = []  # (seconds into execute, VmRSS kB): does memory grow with rows?

    async def sample(started: float) -> None:
        while True:
            samples.append((time.perf_counter() - started, proc_status_kb("VmRSS") or 0))
            await asyncio.sleep(1.0)

    async def go() -> tuple[Any, float]:
        async with asyncio.timeout(timeout):
            started = time.perf_counter()
            sampler = asyncio.create_task(sample(started))
            try:
                outcome = await execute(job, store)
            finally:
                sampler.cancel()
            return outcome, time.perf_counter() - started

    outcome, seconds = asyncio.run(go())
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hwm = vm_hwm_kb()
    totals = outcome.stats.totals()
    store.close()
    print("STREAM " + json.dumps({
        "status": outcome.status, "message": outcome.message, "seconds": seconds,
        "hwm_kb_before": before_kb, "maxrss_kb": peak_kb, "vmhwm_kb": hwm,
        "done": totals.done, "cache_hits": totals.cache_hits, "sent": totals.sent, "errors": totals.errors,
        "results": {k: str(v) for k, v in (outcome.results or {}).items()},
        "rss_samples": samples,
    }), flush=True)


def run_stream(server: SimProcess, tmp: Path, rows: int, concurrency: int, timeout: float,
               out: Callable[[str], None]) -> bool:
    dataset = tmp / "stream.jsonl"
    started = time.perf_counter()
    write_jsonl(dataset, (cycling_row(i) for i in range(rows)))
    out(f"  (dataset of {rows:,} rows written in {time.perf_counter() - started:.1f} s, "
        f"{dataset.stat().st_size / 1e6:.0f} MB)")
    job_path = tmp / "stream.yaml"
    # shuffle off: every row of a question renders the same prompt, so only STREAM_QUESTIONS are sent
    write_job(job_path, "bench-stream", dataset, server.url, concurrency, tmp / "results", shuffle=False)
    store_path = tmp / "stream.sqlite"
    before = server.stats()
    command = [sys.executable, str(SCRIPT), "--stream-child", "--job", str(job_path),
               "--store", str(store_path), "--timeout", str(timeout)]
    try:
        child = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        out(f"5. streamed job: TIMED OUT after {timeout + 60:.0f} s (use a smaller --rows or a larger "
            "--stream-timeout)")
        return False
    after = server.stats()
    lines = [line for line in child.stdout.splitlines() if line.startswith("STREAM ")]
    if child.returncode != 0 or not lines:
        out(f"5. streamed job: FAILED (exit {child.returncode})\n{child.stderr[-3000:]}")
        return False
    data = json.loads(lines[-1].removeprefix("STREAM "))
    results_path = Path(next(iter(data["results"].values())))
    result_lines = count_lines(results_path)
    sent = after["received"] - before["received"]
    old_digests = before["completed_by_digest"]
    prompts = sum(1 for k, v in after["completed_by_digest"].items() if v > old_digests.get(k, 0))
    # VmHWM is this process's own high-water mark. ru_maxrss is not: Linux carries the parent's RSS at fork
    # over the exec, so a child of a large parent reports at least the parent's size. VmHWM is the figure.
    peak_mb = (data["vmhwm_kb"] or data["maxrss_kb"]) / 1024
    ok = data["status"] == "completed" and result_lines == rows and data["done"] == rows
    out(f"5. streamed job rows:                {rows:,} (status {data['status']}, done {data['done']:,}, "
        f"cache hits {data['cache_hits']:,}; the server received {sent} requests for {prompts} distinct prompts)")
    out(f"5. streamed job peak RSS (VmHWM):    {peak_mb:.1f} MB ({data['hwm_kb_before'] / 1024:.1f} MB after "
        f"imports, job and store, before execute; ru_maxrss {data['maxrss_kb'] / 1024:.1f} MB, which Linux "
        f"floors at the parent's RSS at fork)  target <= {TARGET_RSS_MB:.0f} MB: "
        f"{'MET' if peak_mb <= TARGET_RSS_MB else 'MISSED'}")
    rss = data["rss_samples"]
    if rss:
        picks = [rss[min(len(rss) - 1, round(q * (len(rss) - 1)))] for q in (0, 0.25, 0.5, 0.75, 1)]
        out("5. streamed job RSS during execute: " + ", ".join(f"{kb / 1024:.0f} MB at {t:.0f} s" for t, kb in picks)
            + f" (max sampled {max(kb for _, kb in rss) / 1024:.0f} MB)")
    out(f"5. streamed job rows/s:              {rows / data['seconds']:,.0f} ({data['seconds']:.1f} s in execute)")
    out(f"5. streamed job results file:        {result_lines:,} lines, "
        f"{results_path.stat().st_size / 1e6:.0f} MB ({'OK' if result_lines == rows else 'WRONG COUNT'}); "
        f"store {store_path.stat().st_size / 1e6:.0f} MB")
    return ok and peak_mb <= TARGET_RSS_MB


# -- phase 6: CPU per uncached request, each checkout in a fresh process ---------------------------------
