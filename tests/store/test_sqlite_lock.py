"""Waiting for a SQLite store another process holds locked (runner/store/sqlite_lock.py): the holder named from the
system's lock table, the wait said and bounded, and the sentence a run ends with past the bound."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.errors import RunnerError
from runner.store import open_store
from runner.store.sqlite import explain
from runner.store.sqlite_lock import (
    ATTEMPT_S,
    DEFAULT_WAIT_S,
    GAVE_UP_ATTEMPT_S,
    Holder,
    LockWait,
    StoreLocked,
    store_wait,
    write_lock_holder,
)

_HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO runs (id, job_name, job_path, job_json, fingerprint, status, total) "
             "VALUES ('r', 'j', 'j.yaml', '{}', 'fp', 'running', 1)")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_the_holder_of_the_write_lock_is_named_and_seen_stopped(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sqlite")
    open_store(path).close()
    assert write_lock_holder(path) is None
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert write_lock_holder(path) == Holder(holder.pid, False)
        holder.send_signal(signal.SIGSTOP)  # delivered asynchronously: wait for the system to show it stopped
        deadline = time.monotonic() + 10
        while write_lock_holder(path) != Holder(holder.pid, True):
            assert time.monotonic() < deadline, f"process {holder.pid} never shown stopped: {write_lock_holder(path)}"
            time.sleep(0.01)
        assert str(write_lock_holder(path)) == f"process {holder.pid} (stopped)"
        # and the store, asked to write meanwhile, is locked (SQLite's own view of it)
        other = sqlite3.connect(path, timeout=0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.communicate("\n", timeout=30)
    assert write_lock_holder(path) is None


def test_the_lock_table_is_read_by_file_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    (tmp_path / "s.sqlite-shm").write_bytes(b"")
    info = (tmp_path / "s.sqlite-shm").stat()
    import os

    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    table = tmp_path / "locks"
    table.write_text(
        f"1: POSIX  ADVISORY  READ  111 {device} 124 124\n"  # a reader's slot: not the write lock
        f"2: POSIX  ADVISORY  WRITE 222 {device}1 120 120\n"  # another file
        f"3: POSIX  ADVISORY  WRITE 333 {device} 120 120\n"
        f"3: -> POSIX  ADVISORY  WRITE 444 {device} 120 120\n")  # a process waiting for it
    assert write_lock_holder(str(path), locks=str(table)) == Holder(333, False)
    table.write_text(f"7: OFDLCK ADVISORY  WRITE -1 {device} 0 EOF\n")
    assert write_lock_holder(str(path), locks=str(table)) is None  # an OFD lock has no process
    table.write_text(f"7: POSIX  ADVISORY  WRITE 555 {device} 100 EOF\n")
    assert write_lock_holder(str(path), locks=str(table)) == Holder(555, False)
    assert write_lock_holder(str(tmp_path / "none.sqlite"), locks=str(table)) is None


def _busy() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("database is locked")


def test_a_locked_store_is_waited_for_said_and_given_up_on_past_the_bound(monkeypatch) -> None:
    monkeypatch.setenv("RUNNER_STORE_WAIT", "35")
    now = [100.0]
    said: list[str] = []
    busy_set: list[float] = []
    wait = LockWait("/x/s.sqlite", busy_set.append, say=said.append, clock=lambda: now[0])
    outcomes = iter([_busy(), _busy(), _busy(), _busy(), "written"])

    def attempt() -> str:
        now[0] += ATTEMPT_S  # each refused attempt waited in SQLite's busy handler
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with pytest.raises(StoreLocked) as refused:
        wait.run(attempt, lambda: False)
    assert refused.value.waited == pytest.approx(40.0)  # 10 s in the first attempt, then three more
    assert said == [
        "waiting for the store /x/s.sqlite: another process has held its write lock for 10 s (this process waits up"
        " to 35 s in all, RUNNER_STORE_WAIT)"]  # once a minute at most
    assert busy_set == [GAVE_UP_ATTEMPT_S]  # leaving: later calls fail in moments
    assert wait.run(lambda: "read", lambda: False) == "read"  # a read goes through a held lock: not free yet
    assert wait.gave_up and len(said) == 1
    assert wait.run(attempt, lambda: True) == "written"  # a write went through: free
    assert said[-1] == "the store /x/s.sqlite is free again after 50 s"
    assert busy_set == [GAVE_UP_ATTEMPT_S, ATTEMPT_S]
    assert wait.locked_since is None and not wait.gave_up


def test_other_errors_pass_through_at_once() -> None:
    wait = LockWait("/x/s.sqlite", lambda seconds: None, say=lambda line: None)

    def attempt() -> None:
        raise sqlite3.OperationalError("no such table: nothing")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        wait.run(attempt, lambda: False)


def test_the_wait_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("RUNNER_STORE_WAIT", raising=False)
    assert store_wait() == DEFAULT_WAIT_S
    monkeypatch.setenv("RUNNER_STORE_WAIT", "12.5")
    assert store_wait() == 12.5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv("RUNNER_STORE_WAIT", bad)
        with pytest.raises(RunnerError, match="RUNNER_STORE_WAIT=.* is not a positive number of seconds"):
            store_wait()


def test_a_run_stopped_by_the_lock_ends_in_one_sentence() -> None:
    locked = StoreLocked("database is locked by process 42 (stopped) for 301 s", Holder(42, True), 301.0)
    assert explain(locked, "/data/s.sqlite", "run-1") == (
        "the store /data/s.sqlite stayed locked by process 42 (stopped) for 301 s (RUNNER_STORE_WAIT): continue it"
        " (`kill -CONT 42`) or end it, then `runner resume run-1`")
    running = StoreLocked("database is locked", Holder(7, False), 300.0)
    assert "by process 7 for 300 s (RUNNER_STORE_WAIT): let it finish or end it, then try again" in explain(
        running, "/data/s.sqlite")
