#!/usr/bin/env python
"""Throughput and memory benchmark of the runner against the simulated server (zero latency).

    python bench/throughput.py [--n 10000] [--rows 1000000] [--concurrency 64] [--compare PATH] [--only ...]

In one run, against ``simserver`` started in its own process on 127.0.0.1, it prints:

1. the bare OpenAI SDK's requests/s (N distinct short multiple-choice requests, same concurrency bound);
2. the runner's uncached requests/s for a job of the same N requests, through spec -> plan -> dispatcher ->
   store -> results file (``runner.engine.run.execute``), checked against the server's ``/sim/stats``;
3. the ratio runner / bare SDK (target >= 70 %);
4. cache hits/s on a re-run of the same job on the same store (target >= 20,000/s), checked through
   ``runner.report.summary.build`` and the server's counters. The unchanged stage is replayed whole from the first
   run (runner/engine/replay.py), as a user's re-submit is; 4b is the same re-run with ``reuse=False`` (what
   ``--replan`` does), every request planned and looked up one by one: the path a re-run takes when the stage
   changed but most of its requests did not (a model added, a row appended);
5. peak RSS of a ``--rows``-row streamed job (rows cycling over 4 questions, so all but a handful of
   requests are served from the memo) run in a fresh subprocess (target <= 250 MB), its rows/s and the
   line count of its results file.

6. the runner's CPU per uncached request (the same job of N requests, each run in a fresh process that first
   warms up on its own small job, CPU measured around ``execute``) and, with ``--compare PATH`` (a checkout of
   another commit, e.g. ``git worktree add /tmp/wt-base HEAD~3``), the same for that checkout, run alternately
   (ABBA) with this one, and the ratio now / then (target <= 50 %, issue 25); with ``--providers`` (sim,
   sim+price, openai, azure-openai, anthropic, gemini, vertex), each provider's job side by side with a bare aiohttp
   loop, and each provider within 1.3x ``sim:`` (issue 39);
6b. (``--only wire``) each of ``--providers``' own path without the engine: ``Provider.execute`` alone, the SDK or
   the lean wire (bench/throughput_wire.py), and each within 1.3x ``sim:``'s lean wire (``--instructions``: counted
   under valgrind, requests one at a time, instead of CPU seconds);
7. start-up: seconds from starting ``runner submit JOB`` to the first request reaching the server (the model
   probe) and to the first chat request, median of ``--startup`` runs (target <= 0.5 s to the first chat request
   on a quiet machine), through a relay in front of the server that notes when requests arrive; with
   ``--compare``, alternately for both checkouts.

Phases 1, 2 and 4 run ``--rounds`` times, interleaved (ABBA), after an untimed warm-up of both paths; each
figure is the rate over all rounds (requests / summed seconds), printed with every round's own figure, because
on a small shared machine a single round is noisy.

A script, not a test: pytest does not collect ``bench/``. This file is its command line; the phases are modules of
their own: bench/throughput_rates.py (1-4), bench/throughput_stream.py (5), bench/throughput_cpu.py (6),
bench/throughput_wire.py (6b) and bench/throughput_startup.py (7), over what they share in
bench/throughput_common.py (the job writers, the server process, the meters). Every phase has a timeout; the server
subprocess is always stopped. ``--rows 0`` skips phase 5.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the phases first, from this checkout's bench/ (before CODE's folder comes first on the path)
from bench.throughput_common import SimProcess, code_state, stop_postgres, use_postgres, versions  # noqa: E402
from bench.throughput_cpu import aiohttp_child, cpu_child, run_cpu  # noqa: E402
from bench.throughput_rates import run_main  # noqa: E402
from bench.throughput_startup import run_startup  # noqa: E402
from bench.throughput_stream import stream_child  # noqa: E402
from bench.throughput_wire import run_wire, wire_child  # noqa: E402

#: the checkout whose runner a child process measures (phases 6 and 7 run the other one's with --compare); the
#: phases import the runner only inside their functions, so it comes from here
CODE = Path(os.environ.get("BENCH_CODE") or ROOT).resolve()
if sys.path[0] != str(CODE):
    sys.path.insert(0, str(CODE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="requests in phases 1, 2 and 4")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the streamed job (0 skips it)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of phases 1, 2 and 4 (interleaved, ABBA; rates over all rounds are reported)")
    parser.add_argument("--warmup", type=int, default=500, help="untimed requests through each path first")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each timed phase")
    parser.add_argument("--stream-timeout", type=float, default=1500.0, help="seconds allowed for phase 5")
    parser.add_argument("--tmp", default=None, help="parent folder of the temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--compare", type=Path, default=None, metavar="PATH",
                        help="another checkout (a git worktree of an earlier commit) measured in phases 6 and 7 "
                             "alternately with this one")
    parser.add_argument("--startup", type=int, default=5, help="runs of `runner submit` per checkout in phase 7")
    parser.add_argument("--startup-rows", type=int, default=20, help="rows of phase 7's job")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite",
                        help="each run's store in phases 1-4 and 6: a new SQLite file, or a new schema of a throwaway "
                             "PostgreSQL server on 127.0.0.1 (devservers/postgres.py)")
    parser.add_argument("--providers", default="sim",
                        help="phase 6's providers, comma-separated (sim, openai, azure-openai, anthropic, gemini, "
                             "vertex, bedrock); with more than sim, a bare aiohttp loop beside them")
    parser.add_argument("--only", default="main,cpu,startup",
                        help="the phases to run, comma-separated: main (1-5), cpu (6), wire (6b: each of --providers' "
                             "own path, without the engine), startup (7)")
    parser.add_argument("--stream-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--aiohttp-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--instructions", action="store_true",
                        help="phase 6b counts each provider's instructions per request under valgrind, requests sent "
                             "one at a time, instead of CPU seconds (bench/throughput_wire.py)")
    parser.add_argument("--wire-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--warm-job", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1 or args.concurrency < 1 or args.rows < 0 or args.warmup < 0 \
            or args.startup < 1 or args.startup_rows < 1:
        parser.error("--n, --rounds, --concurrency, --startup and --startup-rows must be at least 1; --rows and "
                     "--warmup at least 0")
    only = {part.strip() for part in args.only.split(",") if part.strip()}
    if not only or only - {"main", "cpu", "wire", "startup"}:
        parser.error("--only takes main, cpu, wire and startup, comma-separated")
    if args.compare is not None and not (args.compare / "runner" / "__init__.py").is_file():
        parser.error(f"--compare {args.compare}: no runner package there; give a checkout of the project "
                     "(git worktree add /tmp/wt-base COMMIT)")

    if args.stream_child:
        stream_child(Path(args.job), Path(args.store), args.timeout)
        return 0
    if args.cpu_child:
        cpu_child(Path(args.job), Path(args.warm_job), Path(args.store), args.timeout)
        return 0
    if args.wire_child:
        wire_child(args.providers, args.url, args.n, args.warmup, args.concurrency, args.timeout)
        return 0
    if args.aiohttp_child:
        aiohttp_child(args.url, args.n, args.warmup, args.concurrency, args.timeout)
        return 0

    def out(text: str) -> None:
        print(text, flush=True)

    n, concurrency = args.n, args.concurrency
    out(f"versions: {versions()}")
    out(f"code: {code_state()}; runner and simserver imported from {ROOT}")
    out(f"settings: n={n:,} rows={args.rows:,} concurrency={concurrency} rounds={args.rounds} "
        f"warmup={args.warmup} date={time.strftime('%Y-%m-%d %H:%M:%S %Z')} "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-throughput-", dir=args.tmp))
    server = SimProcess()
    all_met = True
    try:
        out(f"server: {server.url} (pid {server.proc.pid})")
        if args.db == "postgres":
            out(f"stores: new schemas of a throwaway PostgreSQL server, {use_postgres()}")
        if "main" in only:
            all_met &= run_main(args, server, tmp, out)
        else:
            out("1-5. skipped (--only)")
        sides = [("now", ROOT)] + ([("then", args.compare.resolve())] if args.compare is not None else [])
        if "cpu" in only:
            all_met &= run_cpu(args, server, tmp, sides, out)
        if "wire" in only:
            all_met &= run_wire(args, server, sides, out)
        if "startup" in only:
            all_met &= run_startup(args, server, tmp, sides, out)
        out(f"all targets met: {'yes' if all_met else 'no'}")
        out(f"load average at the end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        out(f"code at the end: {code_state()}")
        return 0
    finally:
        server.stop()
        stop_postgres()
        if args.keep:
            out(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
