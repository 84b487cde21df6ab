"""The embedded model's OpenMP threads spinning or sleeping while they wait (runner/providers/local_llama.py,
``sleeping_openmp_threads``): one paper job slice on the embedded model under ``OMP_WAIT_POLICY`` ACTIVE and PASSIVE,
alone and beside one busy process (another program wanting a core), each in a fresh process and a fresh store.

    python bench/openmp_wait.py                      # knowno-mctest, 1 item (12 requests), both policies, both loads
    python bench/openmp_wait.py --job newterm-eval-2023 --limit 1 --no-busy
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import asyncio, sys, time
from pathlib import Path
from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import open_store
job = load_job(Path(sys.argv[1]))
job.limit, job.output_dir = int(sys.argv[2]), sys.argv[3] + "/results"
started = time.perf_counter()
outcome = asyncio.run(execute(job, open_store(sys.argv[3] + "/s.sqlite")))
assert outcome.status == "completed", outcome.message
print(f"{time.perf_counter() - started:.1f}")
"""


def timed(job: str, limit: int, policy: str) -> float:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "OMP_WAIT_POLICY": policy}
        done = subprocess.run([sys.executable, "-c", _RUN, str(ROOT / "jobs" / f"{job}.yaml"), str(limit), folder],
                              cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="knowno-mctest")
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--no-busy", action="store_true", help="only alone, without the busy process")
    args = parser.parse_args()
    print(f"job {args.job}, {args.limit} item(s), embedded model, n_threads=2, {os.cpu_count()} CPUs; "
          f"load average at the start {os.getloadavg()[0]:.2f}")
    print("| load | OMP_WAIT_POLICY | seconds |\n|---|---|---:|")
    for busy in ([False] if args.no_busy else [False, True]):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(0.5 if busy else 0)
            for policy in ("ACTIVE", "PASSIVE"):
                seconds = timed(args.job, args.limit, policy)
                print(f"| {'beside one busy process' if busy else 'alone'} | {policy} | {seconds:.1f} |", flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()


if __name__ == "__main__":
    main()
