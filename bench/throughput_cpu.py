"""Phase 6 of ``bench/throughput.py``: the runner's CPU per uncached request, each run in a fresh process
(:func:`cpu_child`, started as ``bench/throughput.py --cpu-child`` with the runner of the checkout measured) that
first warms up on a small job of its own; with ``--compare``, this checkout and the other one in ABBA rounds. With
``--providers`` (sim, openai, azure-openai, anthropic, gemini, vertex), each provider's job against the same simulated
server, side by side with a bare aiohttp loop sending the same requests (:func:`aiohttp_child`, in a fresh process
too), and issue 39's target: each provider within 1.3x the lean wire's (``sim:``) CPU per request.
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
    MAX_TOKENS,
    MODEL,
    SCRIPT,
    SimProcess,
    abba,
    bare_prompt,
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


def aiohttp_child(url: str, n: int, warmup: int, concurrency: int, timeout: float) -> None:
    """Runs in the subprocess: ``warmup`` then ``n`` distinct Chat Completions requests through one aiohttp session,
    ``concurrency`` worker tasks, each answer's JSON parsed; prints one JSON line with the CPU seconds of the ``n``."""
    import asyncio

    import aiohttp

    async def send(session: aiohttp.ClientSession, count: int, tag: str) -> int:
        indices, answered = iter(range(count)), 0

        async def worker() -> None:
            nonlocal answered
            for i in indices:
                body = {"model": MODEL, "messages": [{"role": "user", "content": bare_prompt(i, tag)}],
                        "max_tokens": MAX_TOKENS, "temperature": 0}
                async with session.post(url + "/chat/completions", json=body,
                                        headers={"Authorization": "Bearer bench"}) as response:
                    answer = await response.json()
                    answered += bool(response.status == 200 and answer["choices"][0]["message"]["content"])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return answered

    async def go() -> dict[str, Any]:
        async with asyncio.timeout(timeout), aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            await send(session, max(warmup, 1), "aiohttp-warm")
            cpu0, began = time.process_time(), time.perf_counter()
            answered = await send(session, n, "aiohttp")
            return {"cpu": time.process_time() - cpu0, "seconds": time.perf_counter() - began, "answered": answered}

    print("CPU " + json.dumps(asyncio.run(go())), flush=True)


def phase_aiohttp(server: SimProcess, n: int, warmup: int, concurrency: int, timeout: float) -> dict[str, Any]:
    """The bare aiohttp loop in a fresh process: CPU seconds per request and requests/s."""
    command = [sys.executable, str(SCRIPT), "--aiohttp-child", "--url", server.url, "--n", str(n), "--warmup",
               str(warmup), "--concurrency", str(concurrency), "--timeout", str(timeout)]
    child = subprocess.run(command, capture_output=True, text=True, timeout=2 * timeout + 60)
    lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"aiohttp run: exit {child.returncode}\n{child.stderr[-3000:]}")
    data = json.loads(lines[-1].removeprefix("CPU "))
    if data["answered"] != n:
        raise SystemExit(f"aiohttp run: {data}; expected {n} answers")
    return {"cpu_ms": 1000 * data["cpu"] / n, "rps": n / data["seconds"]}


def phase_cpu(server: SimProcess, tmp: Path, code: Path, n: int, warmup: int, concurrency: int, timeout: float,
              tag: str, provider: str = "sim") -> dict[str, Any]:
    """One measured run of ``code``'s runner in a fresh process: CPU seconds per request and requests/s."""
    folder = tmp / tag
    folder.mkdir()
    jobs = []
    for name, count in (("warm", max(warmup, 1)), ("job", n)):
        dataset = folder / f"{name}.jsonl"
        write_jsonl(dataset, (distinct_row(i, f"{tag}-{name}") for i in range(count)))
        write_job(folder / f"{name}.yaml", f"bench-cpu-{name}", dataset, server.url, concurrency, folder / name,
                  provider=provider)
        jobs.append(folder / f"{name}.yaml")
    before = server.stats()
    command = [sys.executable, str(SCRIPT), "--cpu-child", "--job", str(jobs[1]), "--warm-job",
               str(jobs[0]), "--store", new_store(folder), "--timeout", str(timeout)]
    child = subprocess.run(command, cwd=code, env=child_env(code, server.url), capture_output=True, text=True,
                           timeout=2 * timeout + 60)
    lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"CPU run of {code}: exit {child.returncode}\n{child.stderr[-3000:]}")
    data = json.loads(lines[-1].removeprefix("CPU "))
    served = completed(server.stats()) - completed(before)
    if data["runner"] != str(code) or data["status"] != "completed" or data["sent"] != n or served != n + warmup \
            or count_lines(Path(data["results"])) != n:
        raise SystemExit(f"CPU run of {code} ({provider}): {data}, the server completed {served}; expected {n} + "
                         f"{warmup} requests by the runner under {code}")
    return {"cpu_ms": 1000 * data["cpu"] / n, "rps": n / data["seconds"]}


