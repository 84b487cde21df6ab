"""Run the test suite again and again and count the failures: a test that fails now and then shows up here.

    python scripts/suite_loop.py --full 5 --fast 20          # the README's command 5 times, then -m "not slow" 20 times
    python scripts/suite_loop.py --fast 3 -- tests/engine     # extra pytest arguments after --
    python scripts/suite_loop.py --full 10 --hogs 3 -- -n0 tests/engine/test_workers.py -k stopped_inside
                                                              # with 3 processes spinning on the CPU throughout

Each run is a fresh ``python -m pytest`` in this checkout (its own temporary folders, its own PostgreSQL server);
the output of every run is kept in ``--logs`` (default: a new temporary folder). Prints one line per run (seconds,
passed, failed, the failed tests' ids) and a summary; exits 1 when any run failed.

The machine's speed is printed first and last (:func:`machine_speed`): the same commit's suite took 638 s one day
and 960 s on another day's machine, so a suite time is read beside the speed it was measured at.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SUMMARY = re.compile(r"^=+ (.*) in ([\d.]+)s", re.MULTILINE)
_COUNT = re.compile(r"(\d+) (passed|failed|error|errors|skipped|xfailed|xpassed|deselected)")
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def one_run(label: str, args: list[str], log: Path) -> tuple[bool, float, str]:
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfE", *args], cwd=ROOT,
                               stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    text = log.read_text(encoding="utf-8", errors="replace")
    found = _SUMMARY.findall(text)
    counts = dict((kind, int(n)) for n, kind in _COUNT.findall(found[-1][0])) if found else {}
    failed = sorted(set(_FAILED.findall(text)))
    line = (f"{label}: exit {code}, {seconds:.0f} s, {counts.get('passed', 0)} passed, "
            f"{counts.get('failed', 0) + counts.get('error', 0) + counts.get('errors', 0)} failed"
            + (f": {', '.join(failed)}" if failed else "") + f" (log {log})")
    return code == 0, seconds, line


def machine_speed() -> str:
    """This machine's speed, in two figures that change with it and not with the code: the CPU seconds of a fixed
    pure-Python loop in this process, and of ``import runner.cli`` in a new one (what every `runner` process a test
    starts pays first), each the best of three."""
    def loop() -> float:
        started = time.process_time()
        total = 0
        for i in range(5_000_000):
            total += i & 7
        return time.process_time() - started

    # compiled once into the folder the suite keeps bytecode in (tests/conftest.py), as the suite's processes are
    env = {**os.environ, "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX") or str(
        Path(tempfile.gettempdir()) / f"llm-job-runner-pycache-{os.getuid()}")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def cli_import() -> float:
        code = "import os, runner.cli; t = os.times(); print(t.user + t.system)"
        return float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                                    check=True).stdout)

    cli_import()  # compiled, if it was not
    return (f"machine: a 5,000,000-step Python loop {min(loop() for _ in range(3)):.2f} s of CPU, "
            f"`import runner.cli` {min(cli_import() for _ in range(3)):.2f} s of CPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", type=int, default=0, help="runs of the whole suite (the README's command)")
    parser.add_argument("--fast", type=int, default=0, help='runs of the fast path (-m "not slow")')
    parser.add_argument("--logs", type=Path, default=None, help="folder for each run's output")
    parser.add_argument("--hogs", type=int, default=0, help="processes that spin on the CPU while the runs go")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="suite-loop-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; logs in {logs}", flush=True)
    print(machine_speed(), flush=True)
    plan = [("full", i, []) for i in range(1, args.full + 1)]
    plan += [("fast", i, ["-m", "not slow"]) for i in range(1, args.fast + 1)]
    results: dict[str, list[tuple[bool, float]]] = {"full": [], "fast": []}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    if hogs:
        print(f"{len(hogs)} processes spinning on the CPU", flush=True)
    try:
        for kind, number, extra in plan:
            ok, seconds, line = one_run(f"{kind} {number}", [*extra, *args.pytest_args],
                                        logs / f"{kind}-{number}.log")
            results[kind].append((ok, seconds))
            print(line, flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for kind, runs in results.items():
        if runs:
            times = sorted(seconds for _, seconds in runs)
            print(f"{kind}: {len(runs)} runs, {sum(not ok for ok, _ in runs)} failed; seconds min {times[0]:.0f}, "
                  f"median {times[len(times) // 2]:.0f}, max {times[-1]:.0f}")
    print(machine_speed(), flush=True)
    return 0 if all(ok for runs in results.values() for ok, _ in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
