#!/usr/bin/env python
"""Do API models keep their own pace in a job that also runs the embedded model? (issue 23, item 4)

    python bench/mixed.py [--rows 150] [--local-rows 150] [--latency 0.05] [--concurrency 4] [--rounds 3]

One stage, against ``simserver`` started in its own process on 127.0.0.1 with ``--latency`` seconds per answer:

- "sim only": two ``sim:`` models (``sim:alpha``, ``sim:beta``) over ``--rows`` rows;
- "mixed": the same two models and the embedded model (``local:smollm2``) in the same stage; ``--local-rows`` of
  the rows are fresh for the embedded model, the others are in its memo already (a stage runs every model over
  every row, so the memo is how the embedded model gets only a few dozen requests among the API models' hundreds).

The figure is the ``sim:`` models' wall time, read from the store: from the first ``sim:`` request sent (its
answer's ``created`` minus its latency, in ``responses``) to the last ``sim:`` task committed (``tasks.updated``).
Each round runs both jobs on fresh rows (nothing in the memo but the embedded model's warmed rows), in ABBA order;
the ratio mixed / sim only is printed per round and over all rounds (target: at most 1.20). The embedded model's
own seconds per request in the mixed job are printed too (what sharing the two cores with the API models costs it).

A script, not a test: pytest does not collect ``bench/``. The server subprocess is always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import throughput_common  # noqa: E402  (bench/, this script's folder)
import yaml  # noqa: E402

TARGET_RATIO = 1.20
SIM_MODELS = ("sim:alpha", "sim:beta")
LOCAL_MODEL = "local:smollm2"


class SimProcess(throughput_common.SimProcess):
    """``python -m simserver`` on a free port of 127.0.0.1, with a fixed latency."""

    def __init__(self, latency: float, timeout: float = 20.0) -> None:
        super().__init__(timeout, ["--latency", str(latency)])

    def completed(self) -> int:
        return int(self.stats()["by_status"].get("200", 0))


def write_rows(path: Path, count: int, tag: str, other_until: int = 0) -> Path:
    """``count`` distinct rows; the first ``other_until`` tagged apart (rows the memo does not have)."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            row = {"question": f"[{tag}{'-warm' if i < other_until else ''}] Question {i}: which colour is the sky?",
                   "choices": ["blue", "green", "red", "black"], "gold": 0}
            out.write(json.dumps(row) + "\n")
    return path


