"""What a parser returns: :class:`Parsed` (a value, or ``None`` with the reason class it is invalid) and the reason
classes (:class:`Reason`), as ``runner.evaluate.parse`` describes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Parsed:
    value: Any
    reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.reason is None


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
