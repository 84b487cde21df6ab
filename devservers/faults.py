"""Faults done to a runner from outside, shared by the tests and the seeded fault simulation (``scripts/chaos.py``):
a process stopped (SIGSTOP) and seen stopped, stopped at a moment it holds no SQLite write lock, and a small disk
(a tmpfs mounted, filled, freed and unmounted: root only).

Nothing here imports pytest: a helper that cannot do its fault says why, and the caller skips or draws again.
"""

from __future__ import annotations

import errno
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["fill", "mount_tmpfs", "state", "stop", "stop_between_writes", "unmount"]


def state(pid: int) -> str:
    """The process's state letter from /proc (``T`` or ``t`` when stopped)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def stop(process: subprocess.Popen, timeout: float = 10) -> None:
    """SIGSTOP, and wait until the system shows the process stopped (a signal is delivered asynchronously)."""
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while state(process.pid) not in ("T", "t"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {process.pid} not seen stopped within {timeout:g} s")
        time.sleep(0.01)


def stop_between_writes(db: str, process: subprocess.Popen, tries: int = 500) -> None:
    """SIGSTOP ``process`` at a moment it holds no write lock of the SQLite store ``db`` (a process stopped inside a
    write keeps the file's lock, which nobody can take; ARCHITECTURE.md invariant 8). On PostgreSQL any moment
    will do: the server ends a transaction the stopped process left idle."""
    from runner.store.sqlite_lock import write_lock_holder

    stop(process)
    if "://" in db:
        return
    for _ in range(tries):
        holder = write_lock_holder(db)
        if holder is None or holder.pid != process.pid:
            return
        process.send_signal(signal.SIGCONT)
        time.sleep(0.005)
        stop(process)
    process.send_signal(signal.SIGCONT)
    raise TimeoutError(f"process {process.pid} held the store's write lock at every one of {tries} tries")


def mount_tmpfs(point: Path, size: str, *options: str) -> str | None:
    """Mount a tmpfs of ``size`` (``64k``, ``4m``) at ``point``, made if missing; None when mounted, else why not
    (not root, no mount command, a container that forbids it)."""
    point.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join((f"size={size}", *options)), "tmpfs",
                               str(point)], capture_output=True, text=True)
    except OSError as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def unmount(point: Path) -> None:
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the file system holding ``folder`` up to ``leave`` free bytes with one file (remove it to free the
    space)."""
    filler = folder / "filler"
    left = max(0, shutil.disk_usage(folder).free - leave)
    with open(filler, "wb", buffering=0) as out:
        try:
            while left > 0:
                left -= out.write(b"\0" * min(left, 1 << 20))
        except OSError as exc:  # others wrote meanwhile: full all the same
            if exc.errno != errno.ENOSPC:
                raise
    return filler
