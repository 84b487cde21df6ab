"""What the wire-format modules share about a provider's answers: its error in its own words (:func:`words`), its
text quoted safely into the runner's messages (:func:`quoted`), and the wait a rate-limited answer asks for
(:func:`retry_after_seconds`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def words(status: Any = None, kind: Any = None, code: Any = None, param: Any = None, message: Any = None) -> str:
    """A provider's error in its own words: ``{status} {kind} {code} (param {param}): {message}``, the parts it
    gave (each once), the message in full."""
    parts: list[str] = []
    for part in (status, kind, code):
        if part not in (None, "") and str(part) not in parts:
            parts.append(str(part))
    head = " ".join(parts)
    if param not in (None, ""):
        head += f" (param {param})"
    text = str(message or "").strip() or "no reason given"
    return f"{head}: {text}" if head else text


def quoted(text: Any, limit: int = 200) -> str:
    """A provider's text for a message: printable characters only (no terminal escapes), cut to ``limit``."""
    clean = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return repr(clean[:limit] + ("…" if len(clean) > limit else ""))


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds); None when absent or a date."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            continue
    return None
