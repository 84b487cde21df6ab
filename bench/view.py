#!/usr/bin/env python
"""``runner view`` on a large store: the runs page and the answers pages, timed over HTTP.

    python bench/view.py                  # 100 runs, 1,000,000 result lines (building the store: about a minute)
    python bench/view.py --lines 100000   # smaller
    python bench/view.py --db big.sqlite  # keep the store (built once, reused when it exists)

Builds a SQLite store of ``--runs`` finished runs sharing ``--lines`` task rows (each with its result line, its
memo row with the request as sent, and its ledger charge), written straight into the tables, then serves it with
runner/view/app.py on 127.0.0.1 and times, over HTTP: the runs page (the HTML, first load and the median of five
more) and its JSON, a run's answers page at its first page and at its last (OFFSET), a search of one run's answers
by text, and the process's peak RSS before and after (the answers are paged: it should not grow with the store).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from runner.store import open_store  # noqa: E402
from runner.store.base import now  # noqa: E402
from runner.view.app import make_app  # noqa: E402

MODELS = ["openai:gpt-4o-mini", "anthropic:claude-3-5-haiku", "sim:alpha", "sim:beta"]


def build(path: Path, runs: int, lines: int) -> list[str]:
    """The store: ``runs`` runs of ``lines // runs`` tasks each (two stages, four models)."""
    store = open_store(path)
    per_run = lines // runs
    ids = []
    conn = store.conn
    for r in range(runs):
        job = {"name": f"bench{r % 7}", "models": MODELS, "budget": {"usd": 50}, "stages": [{"name": "mc"}]}
        run_id = store.create_run(job["name"], f"jobs/bench{r}.yaml", json.dumps(job), f"fp{r}", per_run,
                                  run_id=f"run{r:04d}")
        ids.append(run_id)
        tasks, memo, ledger = [], [], []
        for i in range(per_run):
            model, stage, key = MODELS[i % 4], ("mc", "judge")[i % 2], f"k{r:04d}-{i:07d}"
            letter = "ABCD"[(i * 7 + r) % 4]
            result = {"id": str(i // 4), "stage": stage, "model": model, "status": "done",
                      "response": f"The answer is {letter} because item {i} of run {r} says so.", "parsed": letter,
                      "answer_letter": letter, "gold": i % 4, "score": float("ABCD".index(letter) == i % 4)}
            tasks.append((run_id, stage, f"{i // 4}:{i % 4}", model, str(i // 4), None, key, "done", 0, 1, None,
                          None, 120, 5, 0.0002, 0.4, result["score"], 1, json.dumps(result), now()))
            memo.append((key, model.split(":")[0], model, json.dumps({"model": model, "messages": [
                {"role": "system", "content": "Answer with one letter."},
                {"role": "user", "content": f"Question {i}: which is right?\nA. one\nB. two\nC. three\nD. four"}]}),
                result["response"], 120, 5, 0.0002, 0.4, now()))
            ledger.append((run_id, stage, model, key, "charge", 0.0002, now()))
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO tasks (run_id, stage, item, model, row_id, variant_json, key, status, cache_hit,"
                         " attempts, error_class, error, input_tokens, output_tokens, cost, latency, score, valid,"
                         " result_json, updated) VALUES (" + ", ".join("?" * 20) + ")", tasks)
        conn.executemany("INSERT INTO responses (key, provider, model, request_json, response_text, input_tokens,"
                         " output_tokens, cost, latency, created) VALUES (" + ", ".join("?" * 10) + ")", memo)
        conn.executemany("INSERT INTO ledger (run_id, stage, model, key, kind, amount, created)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)", ledger)
        conn.execute("COMMIT")
        store.set_run(run_id, status="completed", finished=now())
    return ids


async def timed(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    start = time.perf_counter()
    async with session.get(url) as response:
        body = await response.read()
        assert response.status == 200, body[:300]
    return time.perf_counter() - start, len(body)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(path: Path, run_ids: list[str], per_run: int) -> None:
    runner = web.AppRunner(make_app(open_store(path)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    run = run_ids[len(run_ids) // 2]
    before = rss_mb()
    async with aiohttp.ClientSession() as session:
        cases = [("runs page (HTML, 50 runs)", "/"), ("runs JSON (the page's poll)", "/api/runs"),
                 ("runs page sorted by spend", "/?sort=spend"),
                 ("answers page 1 (50 answers)", f"/runs/{run}/answers"),
                 ("answers last page (OFFSET)", f"/runs/{run}/answers?offset={max(0, per_run - 50)}"),
                 ("answers search by text", f"/runs/{run}/answers?q=item+{per_run - 3}+of"),
                 ("answers JSON, 500 a page", f"/api/runs/{run}/answers?limit=500&offset={per_run // 2}")]
        print(f"{'request':<32} {'first (s)':>10} {'median of 5 (s)':>16} {'bytes':>10}")
        for name, url in cases:
            first, size = await timed(session, base + url)
            again = statistics.median([(await timed(session, base + url))[0] for _ in range(5)])
            print(f"{name:<32} {first:>10.3f} {again:>16.3f} {size:>10,}")
    print(f"peak RSS: {before:.0f} MB before the requests, {rss_mb():.0f} MB after")
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=None, help="the store to build (or reuse, when it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "view.sqlite"
        if path.exists():
            store = open_store(path)
            run_ids = sorted(r for (r,) in store.rows("SELECT id FROM runs"))
            per_run = int(store.row("SELECT count(*) FROM tasks WHERE run_id = ?", (run_ids[0],))[0])
            print(f"reusing {path}: {len(run_ids)} runs, {per_run:,} result lines each")
        else:
            start = time.perf_counter()
            run_ids = build(path, args.runs, args.lines)
            per_run = args.lines // args.runs
            print(f"built {path}: {args.runs} runs × {per_run:,} result lines in {time.perf_counter() - start:.0f} s, "
                  f"{path.stat().st_size / 2**20:,.0f} MB")
        asyncio.run(measure(path, run_ids, per_run))


if __name__ == "__main__":
    main()
