"""One seed run to its end: real ``runner submit`` / ``runner work`` / ``runner resume`` processes against the
simulated server (in its own process) and a store, its faults done by a scheduler at their moments, then resumes
until the run has ended (completed, or stopped by its budget), within a bound.

The scheduler polls every 50 ms: the simulated server's request log (the run's progress in answers billed), the
processes, and the faults due. Faults come from :mod:`devservers.faults`, :mod:`devservers.launchers` and
:mod:`devservers.postgres`, the same helpers the tests use.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devservers import faults, launchers
from faultsim.draw import Fault, Scenario
from faultsim.jobfile import HANG_SECONDS, write_job

__all__ = ["MAX_RESUMES", "Env", "Record", "Sim", "SeedRun"]

#: resumes after which a run that has not ended is a violation
MAX_RESUMES = 6
#: seconds a seed may take in all before it is stopped and reported
SEED_DEADLINE = 300.0
#: the lease of the tests (RUNNER_LEASE_TTL's floor): a stopped worker is taken over in seconds
LEASE_TTL = "4"
#: seconds a stopped worker stays stopped at most (its chunks are taken over sooner)
STOP_AT_MOST = 40.0
#: a run's statuses that end it
ENDED = ("completed", "budget_exhausted")
#: seconds the simulated server may take to answer a control route: its first Anthropic request imports the
#: Anthropic SDK's request types for the strict checks (3 s of CPU, in its event loop), which on a loaded 2-core
#: machine held a log read past 10 s (a whole-suite run with other tests beside it)
CONTROL_TIMEOUT = 60.0


class Sim:
    """The simulated server's control routes (its own process, started by the caller)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = url.removesuffix("/v1")

    def post(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(self.root + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT) as answer:
            return json.load(answer)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.root + path, timeout=CONTROL_TIMEOUT) as answer:
            return json.load(answer)

    def fresh(self, **config: Any) -> None:
        """Every knob at its default with ``config`` over it, counters, batches and log emptied, once the requests of
        an earlier seed have ended."""
        from simserver import SimConfig

        deadline = time.monotonic() + HANG_SECONDS + 5
        while self.get("/sim/in_flight")["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        import dataclasses

        self.post("/sim/config", {**dataclasses.asdict(SimConfig()), **config})
        self.post("/sim/reset", {})


@dataclass
class Env:
    """What every seed shares."""

    root: Path  #: the project's root, on every process's PYTHONPATH
    python: str
    sim: Sim
    workdir: Path
    pg: Any = None  #: a devservers.postgres.PgServer, or None when PostgreSQL is not installed
    patches: tuple[str, ...] = ()  #: launcher patches every runner process runs under (a broken guarantee)


@dataclass
class Record:
    """What happened in one seed's run."""

    run_id: str
    db: str
    results: Path
    injected: Counter = field(default_factory=Counter)  #: faults done, by kind
    not_reached: list[str] = field(default_factory=list)  #: faults whose moment never came (the run ended first)
    skipped: list[str] = field(default_factory=list)  #: faults this machine cannot do, and why
    resumes: int = 0
    status: str = ""
    unfinished: str | None = None  #: why the run did not end within the bounds
    in_flight_at_faults: int = 0  #: requests the server was answering when a process was killed or stopped
    exits: list[tuple[str, int]] = field(default_factory=list)  #: each process's command and exit code
    problems: list[str] = field(default_factory=list)  #: a traceback or an unexpected error in a process's stderr
    log: list[dict] = field(default_factory=list)  #: the simulated server's request log


class SeedRun:
    def __init__(self, scenario: Scenario, env: Env) -> None:
        self.scenario, self.env = scenario, env
        self.folder = env.workdir / f"seed-{scenario.seed}"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.owner: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.stopped: tuple[subprocess.Popen, float] | None = None
        self.windows: list[tuple[float, str]] = []  #: (when it ends, knob) of server faults on
        self.filler: Path | None = None
        self.mounted = False
        self.started = 0.0

    # -- set-up -----------------------------------------------------------------------------------------
    def prepare(self) -> Record:
        s, env = self.scenario, self.env
        if self.folder.exists():
            faults.unmount(self.folder / "results")
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        results = self.folder / "results"
        record = Record(f"chaos-{s.seed}" if s.named else "", "", results)
        if s.backend == "postgres":
            record.db = env.pg.new_schema()
        else:
            record.db = str(self.folder / "store.sqlite")
        from runner.store import open_store

        open_store(record.db).close()  # migrated before any process opens it
        if any(f.kind == "disk_full" for f in s.faults):
            why_not = faults.mount_tmpfs(results, "8m")
            if why_not is None:
                self.mounted = True
            else:
                record.skipped.append(f"disk_full: cannot mount a tmpfs here ({why_not})")
        env.sim.fresh(latency=s.latency, seed=s.seed, log_requests=True, batch_delay=s.batch_delay,
                      hang_seconds=HANG_SECONDS)
        self.job = write_job(self.folder, s, env.sim.url, results)
        self.record = record
        return record

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(self.env.root), "RUNNER_LEASE_TTL": LEASE_TTL,
               "RUNNER_PROGRESS_INTERVAL": "60", "COLUMNS": "120", "OPENAI_API_KEY": "chaos-key",
               "ANTHROPIC_API_KEY": "chaos-key"}
        env.pop("RUNNER_DB", None)
        return env

    def _start(self, *args: str, patches: tuple[str, ...] = ()) -> subprocess.Popen:
        n = len(self.procs)
        patches = (*self.env.patches, *patches)
        command = [self.env.python, "-c", launchers.launcher(*patches)] if patches else \
            [self.env.python, "-m", "runner.cli"]
        with open(self.folder / f"p{n}.out", "wb") as out, open(self.folder / f"p{n}.err", "wb") as err:
            proc = subprocess.Popen([*command, *args, "--db", self.record.db], cwd=self.folder, env=self._env(),
                                    stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append((args[0], proc))
        return proc

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> Record:
        s, record = self.scenario, self.record
        kinds = {f.kind for f in s.faults}
        first = tuple(patch for kind, patch in (("kill_after_accept", launchers.KILLED_AFTER_SUBMIT),
                                                ("batch_refused", launchers.REFUSED_INPUT_FILE)) if kind in kinds)
        pending = [f for f in s.faults if f.kind not in ("kill_after_accept", "batch_refused")
                   and not (f.kind == "disk_full" and not self.mounted)]
        self.started = time.monotonic()
        named = ("--run-id", record.run_id) if s.named else ()
        self.owner = self._start("submit", str(self.job), *named, "--allow-partial", "--no-check", patches=first)
        answers = 0
        try:
            while True:
                answers = self._read_log(answers)
                if len(self.workers) < s.workers - 1 and self._status() not in ("not made", "unknown"):
                    self.workers += [self._start("work", record.run_id) for _ in range(s.workers - 1)]
                progress = answers if s.trigger == "answers" else time.monotonic() - self.started
                for fault in [f for f in pending if progress >= f.at]:
                    if self._do(fault):
                        pending.remove(fault)
                self._tend()
                if all(proc.poll() is not None for _, proc in self.procs):
                    self._all_exited()
                    record.status = self._status()
                    if record.status in ENDED:
                        break
                    if record.resumes >= MAX_RESUMES:
                        record.unfinished = f"status {record.status} after {record.resumes} resumes"
                        break
                    record.resumes += 1
                    if self._run_id():
                        self.owner = self._start("resume", record.run_id)
                    else:  # killed before the run was made: made again
                        self.owner = self._start("submit", str(self.job), *named, "--allow-partial", "--no-check")
                if time.monotonic() - self.started > SEED_DEADLINE:
                    record.unfinished = (f"still {self._status()} after {SEED_DEADLINE:g} s: processes "
                                         + ", ".join(f"{name} {p.pid}" for name, p in self.procs if p.poll() is None))
                    break
                time.sleep(0.05)
        finally:
            self._end_all()
        record.not_reached = [f.describe(s.trigger) for f in pending]
        self._after(kinds)
        record.log = self.env.sim.get("/sim/log")["entries"]
        (self.folder / "sim-log.json").write_text(json.dumps(record.log), encoding="utf-8")  # for a post-mortem
        return record

    def _read_log(self, answers: int) -> int:
        """The billed answers of the run so far (online requests and batch lines)."""
        new = self.env.sim.get(f"/sim/log?after={len(self.record.log)}")["entries"]
        self.record.log.extend(new)
        return answers + sum(1 for e in new if e.get("billed"))

    def _do(self, fault: Fault) -> bool:
        """Do ``fault`` now if it can be; False to try again at the next turn (its process is not running yet)."""
        sim, record = self.env.sim, self.record
        kind = fault.kind
        if kind in ("kill_submitter", "kill_worker", "stop_worker"):
            victim = self.owner if kind == "kill_submitter" else \
                (self.workers[int(fault.arg) - 1] if len(self.workers) >= fault.arg else None)
            if victim is None or victim.poll() is not None or (kind == "stop_worker" and self.stopped):
                return False
            if kind == "stop_worker" and not self._leases_of(victim.pid):
                return False  # stopped holding nothing, it would lose nothing: stopped once it works on the run
            record.in_flight_at_faults += sim.get("/sim/in_flight")["in_flight"]
            if kind == "stop_worker":
                try:
                    faults.stop_between_writes(record.db, victim)
                except TimeoutError as exc:
                    record.skipped.append(f"stop_worker: {exc}")
                    return True
                self.stopped = (victim, time.monotonic())
            else:
                victim.send_signal(signal.SIGKILL)
        elif fault.knob is not None:
            sim.post("/sim/config", {fault.knob: fault.arg})
            self.windows.append((time.monotonic() + fault.lasts, fault.knob))
        elif kind == "db_restart":
            self.env.pg.restart(fault.arg)
        elif kind == "disk_full":
            self.filler = faults.fill(self.record.results)
        elif kind == "batch_expire":
            made = [e["batch"] for e in record.log if e["kind"] == "batch"]
            if not made:
                return False
            for batch in made:
                with contextlib.suppress(urllib.error.HTTPError):
                    sim.post(f"/sim/batches/{batch}/expire", {})
        record.injected[kind] += 1
        return True

    def _tend(self) -> None:
        """Server faults whose time is up turned off; a stopped worker continued once its chunks were taken over,
        the others have all left, or it has been stopped long enough."""
        now = time.monotonic()
        for window in [w for w in self.windows if w[0] <= now]:
            self.env.sim.post("/sim/config", {window[1]: 0.0})
            self.windows.remove(window)
        if self.stopped is not None:
            victim, since = self.stopped
            others = [p for _, p in self.procs if p is not victim and p.poll() is None]
            if not others or now - since > STOP_AT_MOST or (now - since > 1 and not self._leases_of(victim.pid)):
                victim.send_signal(signal.SIGCONT)
                self.stopped = None

    def _run_id(self) -> str:
        """The run's id: its name, or the one run of the seed's store once the submit made it ("" before)."""
        if not self.record.run_id:
            from runner.store import open_store

            try:
                store = open_store(self.record.db)
                try:
                    runs = store.list_runs()
                finally:
                    store.close()
            except Exception:  # the database is restarting: ask again at the next turn
                return ""
            self.record.run_id = runs[0]["id"] if runs else ""
        return self.record.run_id

    def _leases_of(self, pid: int) -> int:
        from runner.store import open_store

        try:
            store = open_store(self.record.db)
        except Exception:  # the database is restarting: ask again at the next turn
            return 1
        try:
            rows = store.rows("SELECT worker FROM leases WHERE done = 0")
            return sum(1 for (worker,) in rows if worker.split(":")[-2] == str(pid))
        finally:
            store.close()

    def _all_exited(self) -> None:
        """Every process has exited: the disk is freed for the resume, and each exit is recorded once."""
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None
        for name, proc in self.procs[len(self.record.exits):]:
            self.record.exits.append((name, proc.returncode))

    def _status(self) -> str:
        from runner.store import open_store

        if not self._run_id():
            return "not made"
        try:
            store = open_store(self.record.db)
            try:
                return str(store.get_run(self.record.run_id)["status"])
            finally:
                store.close()
        except Exception:  # no run yet (a named run before its first process made it), or the database is away
            return "unknown"

    def _end_all(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                proc.wait()
        for knob in {w[1] for w in self.windows}:
            self.env.sim.post("/sim/config", {knob: 0.0})
        self.windows.clear()
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)

    def _after(self, kinds: set[str]) -> None:
        """The faults a launcher did, counted from what happened; each process's stderr read for a traceback."""
        record = self.record
        if "kill_after_accept" in kinds:
            if self.procs and self.procs[0][1].returncode == -signal.SIGKILL:
                record.injected["kill_after_accept"] += 1
            else:
                record.not_reached.append("kill_after_accept (no batch was submitted)")
        if "batch_refused" in kinds:
            if any(e["kind"] == "batch" and e["lines"] == 0 for e in record.log):
                record.injected["batch_refused"] += 1
            else:
                record.not_reached.append("batch_refused (no batch of two lines or more)")
        for n in range(len(self.procs)):
            err = (self.folder / f"p{n}.err").read_text(errors="replace")
            if "Traceback" in err or "Error: unexpected" in err:
                record.problems.append(f"{self.procs[n][0]} (p{n}.err): " + err.strip().splitlines()[-1][:300])

    def cleanup(self) -> None:
        if self.mounted:
            faults.unmount(self.record.results)
