"""Renew tests/slow_by_time.txt: the tests the fast path (``-m "not slow"``) leaves to the whole suite for their
time alone.

    python scripts/slow_by_time.py                    # run the fast path with every test in it, then write the list
    python scripts/slow_by_time.py --from run.log     # from a saved run's output (``--durations=0`` of such a run)
    python scripts/slow_by_time.py --over 1.5         # the seconds a test may take and stay (default 1.5)
    python scripts/slow_by_time.py --keep run.log     # and keep the run's output

The run is the fast path as a contributor runs it (its test processes, on this machine), with
``RUNNER_TEST_SLOW_BY_TIME=0`` so that the listed tests run too, and ``--durations=0``: a test's time is its set-up,
call and tear-down. A test over the bound is listed with its seconds; the rest of the file is rewritten. Run it on a
quiet machine (``python scripts/suite_loop.py`` prints the machine's speed) and commit the list with the figures in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tests" / "slow_by_time.txt"
#: a ``--durations`` line: "12.34s call     tests/x.py::test[id]" (pytest-xdist's ``@group`` suffix dropped)
_DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S.*?)(?:@\w+)?\s*$")

HEADER = """\
# Tests the fast path (`python -m pytest -m "not slow"`) leaves to the whole suite for their time alone: each
# took more than {over:g} s (set-up, call and tear-down) in a fast-path run on this project's 2-core machine.
# tests/conftest.py marks them `slow`; the whole suite runs them as before. Written by `python
# scripts/slow_by_time.py` (its docstring says how); renew it by running that again. Seconds, then the test's id.
"""


def seconds_per_test(output: str) -> dict[str, float]:
    """Each test's set-up + call + tear-down seconds, from a run's ``--durations=0`` lines."""
    found: dict[str, float] = defaultdict(float)
    for line in output.splitlines():
        match = _DURATION.match(line)
        if match:
            found[match.group(3)] += float(match.group(1))
    return dict(found)


def listed(path: Path = LIST) -> set[str]:
    """The test ids the list names (tests/conftest.py marks them ``slow``)."""
    if not path.exists():
        return set()
    ids = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            ids.add(line.split(None, 1)[1].strip())
    return ids


def render(times: dict[str, float], over: float) -> str:
    slow = sorted(((seconds, test) for test, seconds in times.items() if seconds > over), key=lambda p: (-p[0], p[1]))
    return HEADER.format(over=over) + "".join(f"{seconds:6.1f}  {test}\n" for seconds, test in slow)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, help="a saved run's output instead of a new run")
    parser.add_argument("--over", type=float, default=1.5, help="seconds a fast-path test may take (default 1.5)")
    parser.add_argument("--keep", type=Path, help="write the run's output here too (for --from)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.source is not None:
        output = args.source.read_text(encoding="utf-8", errors="replace")
    else:
        env = {**os.environ, "RUNNER_TEST_SLOW_BY_TIME": "0"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow",
                               "--durations=0", "--durations-min=0.5", *pytest_args], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        output = done.stdout
        if args.keep is not None:
            args.keep.write_text(output, encoding="utf-8")
        if done.returncode != 0:
            print(output[-3000:], file=sys.stderr)
            print("slow_by_time: the fast path failed; the list is left as it was", file=sys.stderr)
            return 1
    times = seconds_per_test(output)
    if not times:
        print("slow_by_time: no --durations lines in the output; the list is left as it was", file=sys.stderr)
        return 1
    LIST.write_text(render(times, args.over), encoding="utf-8")
    summary = [line for line in output.splitlines() if line.startswith("=") and " in " in line]
    if summary:
        print(f"slow_by_time: the run: {summary[-1].strip('= ')}")
    print(f"slow_by_time: {len(listed())} tests over {args.over:g} s written to {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
