"""Regular expressions compiled on first use: the parsers hold some forty, and compiling them when the command line
starts cost some 40 ms of every ``runner submit`` before its first request (issue 39 item 2), though none is used
before the first answer arrives; the modules a submit imports before its first request hold a few more, for an
answer, an error or a store that path does not meet."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["LazyPattern", "lazy_compile"]


class LazyPattern:
    """A compiled pattern's stand-in: ``re.compile(pattern, flags)`` on the first attribute asked (``search``,
    ``sub``, ``pattern``, ...), which is then the compiled pattern's."""

    __slots__ = ("_compiled", "_flags", "_pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._pattern = pattern
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        if self._compiled is None:
            self._compiled = re.compile(self._pattern, self._flags)
        return getattr(self._compiled, name)

    def __repr__(self) -> str:
        return f"LazyPattern({self._pattern!r}, {self._flags!r})"


def lazy_compile(pattern: str, flags: int = 0) -> LazyPattern:
    """``re.compile``, deferred to the pattern's first use."""
    return LazyPattern(pattern, flags)
