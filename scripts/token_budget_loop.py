"""One token budget, three worker processes, many runs: how close each run came to its budget, and whether any went
over it (issue 35 item 3's acceptance: a token budget with three workers on PostgreSQL never overshoots, 20 runs).

    python scripts/token_budget_loop.py                       # 20 runs on PostgreSQL (devservers/postgres.py)
    python scripts/token_budget_loop.py --runs 5 --store sqlite

Each run: a fresh store (a new PostgreSQL schema, or a new SQLite file), a fresh simulated server (``python -m
simserver``, 50 ms a request), and ``runner submit JOB --allow-partial`` plus two ``runner work RUN`` on its run, the
job's model free (``sim:``, unpriced) so only ``budget: {tokens: N}`` stops it. Prints per run the tokens spent (the
ledger's charges and possibly billed tokens), the budget, the tokens the tasks sent used, the server's answers and
each process's share of them, and a summary; exits 1 when a run spent more than its budget, left a reservation open,
had a process that sent nothing, or its figures disagree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devservers.postgres import start_server  # noqa: E402
from runner.store import open_store  # noqa: E402


def start_sim(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "simserver", "--port", "0", "--latency", str(latency)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        raise SystemExit(f"the simulated server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def answered(url: str) -> int:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/stats", timeout=10) as response:
        return sum(json.load(response)["completed_by_digest"].values())


def write_job(folder: Path, url: str, rows: int, budget: int, concurrency: int) -> Path:
    data = folder / "rows.jsonl"
    with open(data, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"id": str(i), "question": f"Question {i}: which option?",
                                  "choices": ["alpha", "beta", "gamma", "delta"], "gold": i % 4}) + "\n")
    job = folder / "job.yaml"
    job.write_text(
        "name: token-budget-loop\nmodels: [sim:gpt-sim]\nparams: {temperature: 0, max_tokens: 5}\n"
        f"output_dir: {json.dumps(str(folder / 'results'))}\n"
        f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}}}}}\n"
        f"budget: {{tokens: {budget}}}\n"
        "stages:\n  - name: mc\n"
        f"    dataset: {{path: {json.dumps(str(data))}}}\n"
        "    prompt: {system: Answer with one letter., user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"}\n"
        "    choices: {seeds: [0], gold: gold}\n    parse: letter\n",
        encoding="utf-8")
    return job


def worst_tokens(job: Path) -> int:
    """The largest worst case in tokens of the job's requests (input tokens bound + max_tokens), as the reserver
    computes it."""
    from runner.engine.reserver import input_tokens
    from runner.plan.stage import StagePlan
    from runner.providers.tokens import bound_call_tokens
    from runner.spec.job import load_job

    loaded = load_job(job)
    return max(bound_call_tokens(t.call.provider, t.call.model_name, t.call.messages, t.call.pairs,
                                 counted=input_tokens(t)) + int(t.call.params["max_tokens"])
               for t in StagePlan(loaded, loaded.stages[0]))


def runner(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def one_run(db: str, job: Path, folder: Path, workers: int) -> tuple[str, list[int], list[int], str]:
    """``runner submit`` and ``workers - 1`` ``runner work`` on its run: (run id, exit codes, requests each ``runner
    work`` sent by its own count, the last error)."""
    owner = runner("submit", str(job), "--db", db, "--allow-partial", "--no-check", cwd=folder)
    run_id = None
    assert owner.stdout is not None
    for line in owner.stdout:
        if line.startswith("run ") and "started job" in line:
            run_id = line.split()[1].rstrip(":")
            break
    if run_id is None:
        raise SystemExit(f"no run started: {owner.communicate()[1][-2000:]}")
    others = [runner("work", run_id, "--db", db, cwd=folder) for _ in range(workers - 1)]
    codes, sent, last = [], [], ""
    for proc in [owner, *others]:
        out, err = proc.communicate(timeout=600)
        codes.append(proc.returncode)
        if proc is not owner:
            sent.append(int(out.split("this worker: ", 1)[1].split(" sent", 1)[0]) if "this worker: " in out else -1)
        if proc.returncode not in (0, 3):
            last = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
    return run_id, codes, sent, last


def figures(db: str, run_id: str) -> dict[str, int]:
    store = open_store(db)
    try:
        ledger = store.ledger(run_id)
        tasks = store.tasks(run_id)
        (summed,) = store.row("SELECT tokens FROM budget_use WHERE run_id = ? AND scope = 'run'", (run_id,))
        return {
            "spent": sum(row["tokens"] for row in ledger if row["kind"] in ("charge", "possibly_billed")),
            "reserved": sum(1 for row in ledger if row["kind"] == "reserved"),
            "sent_tokens": sum(t["input_tokens"] + t["output_tokens"] for t in tasks if not t["cache_hit"]),
            "done": sum(1 for t in tasks if t["status"] == "done"),
            "summed": int(summed or 0),
            "workers": len(store.workers(run_id)),
        }
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--workers", type=int, default=3, help="processes on each run (submit + work)")
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--budget", type=int, default=8000, help="the run's token budget")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight per process")
    parser.add_argument("--latency", type=float, default=0.05, help="the simulated server's seconds a request")
    args = parser.parse_args()

    server = start_server() if args.store == "postgres" else None
    if args.store == "postgres" and server is None:
        raise SystemExit("PostgreSQL's server binaries are not installed (Debian's postgresql package)")
    overshoots = failures = 0
    ratios: list[float] = []
    worst = 0
    try:
        with tempfile.TemporaryDirectory(prefix="token-budget-loop-") as tmp:
            print(f"{args.runs} runs of {args.rows} requests, budget {args.budget:,} tokens, {args.workers} processes "
                  f"on each run ({args.concurrency} in flight each), store {args.store}", flush=True)
            for n in range(1, args.runs + 1):
                folder = Path(tmp) / f"run{n}"
                folder.mkdir()
                db = server.new_schema() if server is not None else str(folder / "store.sqlite")
                if server is None:
                    open_store(db).close()
                sim, url = start_sim(args.latency)
                started = time.monotonic()
                try:
                    job = write_job(folder, url, args.rows, args.budget, args.concurrency)
                    worst = worst or worst_tokens(job)
                    run_id, codes, sent, error = one_run(db, job, folder, args.workers)
                    served = answered(url)
                finally:
                    sim.terminate()
                    sim.wait(timeout=10)
                seconds = time.monotonic() - started
                got = figures(db, run_id)
                over = got["spent"] > args.budget
                overshoots += over
                agree = got["spent"] == got["sent_tokens"] == got["summed"] and got["done"] == served
                shares = [got["done"] - sum(sent), *sent]  # the owner's: what the others did not send
                bad = (over or error or got["reserved"] or not agree or got["workers"] != args.workers
                       or min(shares) <= 0)
                failures += bool(bad)
                ratios.append(got["spent"] / args.budget)
                print(f"run {n:2}: spent {got['spent']:,} of {args.budget:,} tokens ({100 * ratios[-1]:.1f} %),"
                      f" over: {'YES' if over else 'no'}; tasks' tokens {got['sent_tokens']:,}, store's sum"
                      f" {got['summed']:,}; {got['done']} answered (server {served}), by process {shares};"
                      f" exit codes {codes}; open reservations {got['reserved']}; {seconds:.1f} s"
                      + (f"; error: {error}" if error else "") + ("" if agree else "; FIGURES DISAGREE"), flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"\n{args.runs} runs: {overshoots} overshoots; spent of budget min {100 * min(ratios):.1f} %, median"
          f" {100 * statistics.median(ratios):.1f} %, max {100 * max(ratios):.1f} %; a request's worst case"
          f" {worst} tokens; {failures} runs with a problem")
    return 1 if overshoots or failures else 0


if __name__ == "__main__":
    sys.exit(main())
