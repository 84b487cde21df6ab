"""What a parser returns: :class:`Parsed` (a value, or ``None`` with the reason class it is invalid and, where the
class alone does not say it, a short why) and the reason classes (:class:`Reason`), as ``runner.evaluate.parse``
describes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Parsed:
    value: Any
    reason: str | None = None
    #: why, in a few words ("options echoed", "two choices affirmed"); not compared: the class is the verdict
    detail: str | None = field(default=None, compare=False)

    @property
    def valid(self) -> bool:
        return self.reason is None

    @property
    def why(self) -> str | None:
        """The reason as a result line states it: ``"not_found: options echoed"``, or the class alone."""
        return f"{self.reason}: {self.detail}" if self.reason and self.detail else self.reason


class Reason:
    """The reason classes of an invalid :class:`Parsed` (plain strings, so results stay plain JSON)."""

    EMPTY = "empty"
    REFUSAL = "refusal"
    NOT_FOUND = "not_found"
    NOT_STRICT = "not_strict"
    AMBIGUOUS = "ambiguous"
    OUT_OF_RANGE = "out_of_range"
    NONE_OF_THEM = "none_of_them"
    CONFLICT = "conflict"
