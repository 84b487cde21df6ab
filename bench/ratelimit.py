#!/usr/bin/env python
"""How close the runner gets to a server's request limit, and how many 429s it collects on the way.

    python bench/ratelimit.py [--rpm 600] [--window 30] [--latency 0.02]

The simulated server runs in its own process with an RPM limit enforced as a token bucket (the way
OpenAI and Anthropic do: a full minute's worth may burst, then the limit per minute, refilled
continuously) and sends OpenAI's rate-limit headers. Two cases, each against a fresh server:

1. ``unconfigured``: the job sets no limits. The runner starts with an adaptive concurrency, learns the
   limit from the first response's headers and paces itself from then on.
2. ``configured``: the job sets ``rpm:`` to the server's value.

For each it prints the rate achieved over ``--window`` seconds of steady state (which starts once the
initial burst of one minute's worth of requests is spent, plus 5 s), that rate over the limit, and the
number of 429s over the whole run (the burst included). A script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from bench.throughput_common import SimProcess  # noqa: E402
from runner.engine.run import execute  # noqa: E402
from runner.spec.job import load_job  # noqa: E402
from runner.store import open_store  # noqa: E402

SETTLE = 5.0  # seconds after the burst before the window opens


def write_job(folder: Path, url: str, rows: int, rpm: int | None) -> Path:
    dataset = folder / "rows.jsonl"
    with open(dataset, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"question": f"Rate-limit question {i}?"}) + "\n")
    settings: dict[str, object] = {"base_url": url}
    if rpm:
        settings["rpm"] = rpm
    job = {
        "name": "ratelimit", "output_dir": str(folder / "results"), "models": ["sim:bench"],
        "providers": {"sim": settings}, "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"rate_limit_attempts": 200, "max_elapsed": 3600},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path


async def sample(root: str, samples: list[tuple[float, int, int]], stop: asyncio.Event, every: float = 0.25) -> None:
    """Every ``every`` seconds: (time, answers so far, 429s so far) from the server's own counters."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(root + "/sim/stats") as response:
                stats = await response.json()
            by_status = stats["by_status"]
            samples.append((time.monotonic(), int(by_status.get("200", 0)), int(by_status.get("429", 0))))
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass


def steady_rate(samples: list[tuple[float, int, int]], burst: int, window: float) -> float:
    """Answers per minute over ``window`` seconds starting SETTLE s after the burst was spent."""
    start = next((t for t, done, _ in samples if done >= burst), None)
    if start is None:
        return 0.0
    opened, closed = start + SETTLE, start + SETTLE + window

    def answered_at(moment: float) -> float:  # linear between the samples around ``moment``
        for (t0, d0, _), (t1, d1, _) in zip(samples, samples[1:], strict=False):
            if t0 <= moment <= t1:
                return d0 + (d1 - d0) * (moment - t0) / (t1 - t0 or 1)
        return float(samples[-1][1])

    return (answered_at(closed) - answered_at(opened)) / window * 60.0


async def one_case(name: str, rpm: int, window: float, latency: float) -> dict[str, float]:
    server = SimProcess(extra=["--rpm", str(rpm), "--latency", str(latency)])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            rows = rpm + int((SETTLE + window + 5) * rpm / 60)
            job = load_job(write_job(folder, server.url, rows, rpm if name == "configured" else None))
            samples: list[tuple[float, int, int]] = []
            stop = asyncio.Event()
            poller = asyncio.ensure_future(sample(server.root, samples, stop))
            started = time.monotonic()
            outcome = await execute(job, open_store(folder / "store.sqlite"))
            elapsed = time.monotonic() - started
            stop.set()
            await poller
            final = server.stats()
    finally:
        server.stop()
    rate = steady_rate(samples, rpm, window)
    return {"rate": rate, "ratio": rate / rpm, "429s": float(final["by_status"].get("429", 0)),
            "answers": float(final["by_status"].get("200", 0)), "seconds": elapsed,
            "ok": float(outcome.status == "completed")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--latency", type=float, default=0.02)
    args = parser.parse_args()
    print(f"server limit {args.rpm} RPM (token bucket), latency {args.latency:g} s, "
          f"steady-state window {args.window:g} s")
    for name in ("unconfigured", "configured"):
        figures = asyncio.run(one_case(name, args.rpm, args.window, args.latency))
        print(f"{name:>13}: {figures['rate']:7.1f} req/min in steady state = {figures['ratio']:6.1%} of the limit; "
              f"{int(figures['429s'])} × 429 over {int(figures['answers'])} answers in {figures['seconds']:.1f} s"
              f"{'' if figures['ok'] else ' (run did not complete)'}")


if __name__ == "__main__":
    main()
