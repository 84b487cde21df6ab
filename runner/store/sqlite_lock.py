"""Waiting for a SQLite store that another process holds locked, and saying who holds it.

SQLite's write lock belongs to the process that took it (a POSIX lock on the WAL index, the ``-shm`` file): no other
process can take it or break it. A writer's transactions last milliseconds, but a process stopped inside one (Ctrl-Z,
SIGSTOP, a machine swapping) keeps the lock until it continues or exits, and every other process writing to the
store waits for it (ARCHITECTURE.md invariant 8). A writer here waits :data:`ATTEMPT_S` at a time in SQLite's own
busy handler; between attempts it says, on standard error, which process holds the lock and whether it is stopped,
and after ``RUNNER_STORE_WAIT`` seconds (:data:`DEFAULT_WAIT_S`) in all it gives up with :class:`StoreLocked`, which
the run ends on in one sentence (runner/store/sqlite.py's ``explain``), resumable.

The holder is read from ``/proc/locks`` (Linux): opening the ``-shm`` file to ask ``fcntl`` would be unsafe, since
closing any descriptor of a file drops every POSIX lock this process holds on it, SQLite's own included.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from runner.errors import RunnerError

T = TypeVar("T")

#: seconds SQLite's busy handler waits for the lock in one attempt (between two, the holder is named)
ATTEMPT_S = 10.0
#: what the busy handler waits in one attempt once the process gave up waiting (it is leaving)
GAVE_UP_ATTEMPT_S = 0.5
#: seconds a writer waits for the store's lock in all before it gives up, unless RUNNER_STORE_WAIT says otherwise
DEFAULT_WAIT_S = 300.0
#: seconds between two lines saying the store is still locked
SAY_EVERY_S = 60.0
#: the byte of the WAL index that SQLite's writer locks (WALINDEX_LOCK_OFFSET 120 + WAL_WRITE_LOCK 0)
WAL_WRITE_BYTE = 120


class StoreLocked(sqlite3.OperationalError):
    """The store stayed locked by another process for longer than the wait allows."""

    def __init__(self, message: str, holder: Holder | None, waited: float) -> None:
        super().__init__(message)
        self.holder = holder
        self.waited = waited


@dataclass(frozen=True)
class Holder:
    """The process holding a lock: its id, and ``stopped`` when the system says it is (state T)."""

    pid: int
    stopped: bool

    def __str__(self) -> str:
        return f"process {self.pid}{' (stopped)' if self.stopped else ''}"


def store_wait(default: float = DEFAULT_WAIT_S) -> float:
    """RUNNER_STORE_WAIT's seconds, or ``default`` (SQLite's lock: :data:`DEFAULT_WAIT_S`; a PostgreSQL server
    that went away: runner/store/postgres.py's ``RECONNECT_WAIT_S``); a value that is no positive number is
    refused."""
    value = os.environ.get("RUNNER_STORE_WAIT")
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise RunnerError(f"RUNNER_STORE_WAIT={value!r} is not a positive number of seconds (the default is "
                          f"{default:g})")
    return seconds


def write_lock_holder(path: str, locks: str = "/proc/locks") -> Holder | None:
    """The process holding the write lock of the SQLite store at ``path`` (WAL mode), or None when none does or it
    cannot be told (not Linux, no ``-shm`` file)."""
    try:
        info = os.stat(path + "-shm")
        with open(locks, encoding="ascii") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        # "1: POSIX  ADVISORY  WRITE 12154 00:2a:123456 120 120" (a waiting lock's line has "->" after its number)
        fields = line.split()
        if "->" in fields or len(fields) < 8 or fields[1] not in ("POSIX", "OFDLCK") or fields[3] != "WRITE":
            continue
        if fields[5] != device:
            continue
        start, end = int(fields[6]), (None if fields[7] == "EOF" else int(fields[7]))
        if start <= WAL_WRITE_BYTE and (end is None or WAL_WRITE_BYTE <= end):
            pid = int(fields[4])
            return Holder(pid, _stopped(pid)) if pid > 0 else None
    return None


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked": another process held the lock past the busy handler."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and (
        (isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY) or "database is locked" in str(exc))


class LockWait:
    """One store connection's waits for the write lock (module docstring). The wait is counted from the first
    attempt that found the store locked until one succeeds, across the calls made meanwhile; once it passed
    ``RUNNER_STORE_WAIT``, every call that finds the store locked fails at once with :class:`StoreLocked` (the busy
    handler's wait shortened to :data:`GAVE_UP_ATTEMPT_S` through ``set_busy``), so a process leaving a locked store
    leaves in moments, until a call succeeds again."""

    def __init__(self, path: str, set_busy: Callable[[float], None], *, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.set_busy = set_busy
        self.say = say or _stderr
        self.clock = clock
        #: when an attempt first found the store locked (its busy handler's wait included), None while it is free
        self.locked_since: float | None = None
        self.said: float | None = None
        self.gave_up = False

    def run(self, attempt: Callable[[], T], took_lock: Callable[[], bool]) -> T:
        """``attempt()``, tried again while the store is locked by another process, within the wait. The store is
        free again once an attempt refused before goes through, or one takes the write lock (``took_lock()`` after
        it): a read goes through while another process holds the lock, and says nothing of it."""
        refused = False
        while True:
            try:
                result = attempt()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or isinstance(exc, StoreLocked):
                    raise
                refused = True
                self._still_locked(exc)
                continue
            if self.locked_since is not None and (refused or took_lock()):
                self._free()
            return result

    def _still_locked(self, exc: sqlite3.OperationalError) -> None:
        now = self.clock()
        if self.locked_since is None:
            self.locked_since = now - ATTEMPT_S  # the attempt waited in the busy handler already
        waited = now - self.locked_since
        holder = write_lock_holder(self.path)
        bound = store_wait()
        if waited >= bound:
            if not self.gave_up:
                self.gave_up = True
                self.set_busy(GAVE_UP_ATTEMPT_S)
            raise StoreLocked(f"database is locked by {holder or 'another process'} for {waited:.0f} s", holder,
                              waited) from exc
        if self.said is None or now - self.said >= SAY_EVERY_S:
            self.said = now
            wake = f"; `kill -CONT {holder.pid}` continues it" if holder is not None and holder.stopped else ""
            self.say(f"waiting for the store {self.path}: {holder or 'another process'} has held its write lock for "
                     f"{waited:.0f} s (this process waits up to {bound:g} s in all, RUNNER_STORE_WAIT){wake}")

    def _free(self) -> None:
        if self.said is not None:
            assert self.locked_since is not None
            self.say(f"the store {self.path} is free again after {self.clock() - self.locked_since:.0f} s")
        if self.gave_up:
            self.set_busy(ATTEMPT_S)
        self.locked_since = self.said = None
        self.gave_up = False


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
