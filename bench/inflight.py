#!/usr/bin/env python
"""100,000 requests in flight at once through the lean wire: one run, several runner processes, several servers
(issue 39 item 5).

    python bench/inflight.py [--requests 100000] [--processes 6] [--latency 200] [--concurrency 3250]

One process cannot hold 100,000 requests in flight here: each holds a socket on both sides of HTTP/1.1, and a
process may open at most ``ulimit -Hn`` files (20,000 on this machine, and raising it is refused). So the run is
split as a user would split it on one machine: ``--processes`` runner processes given the same ``runner submit
--run-id`` (the first creates the run, the others join it as workers, runner/engine/workers.py), over one SQLite
store, and the model is served by as many simulated servers in a pool (``pools:``, runner/engine/pools.py), each in
its own process, each answering after ``--latency`` seconds. Each runner process keeps at most ``--concurrency``
requests in flight per endpoint, so ``processes x servers x concurrency`` bounds the whole.

While it runs, every half second, it samples the servers' requests being answered (``GET /sim/in_flight``: what is
really in flight, counted where it arrives) and each runner process's RSS (``/proc/PID/status``). It prints the
most requests in flight at once, the runner processes' RSS together at that moment and at their peak, their RSS
when only the first requests were out (the floor: interpreter, imports, the plan), and the memory per request in
flight from those.

Why the latency is not 20 s: to hold N requests in flight at latency L, they must all be sent within L (Little's
law: N / L requests a second). 100,000 in 20 s is 5,000 a second, and on 2 cores, shared by the runners and the
servers, the runner sends about 1,500 a second. Memory per request in flight does not depend on how long the answer
takes, so the latency is set long enough for the whole run to be in flight at once.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throughput_common import SimProcess  # noqa: E402

MODEL = "sim:bench"
#: the pool's endpoint labels: ``sim`` and ``sim:NAME`` entries of the job's providers
LABELS = ["sim", *(f"sim:{c}" for c in "bcdefghijk")]


def write_job(folder: Path, urls: list[str], requests: int, concurrency: int) -> Path:
    dataset = folder / "rows.jsonl"
    with open(dataset, "w", encoding="utf-8") as out:
        for i in range(requests):
            out.write(json.dumps({"id": f"q{i}", "question": f"In flight question {i}?"}) + "\n")
    labels = LABELS[:len(urls)]
    job = {
        "name": "inflight", "output_dir": str(folder / "results"), "models": [MODEL],
        "providers": {label: {"base_url": url, "concurrency": concurrency, "timeout": 1800}
                      for label, url in zip(labels, urls, strict=True)},
        "pools": {MODEL: {"endpoints": labels}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_elapsed": 7200},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset), "id": "id"},
                    "prompt": {"user": "{{ question }}"}}],
    }
    path = folder / "job.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def create_run(job_path: Path, store_path: Path) -> None:
    """The run ``inflight`` of the job, for the runner processes to join."""
    from runner import service
    from runner.spec.job import load_job
    from runner.store import open_store

    store = open_store(store_path)
    try:
        service.open_shared_run(load_job(job_path), store, "inflight")
    finally:
        store.close()


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def in_flight(server: SimProcess) -> int:
    with urllib.request.urlopen(server.root + "/sim/in_flight", timeout=30) as response:
        return int(json.loads(response.read())["in_flight"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--processes", type=int, default=6, help="runner processes on the run")
    parser.add_argument("--servers", type=int, default=6, help="simulated servers in the model's pool")
    parser.add_argument("--latency", type=float, default=200.0, help="seconds each answer takes")
    parser.add_argument("--concurrency", type=int, default=3_250,
                        help="requests in flight per endpoint per runner process")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    if args.servers > len(LABELS):
        raise SystemExit(f"--servers: at most {len(LABELS)}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"open files per process: soft {soft}, hard {hard}; runner processes {args.processes}, servers "
          f"{args.servers}, {args.concurrency} in flight per endpoint per process (at most "
          f"{args.processes * args.servers * args.concurrency:,} together); {args.requests:,} requests answered after "
          f"{args.latency:g} s; load average {os.getloadavg()[0]:.2f}", flush=True)
    servers = [SimProcess(extra=["--latency", str(args.latency)]) for _ in range(args.servers)]
    runners: list[subprocess.Popen[str]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            job = write_job(folder, [s.url for s in servers], args.requests, args.concurrency)
            store_path = folder / "store.sqlite"
            create_run(job, store_path)
            # all at once, as the tasks of a Slurm array start, on the run made above (as `runner submit --ray`
            # makes it before its actors join): each takes a lease of 64 requests at a time while others are live,
            # so the run's requests spread over all of them. (A worker alone on a run takes its endpoints' lines
            # in whole chunks, up to 4,096 a line: the first of several processes given the same `runner submit
            # --run-id` keeps that lead, and its line waits for its own answers while the others have room.)
            command = [sys.executable, "-c", "import sys; from runner.cli import main; sys.exit(main())",
                       "work", "inflight", "--db", str(store_path)]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            for i in range(args.processes):
                runners.append(subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                                stdout=open(folder / f"runner-{i}.log", "w"),  # noqa: SIM115
                                                stderr=subprocess.STDOUT))
            figures = watch(servers, runners, args)
            for i, runner in enumerate(runners):
                log = (folder / f"runner-{i}.log").read_text()
                if runner.returncode != 0:
                    raise SystemExit(f"runner process {i} exited {runner.returncode}:\n{log[-3000:]}")
            last = [line for i in range(len(runners)) for line in (folder / f"runner-{i}.log").read_text().splitlines()
                    if line.startswith("run inflight:") and "joining" not in line][:1]
            shares = [next((line for line in (folder / f"runner-{i}.log").read_text().splitlines()
                            if line.startswith("this worker:")), "?") for i in range(len(runners))]
            stats = [s.stats() for s in servers]
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
        for server in servers:
            server.stop()
    answered = sum(s["by_status"].get("200", 0) for s in stats)
    received = sum(s["received"] for s in stats)
    peak, rss_at_peak, rss_peak, floor = figures["peak"], figures["rss_at_peak"], figures["rss_peak"], figures["floor"]
    per = (rss_at_peak - floor) / max(1, peak - figures["floor_in_flight"])
    print(f"servers: {received:,} requests received, {answered:,} answered 200 ({args.requests:,} asked); "
          f"the run: {' | '.join(last)}")
    for i, share in enumerate(shares):
        print(f"   runner process {i}: {share}")
    print(f"in flight: at most {peak:,} at once (the servers' count), {figures['seconds']:.0f} s in all")
    print(f"memory: the {args.processes} runner processes' RSS together: {floor / 1024:,.0f} MB with "
          f"{figures['floor_in_flight']} in flight (the floor), {rss_at_peak / 1024:,.0f} MB with {peak:,} in flight, "
          f"{rss_peak / 1024:,.0f} MB at most; {per:.1f} kB per request in flight")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def watch(servers: list[SimProcess], runners: list[subprocess.Popen[str]], args: argparse.Namespace
          ) -> dict[str, Any]:
    """Sample until every runner process has exited: the servers' requests in flight and the runners' RSS."""
    started = time.monotonic()
    peak = rss_at_peak = rss_peak = 0
    floor = floor_in_flight = None
    last_print = 0.0
    while any(r.poll() is None for r in runners):
        if time.monotonic() - started > args.timeout:
            raise SystemExit(f"the run took more than {args.timeout:g} s")
        flying = sum(in_flight(s) for s in servers)
        rss = sum(rss_kb(r.pid) for r in runners if r.poll() is None)
        if floor is None and flying and len([r for r in runners if r.poll() is None]) == len(runners) and \
                time.monotonic() - started > 5:
            # the first requests went alone (one per endpoint and process): what is held besides requests
            floor, floor_in_flight = rss, flying
        rss_peak = max(rss_peak, rss)
        if flying > peak:
            peak, rss_at_peak = flying, rss
        now = time.monotonic() - started
        if now - last_print >= 10:
            last_print = now
            print(f"   {now:5.0f} s: {flying:,} in flight, runners' RSS {rss / 1024:,.0f} MB", flush=True)
        time.sleep(0.5)
    return {"peak": peak, "rss_at_peak": rss_at_peak, "rss_peak": rss_peak, "floor": floor or 0,
            "floor_in_flight": floor_in_flight or 0, "seconds": time.monotonic() - started}


if __name__ == "__main__":
    main()
