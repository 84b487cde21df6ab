"""A cloud's credentials, made once per process for the same environment and the same credential files: the one a cloud
provider loaded last is handed to the next that asks with nothing changed, so that ``runner submit``, which builds a
provider three times before its first request (the checks before sending, the pre-flight probe, the run), loads
Google's Application Default Credentials (``google_tokens.py``: a service-account key's RSA check costs about 50 ms
of CPU where it is not remembered, ``key_memo.py``) or builds botocore's session (``bedrock.py``) once, and the run
reuses the token or the credentials the probe fetched. The SDKs share one credentials object among their clients the
same way.

Anything changed makes a new one: any environment variable (compared by a digest of them all, which keeps no copy
of their values), or any of the files named (its size, modification time and inode; a file that appears or goes
away too). Only the last one made is kept, and nothing of it is written anywhere; what fails to load is not kept.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ["EnvironmentMemo", "file_state"]

Value = TypeVar("Value")


def file_state(path: str | None) -> tuple[int, int, int] | None:
    """What tells a file's change: (inode, size, modification time in ns), None where there is no such file."""
    if not path:
        return None
    try:
        found = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _environment_digest() -> bytes:
    digest = hashlib.sha256()
    for name, value in sorted(os.environ.items()):
        digest.update(f"{len(name)}:{name}={len(value)}:{value}\0".encode("utf-8", "surrogateescape"))
    return digest.digest()


class EnvironmentMemo(Generic[Value]):
    """The last value :meth:`get` made, for as long as the environment, the files and the caller's own key stay the
    same (thread-safe: a value is made once however many threads ask at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[Hashable, Value] | None = None

    def get(self, key: Hashable, files: Iterable[str | None], make: Callable[[], Value]) -> Value:
        """The value made for ``key`` with this environment and these ``files``, else ``make()`` (its errors raised
        as they are, nothing kept)."""
        whole = (key, _environment_digest(), tuple(file_state(path) for path in files))
        with self._lock:
            if self._last is not None and self._last[0] == whole:
                return self._last[1]
            value = make()
            self._last = (whole, value)
            return value

    def forget(self) -> None:
        """Keep nothing (tests that change what a file-less source answers, such as a metadata server)."""
        with self._lock:
            self._last = None
