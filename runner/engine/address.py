"""Content addresses: the SHA-256 of everything a stage's results depend on.

Whole-stage replay of evaluation stages (:mod:`runner.engine.replay`) and the reuse of pipeline stage outputs
(:mod:`runner.engine.pipeline`) both key what they stored by :func:`content_address` of a body they assemble
(a stage's definition, prompt text, models, parameters, the digests of its inputs); equal bodies, equal
addresses, and any change to one of its parts gives a new address.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from runner.plan.request import canonical_json


def content_address(body: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no whitespace) of ``body``."""
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def rows_digest(rows: Iterable[dict[str, Any]]) -> str:
    """SHA-256 of rows, each as canonical JSON on its own line."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(canonical_json(row).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


@cache
def code_digest() -> str:
    """SHA-256 of the runner package's source: any change to how requests are planned, parsed or scored."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    found: list[tuple[str, ...]] = []  # each module's path in parts, in the order of sorted(root.rglob("*.py"))
    for folder, _, files in os.walk(root):  # a third of rglob's cost, on the way to a run's first request
        inside = os.path.relpath(folder, root)
        parts = () if inside == "." else tuple(inside.split(os.sep))
        found += [(*parts, name) for name in files if name.endswith(".py")]
    for parts in sorted(found):
        relative = "/".join(parts)
        digest.update(relative.encode())
        digest.update(root.joinpath(*parts).read_bytes())
    return digest.hexdigest()
