"""deploy/slurm/runner-array.sbatch on a real Slurm: Debian's slurmctld and slurmd (22.05) started by the test as a
cluster of this one machine on 127.0.0.1, every file of it in the test's folder, authenticated by a munged of its
own (its own key and socket). The script is submitted with sbatch as an array of 3 tasks against the simulated
server and one SQLite store; once the run answers, one task is cancelled with scancel and requeued with scontrol
requeue, and the run completes with nothing lost or paid twice. Skips where Slurm's daemons are not installed
(.ci/run installs them)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import LEASE_TTL, check_shared_run, python_env, sim_job
from tests.helpers import ROOT, free_port, sim_configure, sim_stats

SBATCH = ROOT / "deploy" / "slurm" / "runner-array.sbatch"
#: where Debian puts the daemons (root's PATH has it; a test run's may not)
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
#: how long a requeued task waits before it may start again is Slurm's job credential lifetime (120 s unless
#: AuthInfo says otherwise): a few seconds here, enough for slurmd on this machine to launch a task within it
CRED_EXPIRE = 5
#: a requeued task, once its wait is over, starts at the scheduler's next pass: every second here (sched_interval,
#: 60 s unless SchedulerParameters says otherwise; a job submitted or ended also starts a pass)
SCHED_INTERVAL = 1
#: slurmd's wait between the SIGTERM of a cancelled task and its SIGKILL (30 s unless KillWait says otherwise)
KILL_WAIT = 5


def _wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.5)  # each look runs a Slurm command (a process)


def _log(path: Path) -> str:
    """A task's output so far: nothing yet when slurmd has not opened it (slurmctld says RUNNING before slurmd has
    launched the task, and a loaded machine can leave a gap between the two)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _config(folder: Path, host: str) -> str:
    """slurm.conf of a one-node cluster whose every file is under ``folder``. The node says 4 CPUs (config_overrides:
    the configuration, not the hardware, counts) so that the array's 3 tasks of one CPU each and the requeued one
    all run at once on a machine of 2 cores; they wait on the network. No cgroups, no accounting database."""
    return f"""\
ClusterName=runnertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
CommunicationParameters=NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/run/munge.socket,cred_expire={CRED_EXPIRE}
KillWait={KILL_WAIT}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval={SCHED_INTERVAL}
SlurmdParameters=config_overrides
ReturnToService=2
NodeName={host} NodeAddr=127.0.0.1 CPUs=4 RealMemory=8192 State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """A one-machine Slurm: munged, slurmctld and slurmd in the foreground as this test's processes, and its
    commands with SLURM_CONF set."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "PATH": SEARCH, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def start(self) -> None:
        folder = self.folder
        for name in ("run", "state", "spool", "munge"):
            (folder / name).mkdir(mode=0o700)
        (folder / "run").chmod(0o755)  # munged's socket must be reachable by every user
        key = folder / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], env=self.env, check=True, capture_output=True)
        # --force: munged refuses a socket under a folder other users cannot enter (pytest's are 0700)
        self._daemon("munged", "--foreground", "--force", f"--socket={folder}/run/munge.socket",
                     f"--key-file={key}", f"--log-file={folder}/munge/munged.log",
                     f"--pid-file={folder}/run/munged.pid", f"--seed-file={folder}/munge/munged.seed")
        _wait_for(lambda: (folder / "run" / "munge.socket").exists(), 30, "munged's socket")
        host = socket.gethostname().split(".")[0]  # slurmctld runs only on the host SlurmctldHost names
        self.conf.write_text(_config(folder, host), encoding="utf-8")
        self._daemon("slurmctld", "-D", "-i")  # -i: no state of an earlier cluster to recover
        self._daemon("slurmd", "-D")
        _wait_for(lambda: self.node_state() == "idle", 60, f"node {host} idle in sinfo\n{self.logs()}")

    def _daemon(self, *argv: str) -> None:
        log = (self.folder / f"{argv[0]}.out").open("w")
        self.daemons.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def __call__(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, cwd=self.folder, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 or not check, f"{' '.join(argv)}: exit {done.returncode}: {done.stderr}"
        return done.stdout

    def node_state(self) -> str:
        """The node's state in sinfo (nothing while slurmctld is starting)."""
        for proc in self.daemons:
            assert proc.poll() is None, f"{proc.args[0]} exited ({proc.returncode})\n{self.logs()}"
        return self("sinfo", "--noheader", "--format=%T", check=False).strip()

    def tasks(self, array_job: str) -> dict[str, dict[str, str]]:
        """Each task of an array job by its index: its fields in `scontrol show job` (JobState, ExitCode, ...)."""
        tasks = {}
        for line in self("scontrol", "--oneliner", "show", "job", array_job).splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            tasks[fields["ArrayTaskId"]] = fields
        return tasks

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.folder.glob("*.out")) + sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        """Every job cancelled and gone, then the daemons stopped; no process of this cluster (a slurmstepd or a
        task's, which slurmd does not parent) left behind."""
        try:
            if len(self.daemons) == 3 and all(proc.poll() is None for proc in self.daemons):
                self("scancel", "--full", f"--user={os.getuid()}")
                _wait_for(lambda: not self("squeue", "--noheader").strip(), 60, "every job ended")
        finally:
            for proc in reversed(self.daemons):
                proc.send_signal(signal.SIGTERM)
            for proc in reversed(self.daemons):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            left = self._processes()
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            assert not left, f"processes of the test's Slurm left running: {left}"

    def _processes(self) -> list[int]:
        """The processes that have this cluster's SLURM_CONF in their environment: slurmstepd and the tasks."""
        marker = f"SLURM_CONF={self.conf}\0".encode()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    if marker in Path(f"/proc/{entry}/environ").read_bytes():
                        found.append(int(entry))
                except OSError:
                    continue
        return found


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Slurm]:
    missing = [name for name in COMMANDS if shutil.which(name, path=SEARCH) is None]
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} missing): install Debian's slurmctld, slurmd and "
                    "slurm-client (.ci/run does)")
    cluster = Slurm(tmp_path / "slurm")
    cluster.folder.mkdir()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_sbatch_array_with_a_task_cancelled_and_requeued_completes_one_run(tmp_path, slurm, sim_server, db):
    # more than the chunk of 256 requests the first worker leases while alone, so that the others have leases to
    # take; each worker 2 requests at a time
    rows = 600
    job = sim_job(tmp_path, sim_server, rows=rows, concurrency=2)
    # `runner` as the recipe calls it: on PATH, this Python's module
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "runner").write_text(f'#!/bin/sh\nexec {sys.executable} -m runner.cli "$@"\n', encoding="utf-8")
    (bin_dir / "runner").chmod(0o755)
    slurm.env.update({"PATH": f"{bin_dir}{os.pathsep}{SEARCH}", "HOME": str(tmp_path), "RUNNER_DB": db,
                      "RUNNER_LEASE_TTL": LEASE_TTL, **python_env()})
    submitted = slurm("sbatch", "--parsable", "--array=0-2", f"--export=ALL,JOB_FILE={job}",
                      f"--chdir={tmp_path}", str(SBATCH))
    array = submitted.strip().split(";")[0]
    run_id = f"slurm-{array}"
    log = tmp_path / f"runner-{array}_1.log"

    def running() -> bool:
        tasks = slurm.tasks(array)
        assert not any(t["JobState"] in ("FAILED", "CANCELLED") for t in tasks.values()), tasks
        return len(tasks) == 3 and all(t["JobState"] == "RUNNING" for t in tasks.values())

    _wait_for(running, 60, f"the array's 3 tasks running\n{slurm.logs()}")
    _wait_for(lambda: sum(sim_stats(sim_server)["completed_by_digest"].values()) >= 10, 60,
              "the run's first 10 answers")
    # task 1 in the run (its progress shown once it has joined and handles SIGTERM), not still starting Python
    _wait_for(lambda: f"[runner] run {run_id} · job testjob" in _log(log), 60,
              f"task {array}_1 working on the run\n{_log(log)}")
    # the server slowed down until the requeued task is back, so that the run is still going when it comes back
    sim_configure(sim_server, latency=0.5)
    slurm("scancel", f"{array}_1")
    _wait_for(lambda: slurm.tasks(array)["1"]["JobState"] == "CANCELLED", 30, f"task {array}_1 cancelled")
    first = _log(log)  # what the cancelled attempt printed: the requeued one appends

    def requeued() -> str:
        return _log(log).removeprefix(first)

    slurm("scontrol", "requeue", f"{array}_1")
    _wait_for(lambda: "joining job testjob as a worker" in requeued(), 60,
              f"task {array}_1 requeued and joining the run\n{_log(log)}")
    sim_configure(sim_server, latency=0.05)

    def finished() -> bool:
        tasks = slurm.tasks(array)
        return all(t["JobState"] not in ("PENDING", "RUNNING", "COMPLETING") for t in tasks.values())

    _wait_for(finished, 120, f"every task of array job {array} ended\n{slurm.logs()}")
    tasks = slurm.tasks(array)
    logs = {index: _log(tmp_path / f"runner-{array}_{index}.log") for index in tasks}
    assert {(t["JobState"], t["ExitCode"]) for t in tasks.values()} == {("COMPLETED", "0:0")}, (tasks, logs)
    assert tasks["1"]["Restarts"] == "1", tasks["1"]
    # the cancelled attempt stopped as a SIGTERM asks; the requeued one, in the same log, joined the run going on
    assert logs["1"].startswith(first)
    assert "Stopping: waiting for" in first, first
    assert f"run {run_id}: completed" in requeued(), logs["1"]
    assert sum(f"run {run_id}: started job testjob" in log for log in logs.values()) == 1, logs
    assert all(f"run {run_id}: completed" in log for log in logs.values()), logs
    check_shared_run(db, run_id, sim_server, rows)