def write_job(path: Path, dataset: Path, models: list[str], url: str, concurrency: int) -> Path:
    job = {
        "name": path.stem,
        "output_dir": str(path.parent / "results"),
        "models": models,
        "providers": {"sim": {"base_url": url, "concurrency": concurrency}},
        "params": {"max_tokens": 5, "temperature": 0},
        "stages": [{
            "name": "mc",
            "dataset": {"path": str(dataset)},
            "prompt": {"system": "Answer with one letter.", "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
            "choices": {"seeds": [0]},
            "parse": "letter",
        }],
    }
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path


def run_job(job_path: Path, store_path: Path, timeout: float) -> str:
    """Run the job in this process (``runner.engine.run.execute``); returns its run id."""
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    job = load_job(job_path)
    store = open_store(store_path)

    async def go() -> Any:
        async with asyncio.timeout(timeout):
            return await execute(job, store)

    try:
        outcome = asyncio.run(go())
    finally:
        store.close()
    if outcome.status != "completed":
        raise SystemExit(f"{job_path.name}: run ended {outcome.status}")
    return str(outcome.run_id)


def stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def timings(store_path: Path, run_id: str) -> dict[str, Any]:
    """From the store: the sim models' wall time (first sent to last committed; 0 without them), and the embedded
    model's fresh requests and their mean latency."""
    from runner.store import open_store

    store = open_store(store_path)
    try:
        tasks = store.tasks(run_id)
        sim = [t for t in tasks if t["model"] in SIM_MODELS]
        fresh_keys = {t["key"] for t in sim if not t["cache_hit"]}
        sent = [stamp(r["created"]) - (r["latency"] or 0.0) for r in store.dicts(
            "SELECT key, created, latency FROM responses WHERE provider = 'sim'", []) if r["key"] in fresh_keys]
        local = [t for t in tasks if t["model"] == LOCAL_MODEL and not t["cache_hit"]]
    finally:
        store.close()
    if len(sent) != len(fresh_keys) or any(t["status"] != "done" for t in tasks):
        raise SystemExit(f"run {run_id}: {len(sent)} sim answers for {len(fresh_keys)} sim tasks, or a task failed")
    return {
        "sim_seconds": max(stamp(t["updated"]) for t in sim) - min(sent) if sim else 0.0,
        "sim_tasks": len(sim),
        "local_fresh": len(local),
        "local_latency": sum(t["latency"] or 0.0 for t in local) / len(local) if local else 0.0,
    }


def versions() -> str:
    import llama_cpp

    return (f"python {platform.python_version()} | llama-cpp-python {llama_cpp.__version__} | "
            f"nproc {len(os.sched_getaffinity(0))} | {platform.platform()}")


def code_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "runner"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        return f"{ROOT} (git unavailable)"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"{head} + local changes in {', '.join(changed)}" if changed else f"{head} (runner/ as committed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=150, help="rows of the stage (each sim model's requests)")
    parser.add_argument("--local-rows", type=int, default=40, help="of those, fresh for the embedded model")
    parser.add_argument("--latency", type=float, default=0.05, help="the simulated server's seconds per answer")
    parser.add_argument("--concurrency", type=int, default=4, help="the sim endpoint's concurrency")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for each run")
    args = parser.parse_args(argv)
    if not 0 < args.local_rows <= args.rows or args.rounds < 1:
        parser.error("--local-rows must be between 1 and --rows; --rounds at least 1")

    def out(text: str) -> None:
        print(text, flush=True)

    out(f"versions: {versions()}")
    out(f"code: {code_state()}; runner imported from {ROOT}")
    out(f"settings: rows={args.rows} local_rows={args.local_rows} latency={args.latency} "
        f"concurrency={args.concurrency} rounds={args.rounds} date={time.strftime('%Y-%m-%d %H:%M:%S %Z')} "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    server = SimProcess(args.latency)
    alone: list[float] = []
    mixed: list[float] = []
    local_alone: list[float] = []
    try:
        out(f"server: {server.url} (pid {server.proc.pid})")
        for r in range(1, args.rounds + 1):
            for side in ("alone", "mixed") if r % 2 else ("mixed", "alone"):
                folder = tmp / f"{side}-{r}"
                folder.mkdir()
                dataset = write_rows(folder / "rows.jsonl", args.rows, f"{side}-{r}")
                store_path = folder / "store.sqlite"
                if side == "mixed":
                    # the embedded model answers all but --local-rows of the rows first (not measured)
                    warm = write_rows(folder / "warm.jsonl", args.rows, f"{side}-{r}", args.local_rows)
                    warm_id = run_job(write_job(folder / "warm.yaml", warm, [LOCAL_MODEL], server.url,
                                                args.concurrency), store_path, args.timeout)
                    local_alone.append(timings(store_path, warm_id)["local_latency"])
                models = [LOCAL_MODEL, *SIM_MODELS] if side == "mixed" else list(SIM_MODELS)
                job_path = write_job(folder / "job.yaml", dataset, models, server.url, args.concurrency)
                before = server.completed()
                run_id = run_job(job_path, store_path, args.timeout)
                figures = timings(store_path, run_id)
                served = server.completed() - before
                (alone if side == "alone" else mixed).append(figures["sim_seconds"])
                extra = (f"; embedded model: {figures['local_fresh']} fresh requests, {figures['local_latency']:.3f} s "
                         f"each (alone, in the warm-up: {local_alone[-1]:.3f} s)" if side == "mixed" else "")
                out(f"   round {r} {side:5}: sim models {figures['sim_seconds']:6.2f} s for {figures['sim_tasks']} "
                    f"tasks (server answered {served}){extra}; load {os.getloadavg()[0]:.2f}")
            out(f"   round {r} ratio mixed / alone: {mixed[-1] / alone[-1]:.2f}")
        ratio = sum(mixed) / sum(alone)
        met = ratio <= TARGET_RATIO
        out(f"sim models' wall time: alone {sum(alone) / len(alone):.2f} s, mixed {sum(mixed) / len(mixed):.2f} s "
            f"(mean of {args.rounds} rounds); ratio {ratio:.2f} (target <= {TARGET_RATIO:.2f}: "
            f"{'met' if met else 'NOT met'})")
        return 0 if met else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
