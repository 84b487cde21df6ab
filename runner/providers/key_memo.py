"""The private keys whose RSA check already passed, remembered between runs by a digest of their bytes.

cryptography checks an RSA private key's numbers whole every time it loads one (``load_pem_private_key``): about
50 ms of CPU for a 2048-bit key on this project's machine, at every start of a Vertex run with a service-account key
file (``google_service_account.py``). The check's answer depends only on the key's bytes, so once a key has passed
it, its SHA-256 digest is written to a small JSON file in the runner's cache folder (``user_cache.py``:
``~/.cache/llm-job-runner/validated-keys.json``; the variable RUNNER_KEY_MEMO names another file, or ``off`` for
none), and the next load of the same bytes may skip the check.

Only digests are written, never a key or anything else of the file it came from: a SHA-256 digest of a private
key's PEM tells nothing of the key. A memo that is missing, unreadable or unwritable only costs the check again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from runner import user_cache

__all__ = ["digest_of", "remember", "validated"]

#: the file's name in the cache folder
NAME = "validated-keys.json"
#: the file's format (a file of another is not read)
FORMAT = 1
#: the most digests kept, the latest last (a user has a few keys; a rotated key's digest falls out in time)
MOST = 32


def digest_of(pem: bytes) -> str:
    """The hex SHA-256 digest a key's PEM bytes are remembered by."""
    return hashlib.sha256(pem).hexdigest()


def _path() -> Path | None:
    """The file RUNNER_KEY_MEMO names (``off``: None), else the cache folder's."""
    return user_cache.memo_path("RUNNER_KEY_MEMO", NAME)


def _digests(path: Path) -> list[str]:
    data = user_cache.read_json(path)
    found = data.get("sha256")
    if data.get("format") != FORMAT or not isinstance(found, list):
        return []
    return [item for item in found if isinstance(item, str)]


def validated(digest: str) -> bool:
    """Whether a key of this digest passed cryptography's full check before (read from the file at each call: a
    process loads a key once)."""
    path = _path()
    return path is not None and digest in _digests(path)


def remember(digest: str) -> None:
    """Note that a key of this digest passed cryptography's full check (the file written again, at most
    :data:`MOST` digests kept)."""
    path = _path()
    if path is None:
        return
    digests = [item for item in _digests(path) if item != digest] + [digest]
    user_cache.write_json(path, {"format": FORMAT, "sha256": digests[-MOST:]})
