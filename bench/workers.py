#!/usr/bin/env python
"""Several worker processes on one run (``runner work``), against the simulated server.

    python bench/workers.py [--n 6000] [--workers 1 2 4] [--rpm 10000] [--rpm-n 16000] [--store postgres]
    python bench/workers.py --ray [--n 6000] [--ray-workers 4] [--rounds 3] [--store postgres]
    python bench/workers.py --ray-nodes [--n 6000] [--workers 1 2 4] [--latency 0.2] [--store postgres]

In one run it prints:

1. for 1, 2 and 4 processes on one run of ``--n`` distinct requests (``runner submit`` plus ``runner work``
   processes, the simulated server with no latency and no limits, one shared store): requests/s from the first
   task committed to the last, and every request sent exactly once (the server's counts);
2. 4 processes on one run of ``--rpm-n`` requests against a server that allows ``--rpm`` requests per minute,
   the job configuring the same ``rpm``: the 429s the server sent (target 0), and the requests per minute the
   processes held together over the second half of the run (the server's bucket, like each process's, starts
   with a minute's allowance; by the second half it is spent and the limit's pace governs).

With ``--ray`` it prints instead (Ray installed: ``pip install 'llm-job-runner[ray]'``), on one run of ``--n``
distinct priced requests against the simulated server without latency or limits:

3. ``--ray-workers`` ``runner work`` processes (``submit`` + ``work``) against ``runner submit --ray ADDRESS
   --workers N`` (N Ray actors on a Ray this script starts once), in turn for ``--rounds`` rounds: requests/s of each
   from the first task committed to the last, their medians, and the requests the server answered more than once
   (target 0);
4. ``runner submit --ray ADDRESS --workers N`` on a Ray cluster this script starts, one actor killed
   (``ray.kill(actor, no_restart=False)``, as a crash) once a quarter of the run is committed: tasks lost (target
   0), requests charged twice in the ledger (target 0), and the requests the server answered twice, each of which
   must be one the killed process had in flight (kept as possibly billed).

With ``--ray-nodes`` it prints instead, on a Ray cluster of four nodes this script starts on 127.0.0.1 (each a raylet
of its own with one CPU: Ray's multi-node launcher, ``ray.cluster_utils.Cluster``; the tests' too,
tests/cluster/test_ray_nodes.py), against the simulated server answering after ``--latency`` seconds:

5. ``runner submit --ray ADDRESS --workers N`` for N in ``--workers`` (one actor per node): requests/s from the first
   task committed to the last, and every request sent once; then 3 workers with one node lost (its raylet and its
   processes killed) once a quarter of the run is committed: tasks lost (target 0), requests charged twice
   (target 0), the requests the server answered twice (each one the lost worker had in flight, kept as possibly
   billed).

The store is a PostgreSQL server started for the run (Debian's binaries, as the tests start it: devservers/postgres.py),
or a SQLite file with ``--store sqlite``. A script, not a test: pytest does not collect ``bench/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devservers.postgres import PgServer, find_bin  # noqa: E402
from devservers.processes import kill_tree  # noqa: E402
from runner.store import open_store  # noqa: E402


def start_sim(rpm: int | None, latency: float = 0.0) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "simserver", "--port", "0", "--latency", str(latency)]
    if rpm:
        args += ["--rpm", str(rpm)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc, line.rsplit(" ", 1)[-1].strip()


def sim_stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/stats", timeout=10) as response:
        return json.load(response)


def write_job(folder: Path, url: str, n: int, rpm: int | None, extra: str = "") -> Path:
    rows = folder / "rows.jsonl"
    with open(rows, "w", encoding="utf-8") as out:
        for i in range(n):
            out.write(json.dumps({"id": str(i), "question": f"Question {i}: which option?",
                                  "choices": ["alpha", "beta", "gamma", "delta"], "gold": i % 4}) + "\n")
    limits = f", rpm: {rpm}" if rpm else ""
    job = folder / "job.yaml"
    job.write_text(
        "name: workers-bench\nmodels: [sim:gpt-bench]\nparams: {temperature: 0, max_tokens: 5}\n"
        f"output_dir: {json.dumps(str(folder / 'results'))}\n"
        f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 64{limits}}}}}\n"
        "retry: {max_attempts: 10, backoff_initial: 0.05, backoff_max: 1, max_elapsed: 120}\n"
        f"{extra}"
        "stages:\n  - name: mc\n"
        f"    dataset: {{path: {json.dumps(str(rows))}}}\n"
        "    prompt: {user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"}\n"
        "    choices: {seeds: [0]}\n    parse: letter\n",
        encoding="utf-8")
    return job


def runner(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_with(processes: int, db: str, job: Path, folder: Path) -> str:
    """``runner submit`` and ``processes - 1`` ``runner work`` on its run; returns the run id."""
    owner = runner("submit", str(job), "--db", db, cwd=folder)
    run_id = None
    for line in owner.stdout:
        if line.startswith("run ") and "started job" in line:
            run_id = line.split()[1].rstrip(":")
            break
    assert run_id, owner.stderr.read()
    workers = [runner("work", run_id, "--db", db, cwd=folder) for _ in range(processes - 1)]
    for proc in [owner, *workers]:
        out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"{proc.args}: {err[-2000:]}"
    return run_id


#: every request priced, so the ledger charges each one (section 4 counts the charges)
PRICED = "prices: {sim:gpt-bench: {input: 1, output: 2}}\nbudget: {usd: 1000000}\n"


def run_on_ray(workers: int, db: str, job: Path, folder: Path, address: str | None = None,
               on_started=None) -> tuple[str, str]:
    """``runner submit --ray [ADDRESS] --workers N``; ``on_started(run_id)`` is called once the run is made.
    Returns the run id and the command's output."""
    args = ["submit", str(job), "--db", db, "--ray", *([address] if address else []), "--workers", str(workers)]
    proc = runner(*args, cwd=folder)
    lines = []
    run_id = None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("run ") and "started job" in line:
            run_id = line.split()[1].rstrip(":")
            if on_started is not None:
                on_started(run_id)
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0 and run_id, f"{proc.args}: {err[-2000:]}"
    return run_id, "".join(lines) + out


