"""The test processes' prefork server (tests/prefork.py): a forked ``runner`` is the process a test asked for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import prefork
from tests.helpers import runner_cmd

pytestmark = pytest.mark.skipif(subprocess.Popen is not prefork.PreforkPopen,
                                reason="RUNNER_TEST_PREFORK=0: the prefork server is off")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_forked_runner_prints_exits_and_reads_its_cwd_and_environment(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: [\n", encoding="utf-8")
    done = subprocess.run(runner_cmd("validate", "job.yaml"), cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "RUNNER_DB": str(tmp_path / "elsewhere.sqlite")}, timeout=60)
    assert prefork.server_pid() is not None, "no prefork server answered"
    assert done.returncode == 2, done
    assert done.stderr.startswith("Error: job.yaml") and "Traceback" not in done.stderr, done.stderr
    version = subprocess.run(runner_cmd("--version"), capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("runner "), version


def test_a_forked_runner_is_the_servers_child_and_dies_of_kill_9(tmp_path: Path) -> None:
    # PYTHONBREAKPOINT is read where breakpoint() is called, not at start (ray.init() sets it for good)
    process = subprocess.Popen(runner_cmd("sim", "--port", "0"), cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace"})
    try:
        assert "listening" in process.stdout.readline()
        assert parent_of(process.pid) == prefork.server_pid(), prefork.last_unforked
        assert os.getsid(process.pid) == process.pid  # start_new_session
        assert process.poll() is None and process.pid in prefork.runner_forks()
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)
    finally:
        process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while process.pid in prefork.runner_forks() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.pid not in prefork.runner_forks()


def test_what_a_fork_cannot_reproduce_starts_as_usual(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # a new interpreter runs the sitecustomize of its PYTHONPATH, a fork would not
    (tmp_path / "sitecustomize.py").write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    done = subprocess.run([sys.executable, "-m", "runner.cli", "--version"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and (tmp_path / "started").exists(), done
    process = subprocess.Popen([sys.executable, "-c", "import os, time; print(os.getppid()); time.sleep(30)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert int(process.stdout.readline()) == os.getpid()
    finally:
        process.kill()
        process.wait()
