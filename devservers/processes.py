"""Processes a test or a benchmark stops as a machine would be lost: a process's parent and everything under it,
read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def parent(pid: int) -> int:
    """The parent of process ``pid`` (OSError when it is gone)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> list[int]:
    """The processes under ``root``: its children, theirs, and so on."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(parent(int(entry.name)), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every process under it (a Ray node's raylet and what it started: the node lost)."""
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