def twice(url: str) -> int:
    """Requests the simulated server answered more than once (the extra answers)."""
    return sum(n - 1 for n in sim_stats(url)["completed_by_digest"].values())


def ray_sections(args: argparse.Namespace, new_db, folder: Path) -> None:
    """Sections 3 and 4 (``--ray``)."""
    import atexit
    import threading

    import ray

    n, workers = args.n, args.ray_workers
    os.environ["RUNNER_LEASE_TTL"] = "8"  # every process's, the actors' too (the Ray started here passes it on)
    ray.init(num_cpus=max(workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", namespace="bench", logging_level="ERROR")
    atexit.register(ray.shutdown)
    address = ray.get_runtime_context().gcs_address
    print(f"\n3. one run of {n:,} distinct requests, simulated server without latency or limits: {workers} `runner "
          f"work` processes against {workers} Ray actors (on a Ray started once for the script), in turn, "
          f"{args.rounds} rounds; leases of 8 s (RUNNER_LEASE_TTL)")
    rates: dict[str, list[float]] = {"processes": [], "ray": []}
    for round_ in range(args.rounds):
        for label in ("processes", "ray"):
            sim, url = start_sim(None)
            try:
                job_dir = folder / f"ray3-{label}-{round_}"
                job_dir.mkdir()
                job = write_job(job_dir, url, n, None, PRICED)
                db = new_db(f"ray3-{label}-{round_}")
                started = time.monotonic()
                run_id = run_with(workers, db, job, job_dir) if label == "processes" else run_on_ray(
                    workers, db, job, job_dir, address)[0]
                wall = time.monotonic() - started
                extra = twice(url)
            finally:
                sim.terminate()
                sim.wait(timeout=10)
            tasks, seconds = span(commit_times(db, run_id))
            rates[label].append(tasks / seconds)
            what = f"{workers} runner processes" if label == "processes" else f"{workers} Ray actors     "
            print(f"   {what}: {tasks:,} tasks in {seconds:.1f} s = {tasks / seconds:,.0f} requests/s ({wall:.1f} s "
                  f"wall with start-up); requests sent twice: {extra}", flush=True)
    middle = {label: sorted(values)[len(values) // 2] for label, values in rates.items()}
    print(f"   median: processes {middle['processes']:,.0f} requests/s, Ray actors {middle['ray']:,.0f} requests/s "
          f"(Ray / processes = {middle['ray'] / middle['processes']:.2f})")

    print(f"\n4. the same with {workers} Ray actors, one killed (as a crash) once a quarter of the run is committed")
    sim, url = start_sim(None)
    try:
        job_dir = folder / "ray4"
        job_dir.mkdir()
        job = write_job(job_dir, url, n, None, PRICED)
        db = new_db("ray4")
        killed: list[str] = []

        def kill_when_a_quarter_is_done(run_id: str) -> None:
            def watch() -> None:
                store = open_store(db)
                try:
                    while len(store.tasks(run_id, status="done")) < n // 4:
                        time.sleep(0.2)
                finally:
                    store.close()
                names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                               if a["name"].startswith(f"runner-{run_id}-"))
                ray.kill(ray.get_actor(names[0], namespace="runner"), no_restart=False)
                killed.append(names[0])
            threading.Thread(target=watch, daemon=True).start()

        started = time.monotonic()
        run_id, out = run_on_ray(workers, db, job, job_dir, address, kill_when_a_quarter_is_done)
        wall = time.monotonic() - started
        extra = twice(url)
    finally:
        sim.terminate()
        sim.wait(timeout=10)
        ray.shutdown()
    store = open_store(db)
    try:
        done = len(store.tasks(run_id, status="done"))
        charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
        possibly = len(store.ledger(run_id, kind="possibly_billed"))
        states = Counter(w["state"] for w in store.workers(run_id))
    finally:
        store.close()
    stamps = commit_times(db, run_id)
    tasks, seconds = span(stamps)
    gap = max((b - a for a, b in zip(stamps, stamps[1:], strict=False)), default=0.0)
    per10 = Counter(int((t - stamps[0]) // 10) for t in stamps)
    timeline = ", ".join(str(per10.get(i, 0)) for i in range(max(per10) + 1)) if stamps else ""
    victim = killed[0] if killed else "NONE"
    print(f"   killed {victim}; {tasks:,} tasks in {seconds:.1f} s ({wall:.1f} s wall); workers on the run: "
          f"{dict(states)}; longest pause between two commits {gap:.1f} s")
    print(f"   tasks committed per 10 s: {timeline}")
    print(f"   lost: {n - done}; charged twice: {sum(1 for c in charges.values() if c > 1)}; sent twice: {extra} "
          f"(possibly billed, the killed process's requests in flight: {possibly})")


def ray_nodes_section(args: argparse.Namespace, new_db, folder: Path) -> None:
    """Section 5 (``--ray-nodes``)."""
    import threading

    os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                       "RAY_USAGE_STATS_ENABLED": "0", "RUNNER_LEASE_TTL": "8",
                       "RAY_TMPDIR": tempfile.mkdtemp(prefix="ray-")})  # a short path: Unix sockets live there
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [cluster.head_node] + [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    n, latency = args.n, args.latency
    print(f"\n5. a Ray cluster of {len(nodes)} nodes of one CPU each on 127.0.0.1; one run of {n:,} distinct priced "
          f"requests, simulated server answering in {latency} s, 64 in flight per worker; leases of 8 s")
    try:
        for workers in args.workers:
            sim, url = start_sim(None, latency)
            try:
                job_dir = folder / f"nodes{workers}"
                job_dir.mkdir()
                db = new_db(f"nodes{workers}")
                run_id, _ = run_on_ray(workers, db, write_job(job_dir, url, n, None, PRICED), job_dir,
                                       cluster.address)
                tasks, seconds = span(commit_times(db, run_id))
                extra = twice(url)
            finally:
                sim.terminate()
                sim.wait(timeout=10)
            print(f"   {workers} worker(s): {tasks:,} tasks in {seconds:.1f} s = {tasks / seconds:,.0f} requests/s "
                  f"({'each sent once' if extra == 0 else f'{extra} SENT TWICE'})")
        sim, url = start_sim(None, latency)
        lost = nodes[1].all_processes["raylet"][0].process.pid
        try:
            job_dir = folder / "nodes-lost"
            job_dir.mkdir()
            db = new_db("nodes-lost")

            def lose_a_node(run_id: str) -> None:
                def watch() -> None:
                    while done_count(db, run_id) < n // 4:
                        time.sleep(0.2)
                    kill_tree(lost)
                threading.Thread(target=watch, daemon=True).start()

            run_id, out = run_on_ray(3, db, write_job(job_dir, url, n, None, PRICED), job_dir, cluster.address,
                                     on_started=lose_a_node)
            extra = twice(url)
        finally:
            sim.terminate()
            sim.wait(timeout=10)
        store = open_store(db)
        try:
            tasks = store.tasks(run_id)
            charged = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
            possibly = len(store.ledger(run_id, kind="possibly_billed"))
        finally:
            store.close()
        missing = n - sum(1 for t in tasks if t["status"] == "done")
        print(f"   3 workers, one node lost at a quarter: {'completed' if 'completed' in out else 'NOT COMPLETED'}; "
              f"tasks lost {missing}, charged twice {sum(c - 1 for c in charged.values())}; answered twice "
              f"{extra} (possibly billed, kept for the lost worker's requests in flight: {possibly})")
    finally:
        cluster.shutdown()


def done_count(db: str, run_id: str) -> int:
    store = open_store(db)
    try:
        return sum(1 for t in store.tasks(run_id) if t["status"] == "done")
    finally:
        store.close()


def commit_times(db: str, run_id: str) -> list[float]:
    """When each task of a run was committed (epoch seconds), ascending."""
    store = open_store(db)
    try:
        return sorted(dt.datetime.fromisoformat(t["updated"].replace("Z", "+00:00")).timestamp()
                      for t in store.tasks(run_id))
    finally:
        store.close()


def span(stamps: list[float]) -> tuple[int, float]:
    """(tasks, seconds from the first task committed to the last)."""
    return len(stamps), (stamps[-1] - stamps[0]) if stamps else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rpm", type=int, default=10_000)
    parser.add_argument("--rpm-n", type=int, default=30_000)
    parser.add_argument("--rpm-workers", type=int, default=4)
    parser.add_argument("--store", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--ray", action="store_true", help="sections 3 and 4: Ray actors against runner processes")
    parser.add_argument("--ray-workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="section 3's rounds (each: processes, then Ray)")
    parser.add_argument("--ray-nodes", action="store_true", help="section 5: a Ray cluster of four nodes")
    parser.add_argument("--latency", type=float, default=0.2, help="section 5's simulated latency (seconds)")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="runner-bench-workers-"))
    server = None
    if args.store == "postgres":
        bindir = find_bin()
        if bindir is None:
            sys.exit("no PostgreSQL server binaries: install Debian's postgresql, or use --store sqlite")
        server = PgServer(bindir).start()

    def new_db(name: str) -> str:
        if server is not None:
            return server.new_database()
        path = folder / f"{name}.sqlite"
        open_store(path).close()
        return str(path)

    print(f"machine: {os.cpu_count()} cores; store: {args.store}; python {sys.version.split()[0]}")
    if args.ray or args.ray_nodes:
        try:
            (ray_nodes_section if args.ray_nodes else ray_sections)(args, new_db, folder)
        finally:
            if server is not None:
                server.stop()
        return
    try:
        print(f"\n1. one run of {args.n:,} distinct requests, simulated server without latency or limits")
        for processes in args.workers:
            sim, url = start_sim(None)
            try:
                job_dir = folder / f"w{processes}"
                job_dir.mkdir()
                job = write_job(job_dir, url, args.n, None)
                db = new_db(f"w{processes}")
                run_id = run_with(processes, db, job, job_dir)
                tasks, seconds = span(commit_times(db, run_id))
                sent = Counter(sim_stats(url)["completed_by_digest"].values())
            finally:
                sim.terminate()
                sim.wait(timeout=10)
            once = "each sent once" if set(sent) == {1} and sum(sent.values()) == args.n else f"SENT: {dict(sent)}"
            print(f"   {processes} process(es): {tasks:,} tasks in {seconds:.1f} s = {tasks / seconds:,.0f} requests/s"
                  f" ({once})")

        print(f"\n2. {args.rpm_workers} processes, one run of {args.rpm_n:,} requests, server limit {args.rpm:,} "
              "requests/min (the job sets the same rpm)")
        sim, url = start_sim(args.rpm)
        try:
            job_dir = folder / "rpm"
            job_dir.mkdir()
            job = write_job(job_dir, url, args.rpm_n, args.rpm)
            db = new_db("rpm")
            started = time.monotonic()
            run_id = run_with(args.rpm_workers, db, job, job_dir)
            wall = time.monotonic() - started
            stats = sim_stats(url)
        finally:
            sim.terminate()
            sim.wait(timeout=10)
        stamps = commit_times(db, run_id)
        tasks, seconds = span(stamps)
        limited = stats["by_status"].get("429", 0)
        half = len(stamps) // 2
        pace = (len(stamps) - 1 - half) / (stamps[-1] - stamps[half]) * 60
        allowance = args.rpm + args.rpm * seconds / 60
        print(f"   {tasks:,} tasks in {seconds:.1f} s ({wall:.1f} s wall with process start-up); 429s from the server: "
              f"{limited}")
        print(f"   second half of the run: {pace:,.0f} requests/min together (limit {args.rpm:,}); the whole run "
              f"used {tasks / allowance:.1%} of what the server allowed in that time (a minute's burst + the refill)")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
