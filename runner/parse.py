"""Answer parsers. Each returns a :class:`Parsed`: a value, or ``None`` with the reason it is invalid."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NON_WORD = re.compile(r"[\W_]+")


@dataclass(frozen=True, slots=True)
class Parsed:
    value: Any
    reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.reason is None


def parse_letter(text: str, options: list[str], letters: str) -> Parsed:
    """The chosen option's shown position: the first standalone letter among ``letters`` (case-sensitive,
    as the NewTerm reference does); failing that, the one option whose text the answer contains."""
    valid = letters[: len(options)]
    for token in _NON_WORD.sub(" ", text).split():
        if len(token) == 1 and token in valid:
            return Parsed(valid.index(token))
    lowered = text.lower()
    matches = [i for i, option in enumerate(options) if option and option.strip().rstrip(".").lower() in lowered]
    if len(matches) == 1:
        return Parsed(matches[0])
    if not text.strip():
        return Parsed(None, "empty answer")
    if matches:
        return Parsed(None, "several options' texts appear in the answer")
    return Parsed(None, "no option letter or option text in the answer")
