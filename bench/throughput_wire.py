"""Phase 6b of ``bench/throughput.py`` (``--only wire``): each provider's own path alone, without the engine, in a
fresh process per run (:func:`wire_child`, ``bench/throughput.py --wire-child`` with the runner of the checkout
measured): ``--concurrency`` tasks calling ``Provider.execute`` for N distinct requests against the simulated server,
after a warm-up, CPU measured around the N. Phase 6 measures a whole run, whose engine work (the budget ledger's
reservation of a priced model's request, the store's writes) is the same whatever sends the request; this phase
measures what sends it: the SDK or the lean wire, the request built and the answer read. With ``--compare``, the
other checkout in ABBA rounds.

CPU seconds on this shared 2-core machine move by tens of percent from one round to the next (``sim:``'s own median
went from 0.21 to 0.38 ms between two runs of the bench), and the server's work on the other core moves the client's
too. ``--instructions`` counts instead what the client process executes per request, under valgrind
(``--tool=cachegrind --cache-sim=no``), which repeats from run to run: each provider's child sends its requests one
at a time (concurrency 1, so that no two runs interleave differently), once ``--n`` of them and once twice as many,
after the same warm-up; the difference of the two counts over ``--n`` is the instructions per request, the
interpreter's start, the imports and the warm-up cancelled out.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.throughput_common import (
    MAX_TOKENS,
    PROVIDER_MODELS,
    SCRIPT,
    SimProcess,
    abba,
    bare_prompt,
    child_env,
    median,
    provider_settings,
)


def wire_child(provider: str, url: str, n: int, warmup: int, concurrency: int, timeout: float) -> None:
    """Runs in the subprocess: ``warmup`` then ``n`` requests through ``provider``'s ``execute``; prints one JSON line
    with the CPU seconds of the ``n``, what sent them and where ``runner`` was imported from."""
    import asyncio

    import runner
    from runner.providers.base import ProviderSettings, provider_class

    settings = ProviderSettings.model_validate({**provider_settings(provider, url), "timeout": timeout})
    sender = provider_class(provider)(settings)
    model = PROVIDER_MODELS[provider]

    async def send(count: int, tag: str) -> int:
        indices, answered = iter(range(count)), 0

        async def worker() -> None:
            nonlocal answered
            for i in indices:
                completion = await sender.execute(model, [{"role": "user", "content": bare_prompt(i, tag)}],
                                                  {"max_tokens": MAX_TOKENS, "temperature": 0})
                answered += bool(completion.text)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return answered

    async def go() -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            await sender.start()
            try:
                await send(max(warmup, 1), f"wire-warm-{time.time()}")
                cpu0, began = time.process_time(), time.perf_counter()
                answered = await send(n, f"wire-{time.time()}")
                cpu, seconds = time.process_time() - cpu0, time.perf_counter() - began
                sent_with = sender.sent_with(model)
            finally:
                await sender.aclose()
        return {"cpu": cpu, "seconds": seconds, "answered": answered, "sent_with": sent_with,
                "runner": str(Path(runner.__file__).resolve().parent.parent)}

    print("CPU " + json.dumps(asyncio.run(go())), flush=True)


def phase_wire(server: SimProcess, code: Path, provider: str, n: int, warmup: int, concurrency: int,
               timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(SCRIPT), "--wire-child", "--providers", provider, "--url", server.url, "--n",
               str(n), "--warmup", str(warmup), "--concurrency", str(concurrency), "--timeout", str(timeout)]
    child = subprocess.run(command, cwd=code, env=child_env(code, server.url), capture_output=True, text=True,
                           timeout=2 * timeout + 60)
    lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"wire run of {provider} under {code}: exit {child.returncode}\n{child.stderr[-3000:]}")
    data = json.loads(lines[-1].removeprefix("CPU "))
    if data["runner"] != str(code) or data["answered"] != n:
        raise SystemExit(f"wire run of {provider} under {code}: {data}; expected {n} answers")
    return {"cpu_ms": 1000 * data["cpu"] / n, "rps": n / data["seconds"], "sent_with": data["sent_with"]}


def instructions_of(server: SimProcess, code: Path, provider: str, n: int, warmup: int, timeout: float) -> int:
    """Instructions the wire child executes, under valgrind, for ``warmup`` then ``n`` requests sent one at a time."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, str(SCRIPT), "--wire-child", "--providers", provider, "--url", server.url, "--n",
               str(n), "--warmup", str(warmup), "--concurrency", "1", "--timeout", str(timeout * 50)]
    # no memo of prices or of checked keys: each child looks its price up and checks Vertex's key alike, once, which
    # the difference of two children then cancels (a memo written by the first would spare the second alone)
    env = {**child_env(code, server.url), "PYTHONHASHSEED": "0", "RUNNER_PRICE_MEMO": "off", "RUNNER_KEY_MEMO": "off"}
    child = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True, timeout=timeout * 60)
    found = re.search(r"I\s+refs:\s+([\d,]+)", child.stderr)
    lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
    if child.returncode != 0 or found is None or not lines or json.loads(lines[-1][4:])["answered"] != n:
        raise SystemExit(f"wire run of {provider} under {code} under valgrind: exit {child.returncode}\n"
                         f"{child.stderr[-3000:]}")
    return int(found.group(1).replace(",", ""))


