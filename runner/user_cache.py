"""The runner's cache folder in the user's home, and the small JSON files it keeps there.

What is kept there may be thrown away at any time: a file that is missing, unreadable or unwritable only costs the
work it saved (reading a weights file for its digest, importing genai-prices' data). Nothing in it is a secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["folder", "memo_path", "read_json", "write_json"]


def folder() -> Path:
    """``$XDG_CACHE_HOME/llm-job-runner``, else ``~/.cache/llm-job-runner`` (the XDG base directory
    specification's default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-job-runner"


def memo_path(variable: str, name: str) -> Path | None:
    """Where a memo is kept: the file the environment variable ``variable`` names (``off``: no memo), else ``name``
    in :func:`folder`; None where that is not an absolute path (no home folder to be found, as for a container's
    user without one)."""
    setting = os.environ.get(variable, "")
    if setting.lower() == "off":
        return None
    path = Path(setting).expanduser() if setting else folder() / name
    return path if path.is_absolute() else None


def read_json(path: Path) -> dict[str, Any]:
    """The object a cache file holds; empty when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a cache file whole, atomically (a command beside this one reads the old file or the new one); a folder
    that cannot be written is no error."""
    partial: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".part",
                                         delete=False) as out:
            partial = out.name
            json.dump(data, out, indent=1, sort_keys=True)
        os.replace(partial, path)
    except OSError:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)
