#!/usr/bin/env python
"""How much of a budget a budgeted run spends before it stops, with the exact input counts of the providers' count
endpoints (runner/engine/exact_counts.py) and with the byte bound (issue 37, item 2):

    python bench/budget_fill.py [--runs 20] [--rows 150] [--latency 0]

For ``anthropic:claude-haiku-4-5`` and ``gemini:gemini-2.0-flash``, ``--runs`` budgeted runs each against the
simulated server, started in this process (``simserver.start_server``), which answers the count endpoints by the
rule it bills prompt tokens with. Run ``i`` draws from ``random.Random(i)``: ``--rows`` prompts of 10 to 300 words
(one in ten in Japanese, where the byte bound is furthest from the count), the budget (USD 40 to 80, at prices of
USD 3,000 / 15,000 per million input / output tokens, so that a request costs about a dollar), the concurrency (1,
4, 16 or 64) and ``max_tokens`` (8 to 24). Each run is made twice in fresh stores: with counting (the default) and
with ``count_tokens: false`` (the byte bound, as before). A run stops when its next request's worst case no longer
fits, so what it leaves unspent is below one request's worst case: the exact count's, or the bound's.

Printed: per run, the budget, the spend as a % of it with exact counts and with the bound, the requests each sent
and the count requests the server answered; then per model the lowest, median and highest %, and the acceptance
(every run with exact counts at 95 % of its budget or more, and none over 100 %).

A script, not a test: pytest does not collect ``bench/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("anthropic:claude-haiku-4-5", "gemini:gemini-2.0-flash")
KEYS = {"anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
PRICES = {"input": 3000.0, "output": 15000.0}
GOAL = 0.95
_WORDS = ("alpha", "beta", "gamma", "delta", "budget", "token", "count", "question", "answer", "reason")
_KANA = "新しい言葉を一つ説明してください。"


def prompts(rng: random.Random, n: int) -> list[str]:
    rows = []
    for i in range(n):
        if rng.random() < 0.1:
            rows.append(f"{i}: " + _KANA * rng.randint(2, 30))
        else:
            rows.append(f"{i}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 300))) + "?")
    return rows


def write_job(folder: Path, url: str, model: str, rows: list[str], *, usd: float, count: bool, concurrency: int,
              max_tokens: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": q}, ensure_ascii=False) + "\n" for q in rows),
                       encoding="utf-8")
    provider = model.split(":")[0]
    job: dict[str, Any] = {
        "name": "budget-fill", "output_dir": str(folder / "results"), "models": [model],
        "providers": {provider: {"base_url": url, "concurrency": concurrency, "timeout": 30, "count_tokens": count}},
        "params": {"temperature": 0, "max_tokens": max_tokens}, "prices": {model: PRICES}, "budget": {"usd": usd},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)},
                    "prompt": {"system": "Answer in a few words.", "user": "{{ question }}"}}],
    }
    path = folder / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


async def one_run(server: Any, folder: Path, model: str, rows: list[str], *, usd: float, count: bool,
                  concurrency: int, max_tokens: int) -> tuple[float, int, int, str]:
    """(the spend as a share of the budget, requests sent, count requests answered, the run's status)."""
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    server.reset()
    path = write_job(folder, server.root_url, model, rows, usd=usd, count=count, concurrency=concurrency,
                     max_tokens=max_tokens)
    store = open_store(folder / "store.sqlite")
    try:
        outcome = await execute(load_job(path), store)
        spent = sum(row["amount"] for row in store.ledger(outcome.run_id, kind="charge"))
    finally:
        store.close()
    stats = server.stats()
    counted = len(stats.get("count_tokens", {}).get("by_digest", {}))
    return spent / usd, stats["received"], counted, outcome.status


async def main(args: argparse.Namespace) -> int:
    from simserver import SimConfig, start_server

    for variable in KEYS.values():
        os.environ.setdefault(variable, "bench-key")
    started = time.perf_counter()
    failed = False
    async with await start_server(SimConfig(latency=args.latency)) as server:
        with tempfile.TemporaryDirectory(prefix="budget-fill-") as tmp:
            for model in MODELS:
                print(f"{model}: spend as % of the budget, {args.runs} runs of {args.rows} prompts each")
                print(f"{'run':>3} {'budget':>8} {'conc':>4} {'max_t':>5} {'exact %':>8} {'bound %':>8} "
                      f"{'sent exact':>10} {'sent bound':>10} {'counted':>7}")
                fills: dict[bool, list[float]] = {True: [], False: []}
                for run in range(args.runs):
                    rng = random.Random(run)
                    rows = prompts(rng, args.rows)
                    usd = round(rng.uniform(40, 80), 2)
                    concurrency = rng.choice([1, 4, 16, 64])
                    max_tokens = rng.randint(8, 24)
                    figures = {}
                    for count in (True, False):
                        folder = Path(tmp) / model.replace(":", "-") / f"{run}-{count}"
                        figures[count] = await one_run(server, folder, model, rows, usd=usd, count=count,
                                                       concurrency=concurrency, max_tokens=max_tokens)
                        fills[count].append(figures[count][0])
                        if figures[count][3] != "budget_exhausted":
                            print(f"    run {run}: {figures[count][3]} (the budget was not exhausted)")
                    (exact, sent_e, counted, _), (bound, sent_b, _, _) = figures[True], figures[False]
                    print(f"{run:>3} {usd:>8.2f} {concurrency:>4} {max_tokens:>5} {100 * exact:>8.1f} "
                          f"{100 * bound:>8.1f} {sent_e:>10} {sent_b:>10} {counted:>7}")
                for count, label in ((True, "exact"), (False, "bound")):
                    values = fills[count]
                    median = statistics.median(values)
                    print(f"  {label}: lowest {100 * min(values):.1f} %, median {100 * median:.1f} %, "
                          f"highest {100 * max(values):.1f} %")
                ok = min(fills[True]) >= GOAL and max(fills[True]) <= 1 + 1e-9
                failed |= not ok
                print(f"  acceptance (exact: every run >= {100 * GOAL:.0f} % and <= 100 %): {'PASS' if ok else 'FAIL'}")
    print(f"wall {time.perf_counter() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rows", type=int, default=150)
    parser.add_argument("--latency", type=float, default=0.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
