#!/usr/bin/env python
"""The runner side by side with the tools it competes with (issue 39): CPU per request and requests/s, each
run in a fresh process against one simulated server (zero latency, strict), so the figures are CPU-bound.

    bash bench/contenders_setup.sh     # the Curator and LiteLLM virtualenvs, and tiktoken's cl100k_base file
    python bench/contenders.py --cookbook /tmp/contenders/api_request_parallel_processor.py \\
        --curator-python /tmp/contenders/venv-curator/bin/python \\
        --litellm-python /tmp/contenders/venv-litellm/bin/python \\
        [--n 4000] [--warmup 300] [--rounds 3] [--providers sim,openai,anthropic,gemini]

Contenders, each sending ``--warmup`` requests and then ``--n`` distinct ones (the short multiple-choice Chat
Completions requests of bench/throughput_cpu.py's bare aiohttp loop: ``bare_prompt``, ``MODEL``, ``MAX_TOKENS``,
temperature 0) with ``--concurrency`` in flight, CPU seconds measured inside the child around the measured batch:

- ``runner <provider>``: the runner's job for each of ``--providers`` (bench/throughput_cpu.py's ``phase_cpu``);
- ``aiohttp``: the bare aiohttp loop (bench/throughput_cpu.py's ``phase_aiohttp``);
- ``cookbook``: OpenAI's cookbook script examples/api_request_parallel_processor.py, from the path given (it is
  not in this repository: other projects' code is not committed here);
- ``curator``, ``litellm``: Bespoke Labs' Curator and LiteLLM's Router, each in its own virtualenv's python.

Those three run bench/contenders_children.py. A contender whose path or python is not given is skipped, with a
line saying so. Every run is checked: all its answers came back and the server completed exactly warm-up + n
requests in it (``GET /sim/stats``), so nothing was served from a cache. Rounds run the contenders in turn,
the order reversed every other round. At the end, a markdown table: each contender's median CPU per request
(and its range over the rounds), median requests/s, and its CPU per request over the runner's ``sim`` and over
bare aiohttp. A script, not a test: pytest does not collect bench/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throughput_common import (  # noqa: E402
    MAX_TOKENS,
    MODEL,
    SimProcess,
    bare_prompt,
    code_state,
    completed,
    median,
)
from bench.throughput_cpu import phase_aiohttp, phase_cpu  # noqa: E402

CHILDREN = ROOT / "bench" / "contenders_children.py"

#: a run of one contender in one round: (round, its own folder) -> {"cpu_ms", "rps", ...}
Run = Callable[[int, Path], dict[str, Any]]


def foreign(tool: str, python: str, server: SimProcess, args: argparse.Namespace, env: dict[str, str]) -> Run:
    """A run of bench/contenders_children.py's ``tool`` driver under ``python``, its prompts tagged by round."""

    def run(r: int, folder: Path) -> dict[str, Any]:
        spec = {"url": server.url, "model": MODEL, "max_tokens": MAX_TOKENS, "concurrency": args.concurrency,
                "timeout": args.timeout, "workdir": str(folder), "cookbook": str(args.cookbook),
                "warm": [bare_prompt(i, f"{tool}-warm-{r}") for i in range(args.warmup)],
                "prompts": [bare_prompt(i, f"{tool}-{r}") for i in range(args.n)]}
        (folder / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        child = subprocess.run([python, str(CHILDREN), tool, str(folder / "spec.json")], cwd=folder,
                               env={**os.environ, **env}, capture_output=True, text=True,
                               timeout=2 * args.timeout + 120)
        lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
        if child.returncode != 0 or not lines:
            raise SystemExit(f"{tool} run: exit {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-3000:]}")
        data = json.loads(lines[-1].removeprefix("CPU "))
        if data["answered"] != args.n:
            raise SystemExit(f"{tool} run: {data['answered']} answers of {args.n}")
        return {"cpu_ms": 1000 * data["cpu"] / args.n, "rps": args.n / data["seconds"], "versions": data["versions"]}

    return run


def runner(provider: str, server: SimProcess, args: argparse.Namespace) -> Run:
    """A run of the runner's job for ``provider`` (bench/throughput_cpu.py's own, which checks its answers)."""
    return lambda r, folder: phase_cpu(server, folder, ROOT, args.n, args.warmup, args.concurrency, args.timeout,
                                       f"{provider}-{r}", provider)


def contenders(args: argparse.Namespace, server: SimProcess, out: Callable[[str], None]) -> dict[str, Run]:
    """The contenders given, by name, in the order of a forward round; each one not given is named with why."""
    runs: dict[str, Run] = {}
    cache = {"TIKTOKEN_CACHE_DIR": args.tiktoken_cache}  # the cookbook and Curator count tokens with cl100k_base
    for provider in args.providers:
        runs[f"runner {provider}"] = runner(provider, server, args)
    runs["aiohttp"] = lambda r, folder: phase_aiohttp(server, args.n, args.warmup, args.concurrency, args.timeout)
    if args.cookbook is None:
        out("skipped cookbook: no --cookbook PATH (examples/api_request_parallel_processor.py of openai-cookbook)")
    else:
        runs["cookbook"] = foreign("cookbook", sys.executable, server, args, cache)
    for tool, python in (("curator", args.curator_python), ("litellm", args.litellm_python)):
        if python is None:
            out(f"skipped {tool}: no --{tool}-python (bash bench/contenders_setup.sh makes its virtualenv)")
        else:
            runs[tool] = foreign(tool, python, server, args, cache)
    return runs


def checked(name: str, run: Run, r: int, folder: Path, server: SimProcess, args: argparse.Namespace) -> dict[str, Any]:
    """One run, and proof that every request reached the server: it completed exactly warm-up + n in the run."""
    before = server.stats()
    got = run(r, folder)
    after = server.stats()
    served = completed(after) - completed(before)
    got["extra"] = (after["received"] - before["received"]) - served
    if served != args.warmup + args.n:
        raise SystemExit(f"{name}, round {r}: the server completed {served} requests; expected {args.warmup} + "
                         f"{args.n}")
    return got


def table(figures: dict[str, list[dict[str, Any]]], labels: dict[str, str], out: Callable[[str], None]) -> None:
    cpu = {name: median([f["cpu_ms"] for f in runs]) for name, runs in figures.items()}
    base, bare = cpu.get("runner sim"), cpu.get("aiohttp")
    out("| contender | version | ms CPU per request (median) | range over rounds | requests/s (median) "
        "| CPU / runner sim | CPU / bare aiohttp |")
    out("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, runs in figures.items():
        spread = f"{min(f['cpu_ms'] for f in runs):.3f}-{max(f['cpu_ms'] for f in runs):.3f}"
        ratios = [f"{cpu[name] / b:.2f}x" if b else "-" for b in (base, bare)]
        out(f"| {name} | {labels[name]} | {cpu[name]:.3f} | {spread} | {median([f['rps'] for f in runs]):,.0f} | "
            f"{ratios[0]} | {ratios[1]} |")


def labels_of(figures: dict[str, list[dict[str, Any]]], args: argparse.Namespace, code: str) -> dict[str, str]:
    """Each contender's version, as its child reported it (the runner's: ``code``, the commit measured)."""
    import aiohttp

    labels = {}
    for name, runs in figures.items():
        found = runs[0].get("versions", {})
        if name.startswith("runner"):
            labels[name] = code.split(" ")[0]
        elif name == "aiohttp":
            labels[name] = f"aiohttp {aiohttp.__version__}"
        elif name == "cookbook":
            labels[name] = f"sha256 {sha256(args.cookbook)[:12]}, aiohttp {found.get('aiohttp')}"
        else:
            tool = "bespokelabs-curator" if name == "curator" else name
            labels[name] = f"{found.get(tool)} (aiohttp {found.get('aiohttp')})"
    return labels


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4000, help="measured requests per run")
    parser.add_argument("--warmup", type=int, default=300, help="requests sent first in each run, not measured")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each batch")
    parser.add_argument("--providers", default="sim", help="the runner's providers, comma-separated")
    parser.add_argument("--cookbook", type=Path, help="a copy of openai-cookbook's api_request_parallel_processor.py")
    parser.add_argument("--curator-python", help="the python of a virtualenv with bespokelabs-curator")
    parser.add_argument("--litellm-python", help="the python of a virtualenv with litellm")
    parser.add_argument("--tiktoken-cache",
                        default=os.environ.get("TIKTOKEN_CACHE_DIR", "/tmp/contenders/tiktoken-cache"),
                        help="a folder holding tiktoken's cl100k_base file, for the cookbook and Curator")
    parser.add_argument("--only", default=None,
                        help="only these, comma-separated: runner, aiohttp, cookbook, curator, litellm")
    parser.add_argument("--tmp", default=None, help="parent folder of the temporary directory")
    args = parser.parse_args(argv)
    args.providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if args.n < 1 or args.warmup < 1 or args.rounds < 1 or args.concurrency < 1 or not args.providers:
        parser.error("--n, --warmup, --rounds and --concurrency must be at least 1, and --providers name one")
    if args.cookbook is not None and not args.cookbook.is_file():
        parser.error(f"--cookbook {args.cookbook}: no such file")

    def out(text: str) -> None:
        print(text, flush=True)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out(f"date {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load average (1/5/15 min) {load}")
    code = code_state()
    out(f"settings: n={args.n:,} warmup={args.warmup} rounds={args.rounds} concurrency={args.concurrency}; "
        f"python {platform.python_version()} ({sys.executable}); code {code}")
    if args.cookbook is not None:
        out(f"cookbook: {args.cookbook} sha256 {sha256(args.cookbook)}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-contenders-", dir=args.tmp))
    server = SimProcess()
    try:
        out(f"server: {server.url} (pid {server.proc.pid})")
        runs = contenders(args, server, out)
        if args.only is not None:
            wanted = {part.strip() for part in args.only.split(",")}
            runs = {name: run for name, run in runs.items() if name.split(" ")[0] in wanted}
        figures: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
        for r in range(1, args.rounds + 1):
            for name in list(runs) if r % 2 else list(runs)[::-1]:
                folder = tmp / f"{name.replace(' ', '-')}-{r}"
                folder.mkdir()
                got = checked(name, runs[name], r, folder, server, args)
                figures[name].append(got)
                out(f"   round {r} {name}: {got['cpu_ms']:.3f} ms CPU per request, {got['rps']:,.0f} requests/s"
                    + (f", {got['extra']} other requests" if got["extra"] else "")
                    + f" (load {os.getloadavg()[0]:.2f})")
                shutil.rmtree(folder, ignore_errors=True)
        for name, runs_ in figures.items():
            if runs_[0].get("versions"):
                out(f"versions, {name}: " + ", ".join(f"{k} {v}" for k, v in runs_[0]["versions"].items()))
        table(figures, labels_of(figures, args, code), out)
        out(f"load average at the end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        out(f"code at the end: {code_state()}")
        return 0
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
