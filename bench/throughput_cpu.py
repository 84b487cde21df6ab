"""Phase 6 of ``bench/throughput.py``: the runner's CPU per uncached request, each run in a fresh process
(:func:`cpu_child`, started as ``bench/throughput.py --cpu-child`` with the runner of the checkout measured) that
first warms up on a small job of its own; with ``--compare``, this checkout and the other one in ABBA rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.throughput_common import (
    SCRIPT,
    SimProcess,
    abba,
    child_env,
    completed,
    count_lines,
    distinct_row,
    median,
    new_store,
    run_job,
    write_job,
    write_jsonl,
)


def cpu_child(job_path: Path, warm_path: Path, store_path: Path, timeout: float) -> None:
    """Runs in the subprocess: a warm-up job (imports, first-call caches), then the measured one; prints one JSON
    line with the CPU seconds of the measured ``execute`` and where ``runner`` was imported from."""
    import runner

    # a PostgreSQL store (a URL: its "//" folded by Path) takes the warm-up's run too
    run_job(warm_path, store_path if str(store_path).startswith("postgres") else store_path.with_name("warm.sqlite"),
            timeout)
    cpu0 = time.process_time()
    outcome, seconds = run_job(job_path, store_path, timeout)
    cpu = time.process_time() - cpu0
    totals = outcome.stats.totals()
    print("CPU " + json.dumps({"status": outcome.status, "seconds": seconds, "cpu": cpu, "sent": totals.sent,
                               "done": totals.done, "runner": str(Path(runner.__file__).resolve().parent.parent),
                               "results": str(next(iter((outcome.results or {}).values())))}), flush=True)


def phase_cpu(server: SimProcess, tmp: Path, code: Path, n: int, warmup: int, concurrency: int, timeout: float,
              tag: str) -> dict[str, Any]:
    """One measured run of ``code``'s runner in a fresh process: CPU seconds per request and requests/s."""
    folder = tmp / tag
    folder.mkdir()
    jobs = []
    for name, count in (("warm", max(warmup, 1)), ("job", n)):
        dataset = folder / f"{name}.jsonl"
        write_jsonl(dataset, (distinct_row(i, f"{tag}-{name}") for i in range(count)))
        write_job(folder / f"{name}.yaml", f"bench-cpu-{name}", dataset, server.url, concurrency, folder / name)
        jobs.append(folder / f"{name}.yaml")
    before = server.stats()
    command = [sys.executable, str(SCRIPT), "--cpu-child", "--job", str(jobs[1]), "--warm-job",
               str(jobs[0]), "--store", new_store(folder), "--timeout", str(timeout)]
    child = subprocess.run(command, cwd=code, env=child_env(code), capture_output=True, text=True,
                           timeout=2 * timeout + 60)
    lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"CPU run of {code}: exit {child.returncode}\n{child.stderr[-3000:]}")
    data = json.loads(lines[-1].removeprefix("CPU "))
    served = completed(server.stats()) - completed(before)
    if data["runner"] != str(code) or data["status"] != "completed" or data["sent"] != n or served != n + warmup \
            or count_lines(Path(data["results"])) != n:
        raise SystemExit(f"CPU run of {code}: {data}, the server completed {served}; expected {n} + {warmup} "
                         f"requests by the runner under {code}")
    return {"cpu_ms": 1000 * data["cpu"] / n, "rps": n / data["seconds"]}


# -- phase 7: start-up, from `runner submit` to the first request ----------------------------------------


def run_cpu(args: argparse.Namespace, server: SimProcess, tmp: Path, sides: list[tuple[str, Path]],
            out: Callable[[str], None]) -> bool:
    """Phase 6: CPU per uncached request of each checkout, fresh processes, ABBA rounds."""
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
    for r, name, code in abba(sides, args.rounds):
        got = phase_cpu(server, tmp, code, args.n, args.warmup, args.concurrency, args.timeout, f"cpu-{name}-{r}")
        figures[name].append(got)
        out(f"   round {r} {name} ({code}): {got['cpu_ms']:.3f} ms CPU per request, {got['rps']:,.0f} requests/s "
            f"(load {os.getloadavg()[0]:.2f})")
    for name, code in sides:
        cpu = [f["cpu_ms"] for f in figures[name]]
        out(f"6. CPU per uncached request, {name}: {median(cpu):.3f} ms (median of {len(cpu)}; rounds "
            f"{min(cpu):.3f}-{max(cpu):.3f}; {median([f['rps'] for f in figures[name]]):,.0f} requests/s) "
            f"[{code}]")
    if len(sides) < 2:
        return True
    ratios = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(figures["now"], figures["then"], strict=True)]
    ratio = median([f["cpu_ms"] for f in figures["now"]]) / median([f["cpu_ms"] for f in figures["then"]])
    met = ratio <= 0.5
    out(f"6. CPU per request now / then:      {100 * ratio:.1f} % (rounds {100 * min(ratios):.0f}-"
        f"{100 * max(ratios):.0f} %)  target <= 50 %: {'MET' if met else 'MISSED'}")
    return met