def run_wire_instructions(args: argparse.Namespace, server: SimProcess, sides: list[tuple[str, Path]],
                          out: Callable[[str], None]) -> bool:
    """Phase 6b with ``--instructions``: each provider's instructions per request in each checkout (the module's
    docstring says how), and its ratio to ``sim:``'s in the same checkout."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions runs each provider under valgrind, which is not installed: apt-get install "
                         "valgrind")
    providers = [part.strip() for part in args.providers.split(",") if part.strip() and "+" not in part]
    per: dict[tuple[str, str], float] = {}
    for name, code in sides:
        for provider in providers:
            once = instructions_of(server, code, provider, args.n, args.warmup, args.timeout)
            twice = instructions_of(server, code, provider, 2 * args.n, args.warmup, args.timeout)
            per[provider, name] = (twice - once) / args.n
            out(f"   {provider} {name}: {once:,} instructions for {args.n} requests, {twice:,} for {2 * args.n}: "
                f"{per[provider, name]:,.0f} a request")
    names = [name for name, _ in sides]
    out(f"6b. the provider alone (Provider.execute, no engine), instructions per request under valgrind, requests "
        f"one at a time ({args.n} and {2 * args.n} after {args.warmup})")
    out("6b. | provider | " + " | ".join(f"{name} instructions | {name} / sim" for name in names) + " |")
    for provider in providers:
        cells = [f"{per[provider, name]:,.0f} | "
                 + (f"{per[provider, name] / per['sim', name]:.2f}x" if ("sim", name) in per else "-")
                 for name in names]
        out(f"6b. | {provider} | " + " | ".join(cells) + " |")
    return within_target(per, providers, " in instructions", out)


def within_target(figures: dict[tuple[str, str], float], providers: list[str], measure: str,
                  out: Callable[[str], None]) -> bool:
    """Whether every provider's figure in this checkout is within 1.3x ``sim:``'s (said in one line); True without
    ``sim:`` to compare with."""
    if "sim" not in providers:
        return True
    worst = max(figures[p, "now"] / figures["sim", "now"] for p in providers)
    met = worst <= 1.3
    out(f"6b. every provider's path within 1.3x the lean wire's (sim){measure}: worst {worst:.2f}x  target <= 1.3x: "
        f"{'MET' if met else 'MISSED'}")
    return met


def run_wire(args: argparse.Namespace, server: SimProcess, sides: list[tuple[str, Path]],
             out: Callable[[str], None]) -> bool:
    """Phase 6b: each provider's ``execute`` alone, per checkout, fresh processes, ABBA rounds; the table of CPU per
    request and each provider's ratio to ``sim:`` (the lean wire) in the same checkout."""
    if getattr(args, "instructions", False):
        return run_wire_instructions(args, server, sides, out)
    providers = [part.strip() for part in args.providers.split(",") if part.strip() and "+" not in part]
    figures: dict[tuple[str, str], list[dict[str, Any]]] = {(p, name): [] for p in providers for name, _ in sides}
    for r, name, code in abba(sides, args.rounds):
        for provider in providers if r % 2 else providers[::-1]:
            got = phase_wire(server, code, provider, args.n, args.warmup, args.concurrency, args.timeout)
            figures[provider, name].append(got)
            out(f"   round {r} {provider} {name}: {got['cpu_ms']:.3f} ms CPU per request, {got['rps']:,.0f} "
                f"requests/s, sent with {got['sent_with']}")
    cpu = {key: median([f["cpu_ms"] for f in runs]) for key, runs in figures.items()}
    names = [name for name, _ in sides]
    out("6b. the provider alone (Provider.execute, no engine), ms of CPU per request, median of "
        f"{args.rounds} rounds")
    out("6b. | provider | " + " | ".join(f"{name} ms | {name} / sim | {name} sent with" for name in names) + " |")
    for provider in providers:
        cells = [f"{cpu[provider, name]:.3f} | "
                 + (f"{cpu[provider, name] / cpu['sim', name]:.2f}x" if ("sim", name) in cpu else "-")
                 + f" | {figures[provider, name][-1]['sent_with']}" for name in names]
        out(f"6b. | {provider} | " + " | ".join(cells) + " |")
    return within_target(cpu, providers, "", out)