# -- phase 7: start-up, from `runner submit` to the first request ----------------------------------------


def run_cpu(args: argparse.Namespace, server: SimProcess, tmp: Path, sides: list[tuple[str, Path]],
            out: Callable[[str], None]) -> bool:
    """Phase 6: CPU per uncached request of each checkout (and each of ``--providers``), fresh processes, ABBA
    rounds; with more providers than ``sim``, the bare aiohttp loop once per round beside them."""
    providers = [part.strip() for part in args.providers.split(",") if part.strip()]
    figures: dict[tuple[str, str], list[dict[str, Any]]] = {(p, name): [] for p in providers for name, _ in sides}
    bare: list[dict[str, Any]] = []
    for r, name, code in abba(sides, args.rounds):
        for provider in providers if r % 2 else providers[::-1]:
            got = phase_cpu(server, tmp, code, args.n, args.warmup, args.concurrency, args.timeout,
                            f"cpu-{provider}-{name}-{r}", provider)
            figures[provider, name].append(got)
            out(f"   round {r} {provider} {name} ({code}): {got['cpu_ms']:.3f} ms CPU per request, {got['rps']:,.0f} "
                f"requests/s (load {os.getloadavg()[0]:.2f})")
        if providers != ["sim"] and name == sides[-1][0]:
            bare.append(phase_aiohttp(server, args.n, args.warmup, args.concurrency, args.timeout))
            out(f"   round {r} bare aiohttp: {bare[-1]['cpu_ms']:.3f} ms CPU per request, {bare[-1]['rps']:,.0f} "
                f"requests/s")
    cpu = {key: median([f["cpu_ms"] for f in runs]) for key, runs in figures.items()}
    for provider in providers:
        for name, code in sides:
            runs = figures[provider, name]
            out(f"6. CPU per uncached request, {provider} {name}: {cpu[provider, name]:.3f} ms (median of "
                f"{len(runs)}; rounds {min(f['cpu_ms'] for f in runs):.3f}-{max(f['cpu_ms'] for f in runs):.3f}; "
                f"{median([f['rps'] for f in runs]):,.0f} requests/s) [{code}]")
    if bare:
        out(f"6. CPU per request, bare aiohttp: {median([f['cpu_ms'] for f in bare]):.3f} ms (median of {len(bare)}; "
            f"{median([f['rps'] for f in bare]):,.0f} requests/s)")
    if providers != ["sim"]:
        return _provider_table(providers, sides, cpu, bare, out)
    if len(sides) < 2:
        return True
    ratios = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(figures["sim", "now"], figures["sim", "then"], strict=True)]
    ratio = cpu["sim", "now"] / cpu["sim", "then"]
    met = ratio <= 0.5
    out(f"6. CPU per request now / then:      {100 * ratio:.1f} % (rounds {100 * min(ratios):.0f}-"
        f"{100 * max(ratios):.0f} %)  target <= 50 %: {'MET' if met else 'MISSED'}")
    return met


def _provider_table(providers: list[str], sides: list[tuple[str, Path]], cpu: dict[tuple[str, str], float],
                    bare: list[dict[str, Any]], out: Callable[[str], None]) -> bool:
    """The side-by-side table (ms of CPU per request; each side's ratio to its own ``sim:``) and issue 39's target:
    every provider of this checkout within 1.3x its ``sim:``."""
    names = [name for name, _ in sides]
    out("6. | provider | " + " | ".join(f"{name} ms | {name} / sim" for name in names) + " |")
    for provider in providers:
        cells = []
        for name in names:
            base = cpu.get(("sim", name))
            cells.append(f"{cpu[provider, name]:.3f} | " + (f"{cpu[provider, name] / base:.2f}x" if base else "-"))
        out(f"6. | {provider} | " + " | ".join(cells) + " |")
    if bare:
        figure = median([f["cpu_ms"] for f in bare])
        cells = [f"{figure:.3f} | " + (f"{figure / cpu['sim', name]:.2f}x" if ("sim", name) in cpu else "-")
                 for name in names]
        out("6. | bare aiohttp | " + " | ".join(cells) + " |")
    if "sim" not in providers:
        return True
    worst = max(cpu[p, "now"] / cpu["sim", "now"] for p in providers)
    met = worst <= 1.3
    out(f"6. every provider within 1.3x sim: (now) worst {worst:.2f}x  target <= 1.3x: {'MET' if met else 'MISSED'}")
    return met
