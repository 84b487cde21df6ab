"""The parsers' patterns are compiled on first use: :func:`runner.lazy_re.lazy_compile`, named here too."""

from __future__ import annotations

from runner.lazy_re import LazyPattern, lazy_compile

__all__ = ["LazyPattern", "lazy_compile"]
