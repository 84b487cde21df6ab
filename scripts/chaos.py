"""Seeded fault simulation: ``python scripts/chaos.py --seeds N`` runs seeds 0..N-1 (``--first S`` to start
elsewhere), ``--seed K`` one seed again, exactly as drawn. Each seed draws a run and its faults (faultsim/draw.py), runs
it with real runner processes against the simulated server to its end with resumes (faultsim/run.py), and checks the
guarantee table against the server's own log (faultsim/checks.py). A seed that breaks a guarantee prints itself and the
command that replays it. At the end: seeds run, faults done per kind, violations per guarantee; exit 1 on any
violation.

``--break fencing`` runs every runner process with fencing switched off (devservers/launchers.py), to show the
simulation catches a broken guarantee. PostgreSQL seeds need Debian's postgresql binaries (devservers/postgres.py)
and are skipped, and said, without them; the full results disk needs root (a tmpfs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devservers import launchers  # noqa: E402
from faultsim.draw import KINDS  # noqa: E402
from faultsim.report import Totals  # noqa: E402
from faultsim.run import Env, Sim  # noqa: E402
from faultsim.seeds import run_seed  # noqa: E402

BROKEN = {"fencing": launchers.WITHOUT_FENCING}


def start_sim() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "simserver", "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if "listening on" not in line:
        raise SystemExit(f"the simulated server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seeds", type=int, help="run this many seeds")
    which.add_argument("--seed", type=int, help="run this one seed again")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds (default 0)")
    parser.add_argument("--only", choices=("sqlite", "postgres", "online", "batch", "workers", *KINDS),
                        help="run only the seeds whose draw is of this kind or has this fault (the others are counted"
                             " as passed over)")
    parser.add_argument("--break", dest="broken", choices=sorted(BROKEN), help="switch a guarantee off")
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first seed that breaks a guarantee")
    parser.add_argument("--workdir", type=Path, help="where each seed's files go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the totals and each seed's verdict here")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="runner-chaos-"))
    sim_proc, sim_url = start_sim()
    pg = None
    try:
        from devservers import postgres

        pg = postgres.start_server()
        env = Env(ROOT, sys.executable, Sim(sim_url), workdir, pg, (BROKEN[args.broken],) if args.broken else ())
        totals = Totals()
        started = time.monotonic()
        print(f"chaos: {len(seeds)} seed(s) from {seeds[0]}, files in {workdir}"
              + (f", {args.broken} broken" if args.broken else "")
              + ("" if pg else "; no PostgreSQL here: its seeds are skipped"), flush=True)
        for seed in seeds:
            verdict = run_seed(seed, env, only=args.only)
            totals.add(verdict)
            print(verdict.line(), flush=True)
            if verdict.violations:
                print(verdict.details(), flush=True)
                if args.stop_at_first:
                    break
        print(totals.table(time.monotonic() - started), flush=True)
        if args.json:
            args.json.write_text(json.dumps(totals.to_dict(), indent=1), encoding="utf-8")
        return 1 if totals.violated else 0
    finally:
        if pg is not None:
            pg.stop()
        sim_proc.terminate()
        sim_proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
